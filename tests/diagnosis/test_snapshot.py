from __future__ import annotations

import math
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from console.diagnosis.records import Phases, StepRecord, new_step
from console.diagnosis.snapshot import RankState, new_rank_state
from tests.diagnosis.factory import (
    GROUP,
    T0,
    device_event,
    gpu_of,
    node_of,
    process,
    snap,
    step,
    training,
)


def test_it_keeps_a_nan_loss_as_nan() -> None:
    s = snap([step(0, 1, T0, loss=float("nan"))])
    assert math.isnan(s.ranks[0].steps[0].loss)


def test_it_parses_contract_nan_strings() -> None:
    s = snap([step(0, 1, T0, loss="NaN", grad_norm="Infinity")])
    rec = s.ranks[0].steps[0]
    assert math.isnan(rec.loss) and rec.grad_norm == math.inf


def test_it_maps_rank_to_gpu_and_node_through_process_and_device_records() -> None:
    s = snap(training(ranks=16, steps=3))
    r9 = s.ranks[9]
    assert (r9.rank, r9.gpu, r9.node) == (9, gpu_of(9), node_of(9))


def test_it_keeps_only_ranks_of_the_active_generation() -> None:
    recs = [step(0, 1, T0, gen=1), step(1, 1, T0, gen=2)]
    assert [r.rank for r in snap(recs, gen=2).ranks] == [1]


def test_it_orders_steps_by_time() -> None:
    recs = [step(0, 2, T0 + timedelta(seconds=1)), step(0, 1, T0)]
    assert [s.step for s in snap(recs).ranks[0].steps] == [1, 2]


def test_it_ignores_other_groups_and_unknown_kinds() -> None:
    other = step(3, 1, T0)
    other["group"] = "someone-else"
    s = snap([other, {"kind": "future_thing", "ts": T0, "group": GROUP}])
    assert s.ranks == ()


def test_it_collects_device_events_under_their_gpu_with_node() -> None:
    s = snap([device_event(5, T0, "xid", 79)])
    (dev,) = s.devices
    assert (dev.gpu, dev.node, dev.events[0].code) == (gpu_of(5), node_of(5), 79)


def test_it_calls_a_group_with_only_serving_records_serving() -> None:
    rec = {
        "kind": "serving",
        "ts": T0,
        "group": GROUP,
        "worker": "w0",
        "ready": True,
        "draining": False,
        "window": {"seconds": 60, "requests": 0},
    }
    assert snap([rec]).kind == "serving"


def test_it_takes_the_latest_process_gpu_for_a_rank() -> None:
    recs = [process(0, T0, "started"), step(0, 1, T0)]
    recs[0]["gpu"] = "GPU-x"
    assert snap(recs).ranks[0].gpu == "GPU-x"


def test_a_samples_memo_parses_an_unchanged_record_once_and_a_new_one_again() -> None:
    """console.snapshots passes an unchanged GPU's record as the same dict each pass; the
    memo must give what parsing gives, and a new dict for the GPU must be parsed anew."""
    from console.diagnosis import GroupSnapshot, build_snapshot
    from tests.diagnosis.factory import sample

    def built(records: list[dict], memo: dict | None) -> GroupSnapshot:
        kw = {"nodes": {}, "contract_findings": [], "now": T0, "samples_memo": memo}
        return build_snapshot(group=GROUP, generation=1, state="running", records=records, **kw)

    hot = sample(1, T0, throttle_reasons=["hw_thermal_slowdown"], temp_c=91.0)
    cool = sample(2, T0, temp_c=40.0)
    memo: dict = {}
    first = built([hot, cool], memo)
    assert first == built([hot, cool], None)
    assert len(memo) == 2
    kept = {d.gpu: d.sample for d in first.devices}
    again = built([hot, cool], memo)
    assert all(d.sample is kept[d.gpu] for d in again.devices)  # not parsed again
    hotter = {**hot, "temp_c": 99.0}
    third = built([hotter, cool], memo)
    assert third == built([hotter, cool], None)
    assert {d.gpu: d.sample.temp_c for d in third.devices if d.sample}[hot["gpu"]] == 99.0
    assert len(memo) == 2  # the old record's entry went with it


def test_a_devices_memo_keeps_an_unchanged_gpus_state_and_rebuilds_a_changed_one() -> None:
    """A GPU whose records are the very same dicts as last call keeps its DeviceState
    object (the device rule then skips it); one with a new sample, a new event or a record
    gone is built again, and every call equals a build without the memo."""
    from datetime import timedelta

    from console.diagnosis import GroupSnapshot, build_snapshot
    from tests.diagnosis.factory import device_event, sample

    def built(records: list[dict], memo: dict | None, samples: dict | None) -> GroupSnapshot:
        kw = {"nodes": {}, "contract_findings": [], "now": T0}
        return build_snapshot(group=GROUP, generation=1, state="running", records=records,
                              samples_memo=samples, devices_memo=memo, **kw)  # fmt: skip

    def check(records: list[dict]) -> GroupSnapshot:
        got = built(records, memo, samples)
        assert got == built(records, None, None)
        assert set(memo) == {d.gpu for d in got.devices}  # this call's GPUs only
        return got

    hot = sample(1, T0, throttle_reasons=["hw_thermal_slowdown"])
    cool = sample(2, T0, throttled={"ts": T0, "throttle_reasons": ["sw_power_cap"]})
    memo: dict = {}
    samples: dict = {}
    first = {d.gpu: d for d in check([hot, cool]).devices}
    again = {d.gpu: d for d in check([cool, hot]).devices}  # the order of GPUs does not matter
    assert all(again[g] is first[g] for g in first)
    assert len(samples) == 3  # the reused GPUs' samples (and a kept throttled one) stay known
    xid = device_event(1, T0 + timedelta(seconds=1), "xid", 79)
    third = {d.gpu: d for d in check([hot, cool, xid]).devices}
    assert third[hot["gpu"]] is not first[hot["gpu"]] and third[hot["gpu"]].events
    assert third[hot["gpu"]].sample is first[hot["gpu"]].sample  # parsed once all the same
    assert third[cool["gpu"]] is first[cool["gpu"]]
    moved = {**cool, "node": "elsewhere"}
    fourth = {d.gpu: d for d in check([hot, moved, xid]).devices}
    assert fourth[cool["gpu"]].node == "elsewhere" and fourth[hot["gpu"]] is third[hot["gpu"]]
    fifth = {d.gpu: d for d in check([hot, moved]).devices}  # the event aged out
    assert not fifth[hot["gpu"]].events


_maybe = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True))


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 3),
    st.integers(0, 10**6),
    st.lists(_maybe, min_size=10, max_size=10),
    st.one_of(st.none(), st.integers(0, 10**6)),
    st.one_of(st.none(), st.booleans()),
)
def test_the_fast_step_constructor_builds_what_the_constructors_build(
    gen: int, step: int, xs: list[float | None], tokens: int | None, overflow: bool | None
) -> None:
    """`new_step` sets the slots directly (the live pass's parse): the same fields, the
    same derived `row` and `values`, equal, same hash and repr as the dataclass's own."""
    d, c, co, i, ck, o, loss, gn, scale, mf = xs
    made = new_step(
        T0, gen, step, d, c, co, i, ck, o, tokens, loss, gn, scale, overflow, 7, mf, None
    )
    ref = StepRecord(
        T0,
        gen,
        step,
        d,
        Phases(c, co, i, ck, o),
        tokens,
        loss,
        gn,
        scale,
        overflow,
        7,
        mf,
        None,
    )
    assert repr(made) == repr(ref)
    assert repr(made.row) == repr(ref.row)  # repr: NaN is not equal to itself
    assert repr(made.phases.values) == repr(ref.phases.values)
    if not any(x != x for x in xs if x is not None):
        assert made == ref
        assert hash(made) == hash(ref)
    with pytest.raises(AttributeError):
        made.step = 1  # type: ignore[misc]  # frozen, as the dataclass is


def test_the_fast_rank_state_constructor_builds_what_the_constructor_builds() -> None:
    steps = (new_step(T0, 1, 5, 1.0, 1.0, None, None, None, None, 8, 2.0, *[None] * 6),)
    cases = [(3, "n", "g", steps, (), None, 1, (steps, 0)), (0, None, None, (), (), None, 0, None)]
    for args in cases:
        made, ref = new_rank_state(*args), RankState(*args)
        assert made == ref and repr(made) == repr(ref) and hash(made) == hash(ref)
        assert made.slid_from == ref.slid_from
