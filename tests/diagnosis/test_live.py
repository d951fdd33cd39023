"""The live (incremental) snapshot equals a full rebuild on the same records.

Random timelines (hypothesis): per-rank steps, processes, collective windows and
process-groups reports of several generations and groups, out of ts order, with device
records moving GPUs between nodes, cut into random batches. After every batch the live
state's snapshot must equal `build_snapshot` over every record so far; with a retention,
it must equal `build_snapshot` over the records a reference trim keeps; and diagnosing
either snapshot gives the same findings.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from console.diagnosis import build_snapshot, diagnose, goodput
from console.diagnosis.live import LiveGroup, Retention
from console.diagnosis.rules import base
from console.diagnosis.rules.base import Context

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
GROUP = "g"


@st.composite
def record(draw: st.DrawFn, *, fixed: bool) -> dict[str, Any]:
    """One contract-shaped record; `fixed`: one generation, one node per rank."""
    rank = draw(st.integers(0, 3))
    ts = T0 + timedelta(seconds=6 * draw(st.integers(0, 20)))  # ties are common
    base: dict[str, Any] = {
        "ts": ts,
        "group": GROUP if fixed else draw(st.sampled_from([GROUP, GROUP, None, "other"])),
        "generation": 1 if fixed else draw(st.integers(0, 2)),
        "rank": rank,
        "node": f"n{rank // 2}" if fixed else draw(st.sampled_from([None, "n0", "n1"])),
    }
    kind = draw(st.sampled_from(["step", "step", "step", "process", "collective", "pg", "dev"]))
    if kind == "step":
        d = draw(st.floats(100, 3000))
        phases = {"compute": d * 0.7, "collective": d * 0.3}
        return {
            **base,
            "kind": "step",
            "step": draw(st.integers(0, 50)),
            "duration_ms": d,
            "tokens": 10,
            "loss": 2.0,
            "phases": phases,
        }
    if kind == "process":
        event = draw(st.sampled_from(["started", "exited"]))
        return {
            **base,
            "kind": "process",
            "event": event,
            "pid": rank,
            # Another GPU too: a rank of a later generation may run elsewhere.
            "gpu": draw(st.sampled_from([None, f"GPU-{rank}", f"GPU-{rank + 4}"])),
            "exit_code": 1 if event == "exited" else None,
        }
    if kind == "collective":
        state = draw(st.sampled_from(["completed", "started"]))
        seq = draw(st.integers(1, 4))
        return {
            **base,
            "kind": "collective",
            "entries": [
                {
                    "seq": seq,
                    "pg": "0",
                    "op": "all_reduce",
                    "numel": 8,
                    "dtype": "float32",
                    "state": state,
                    "started_ts": ts,
                }
            ],
        }
    if kind == "pg":
        return {
            **base,
            "kind": "process_groups",
            "groups": [
                {"pg": "0", "size": 6},
                {"pg": "1", "size": 2, "ranks": draw(st.sampled_from([[0, 1], [2, 3]]))},
            ],
        }
    return {
        "kind": "device_sample",
        "ts": ts,
        "gpu": f"GPU-{rank}",
        "node": draw(st.sampled_from([None, "n0", "n1", "n2"])),
        "index": rank % 8,
    }


def timeline(fixed: bool) -> st.SearchStrategy[list[list[dict[str, Any]]]]:
    return st.lists(st.lists(record(fixed=fixed), max_size=12), min_size=1, max_size=8)


def _full(records: list[dict[str, Any]], now: datetime) -> Any:
    return build_snapshot(
        group=GROUP,
        generation=1,
        state="running",
        records=records,
        nodes={"n0": now},
        contract_findings=[],
        now=now,
    )


def _live(live: LiveGroup, records: list[dict[str, Any]], now: datetime) -> Any:
    return live.snapshot(
        state="running", records=records, nodes={"n0": now}, contract_findings=[], now=now
    )


def _hints_hold(snap: Any) -> None:
    """Every RankState.slid_from the live state gives is true: the steps are the old ones
    less the dropped oldest, with newer ones appended (the digest takes it on trust)."""
    for r in snap.ranks:
        if r.slid_from is not None:
            old, cut = r.slid_from
            kept = len(old) - cut
            assert 0 <= cut <= len(old) and kept <= len(r.steps)
            assert all(a is b for a, b in zip(old[cut:], r.steps[:kept], strict=True))


def _check_live(batches: list[list[dict[str, Any]]], step_s: int = 1) -> None:
    """After every batch, and after a pass with nothing new `step_s` later (an Xid- or
    sweep-triggered pass: every RankState reused, the clock moved), the live snapshot is the
    full rebuild and diagnosing it with the memo carried between passes is diagnosing the
    rebuild without one."""
    live = LiveGroup(group=GROUP, generation=1)
    seen: list[dict[str, Any]] = []
    for i, batch in enumerate(batches):
        for k, new in enumerate((batch, [])):
            now = T0 + timedelta(seconds=150 + (2 * i + k) * step_s)
            seen += new
            live.apply(new)
            full = _full(seen, now)
            snap = _live(live, seen, now)
            assert snap == full
            _hints_hold(snap)
            assert diagnose(snap, now, memo=live.memo) == diagnose(full, now)


@settings(max_examples=300, deadline=None)
@given(timeline(fixed=False), st.sampled_from([1, 7, 400, 3000]))
def test_live_equals_full_rebuild(batches: list[list[dict[str, Any]]], step_s: int) -> None:
    # Steps of 400 s and 3,000 s cross the hang thresholds and move steps out of the
    # goodput window on passes with no new record.
    _check_live(batches, step_s)


def _steps(rank: int, ts: datetime, n: int, **kw: Any) -> list[dict[str, Any]]:
    return [
        {"kind": "step", "ts": ts + timedelta(seconds=i), "group": GROUP, "generation": 1,
         "rank": rank, "node": f"n{rank // 2}", "step": i, "duration_ms": 1000.0,
         "tokens": 10, "loss": 2.0, "phases": {"compute": 700.0, "collective": 300.0}} | kw
        for i in range(n)
    ]  # fmt: skip


def _window(rank: int, ts: datetime, numel: int) -> dict[str, Any]:
    return {
        "kind": "collective", "ts": ts, "group": GROUP, "generation": 1, "rank": rank,
        "entries": [{"seq": 1, "pg": "0", "op": "all_reduce", "numel": numel,
                     "dtype": "float32", "state": "completed", "started_ts": ts}],
    }  # fmt: skip


# Each timeline changes exactly what one memo layer must notice, so the check above fails
# when that layer reuses a stale value (the memo tests can fail).
STALE = {
    # a NaN loss arrives: the ranks changed, per-pass aggregates (numerics) must not be reused
    "per_pass": [_steps(0, T0, 4) + _steps(1, T0, 4), [_steps(0, T0 + timedelta(seconds=9),
                 1, step=9, loss=float("nan"))[0]]],
    # a rank's window changes (a mismatch) while nothing else does
    "keyed": [[_window(0, T0, 8), _window(1, T0, 8)], [_window(1, T0 + timedelta(seconds=1), 16)]],
    # steps leave the goodput window on a pass with nothing new
    "goodput": [_steps(0, T0, 4) + _steps(1, T0, 4), []],
    # one rank's steps slide (a newer one appended): its new step enters goodput's table
    "goodput_slide": [_steps(0, T0, 4) + _steps(1, T0, 4),
                      [_steps(0, T0 + timedelta(seconds=9), 1, step=9)[0]]],
}  # fmt: skip
STEP_S = {"goodput_slide": 1}  # the others move the clock across every threshold


def test_stale_timelines_pass_with_the_real_memo() -> None:
    for layer, batches in STALE.items():
        _check_live(batches, step_s=STEP_S.get(layer, 3000))


@pytest.mark.parametrize("layer", sorted(STALE))
def test_a_broken_memo_fails_the_check(layer: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Deliberately broken memo layers: the equality check must catch each."""
    if layer == "per_pass":
        # every RankState taken for last pass's: the per-pass values are never dropped
        monkeypatch.setattr(base, "_same", lambda a, b: True)
    elif layer == "keyed":

        def keyed(self: Context, name: str, key: Any, compute: Any) -> Any:
            hit = self._memo.get(name)
            if hit is None:
                hit = self._memo[name] = (key, compute())
            return hit[1]  # the key is ignored

        monkeypatch.setattr(Context, "keyed", keyed)
    elif layer == "goodput":
        # every rank's steps taken as inside the window: its old step table kept
        monkeypatch.setattr(goodput, "_inside", lambda steps, start: bool(steps))
    else:
        real = goodput._slid

        def slid(rank: int, old: Any, new: Any, contrib: Any, cut: int = -1) -> Any:
            got = real(rank, old, new, contrib, cut)  # and then the appended steps left out
            if got is None:
                return None
            for key in got[1]:
                contrib[key].pop(rank)
            return got[0], []

        monkeypatch.setattr(goodput, "_slid", slid)
    with pytest.raises(AssertionError):
        _check_live(STALE[layer], step_s=STEP_S.get(layer, 3000))


def test_hang_fires_on_passes_with_no_new_records() -> None:
    """Time-driven checks judge the clock, not the records: reused aggregates (the stall
    threshold) must not keep a pass with nothing new from opening a hang."""
    live = LiveGroup(group=GROUP, generation=1)
    recs = _steps(0, T0, 5) + _steps(1, T0, 5)
    live.apply(recs)
    kinds: list[set[str]] = []
    for dt in (5, 6, 60, 600):  # no record after the first pass
        now = T0 + timedelta(seconds=dt)
        snap = _live(live, recs, now)
        got = diagnose(snap, now, memo=live.memo)
        assert got == diagnose(_full(recs, now), now)
        kinds.append({f.kind for f in got.findings})
    assert not kinds[0] & {"group_stall", "rank_hang"}
    assert kinds[-1] & {"group_stall", "rank_hang"}


def _trimmed(records: list[dict[str, Any]], now: datetime, ret: Retention) -> list[dict]:
    """Reference retention over raw records (what the database's full read returns)."""
    assert ret.step_window and ret.history and ret.step_cap
    out = [r for r in records if r["kind"] not in ("step", "process", "collective")]
    order = {id(r): i for i, r in enumerate(records)}
    for rank in {r["rank"] for r in records if "rank" in r}:
        mine = sorted(
            (r for r in records if r.get("rank") == rank and r["kind"] == "step"),
            key=lambda r: (r["ts"], order[id(r)]),
        )
        recent = [r for r in mine if r["ts"] >= now - ret.step_window][-ret.step_cap :]
        if not recent and mine and mine[-1]["ts"] >= now - ret.history:
            recent = [mine[-1]]
        out += recent
        out += [
            r
            for r in records
            if r.get("rank") == rank
            and r["kind"] in ("process", "collective")
            and r["ts"] >= now - ret.history
        ]
    return sorted(out, key=lambda r: order[id(r)])


@settings(max_examples=300, deadline=None)
@given(timeline(fixed=True), st.integers(1, 200))
def test_live_retention_equals_trimmed_rebuild(
    batches: list[list[dict[str, Any]]], step_s: int
) -> None:
    ret = Retention(step_window=timedelta(seconds=30), step_cap=3, history=timedelta(seconds=90))
    live = LiveGroup(group=GROUP, generation=1, retention=ret)
    seen: list[dict[str, Any]] = []
    for i, batch in enumerate(batches):
        # Late records (ts older than already trimmed ones) arrive too: the clock runs on.
        now = T0 + timedelta(seconds=60 + i * step_s)
        seen += batch
        live.apply(batch)
        snap = _live(live, seen, now)
        full = _full(_trimmed(seen, now, ret), now)
        assert snap == full
        _hints_hold(snap)
        # Trimmed steps slide (oldest dropped, newest appended): the memo's incremental
        # structures (goodput's step table) follow them step by step.
        assert diagnose(snap, now, memo=live.memo) == diagnose(full, now)


def test_untouched_ranks_are_reused() -> None:
    """A pass rebuilds only the ranks the new records touched."""
    live = LiveGroup(group=GROUP, generation=1)
    steps = [
        {
            "kind": "step",
            "ts": T0,
            "group": GROUP,
            "generation": 1,
            "rank": rk,
            "step": 1,
            "duration_ms": 1000.0,
        }
        for rk in range(100)
    ]
    live.apply(steps)
    first = _live(live, [], T0)
    assert live.touched == 100
    live.apply([{**steps[7], "ts": T0 + timedelta(seconds=1), "step": 2}])
    second = _live(live, [], T0 + timedelta(seconds=1))
    assert live.touched == 1
    assert all(a is b for a, b in zip(first.ranks, second.ranks, strict=True) if a.rank != 7)
    assert second.ranks[7].last_step is not None and second.ranks[7].last_step.step == 2


def test_the_non_rank_part_follows_every_argument_when_its_records_are_the_same() -> None:
    """A pass whose records are the very same dicts keeps the last non-rank build, and
    makes again what the other arguments change: the nodes' heartbeats (merged with the
    heartbeat records), the state, the contract findings, the SLO and the objectives."""
    recs: list[dict[str, Any]] = [
        *_steps(0, T0, 3),
        *_steps(1, T0, 3),
        {"kind": "heartbeat", "ts": T0 + timedelta(seconds=2), "node": "n0", "group": GROUP},
        {"kind": "heartbeat", "ts": T0 + timedelta(seconds=9), "node": "n1", "group": "other"},
        {"kind": "device_sample", "ts": T0, "gpu": "GPU-0", "node": "n0", "index": 0},
    ]
    live = LiveGroup(group=GROUP, generation=1)
    live.apply(recs)
    violation = {"kind": "schema", "subject": "rank:g/0", "evidence": {"field": "loss"}}
    passes: list[dict[str, Any]] = [
        {"state": "running", "nodes": {"n0": T0}, "contract_findings": []},
        {"state": "running", "nodes": {"n0": T0 + timedelta(seconds=5)}, "contract_findings": []},
        {"state": "checkpointing", "nodes": {"n1": T0}, "contract_findings": [violation]},
        {"state": "checkpointing", "nodes": {"n1": T0}, "contract_findings": [violation],
         "slo": {"goodput_target": 0.9}, "objectives": {"rpo_steps": 100}},
        {"state": "running", "nodes": {}, "contract_findings": []},
    ]  # fmt: skip
    for i, kw in enumerate(passes):
        now = T0 + timedelta(seconds=10 + i)
        got = live.snapshot(records=recs, now=now, **kw)
        full = build_snapshot(group=GROUP, generation=1, records=recs, now=now, **kw)
        assert got == full
        assert got.taken_at == now
    assert live._base is not None and live._base.records[0] is recs[0]  # kept, not rebuilt
