"""The seed's fault-injection matrix, replayed through the real ingest endpoint.

Each scenario: 30 s of healthy training on 8 ranks (2 nodes x 4 GPUs), then one fault.
It asserts the root cause Faultline names, the symptoms folded under it, the recovery
advice, and — for the healthy and quiet cases — that nothing is raised at all.
"""

from __future__ import annotations

import pytest

from tests.server.scenarios.timeline import HEALTHY_S, Timeline, healthy_job, only, symptoms

pytestmark = pytest.mark.django_db


@pytest.fixture
def tl(post_batch) -> Timeline:
    return healthy_job(post_batch)


def _waits(t: Timeline, *, missing: int, at: float = HEALTHY_S + 1, **odd) -> None:
    t.collectives(seq=HEALTHY_S, at=at, entered=[r for r in range(t.ranks) if r != missing],
                  **odd)  # fmt: skip


# -- no false positives ----------------------------------------------------------------


def test_it_raises_nothing_for_a_healthy_jittery_group(tl):
    assert tl.diagnose(at=HEALTHY_S + 0.5) == []


def test_it_raises_nothing_while_the_group_writes_a_long_checkpoint(tl):
    tl.add(tl.node(0), tl.at(HEALTHY_S + 0.5), {
        "kind": "transition", "group": tl.group, "generation": 1,
        "from_state": "running", "to_state": "checkpointing"})  # fmt: skip
    tl.checkpoint("ckpt-30", at=HEALTHY_S + 0.6, step=30, phase="staging")
    assert tl.diagnose(at=HEALTHY_S + 90) == []


def test_it_raises_nothing_for_a_quiet_serving_group(post_batch):
    t = Timeline(post=post_batch, group="chat")
    for i in range(6):
        for w in range(3):
            t.add("node-0", t.at(i * 10), {
                "kind": "serving", "group": "chat", "worker": f"w{w}", "ready": True,
                "model_version": "m-7", "adapter_version": None, "kv_schema": "kv-3",
                "window": {"seconds": 10, "requests": 0, "slo_met": 0}})  # fmt: skip
    t.heartbeats(until=60)
    assert t.diagnose(at=61) == []


# -- GPU -----------------------------------------------------------------------------


def test_xid_79_is_the_root_cause_and_waiting_ranks_are_its_symptoms(tl):
    tl.add(tl.node(5), tl.at(HEALTHY_S + 0.5),
           {"kind": "device_event", "gpu": tl.gpu(5), "event": "xid", "code": 79})  # fmt: skip
    _waits(tl, missing=5)
    incident = only(tl.diagnose(at=HEALTHY_S + 1.5))
    assert (incident.kind, incident.subject) == ("xid", f"gpu:{tl.gpu(5)}")
    assert "rank 5" in incident.summary
    assert symptoms(incident).count("collective_timeout") == 7
    assert incident.recovery["checkpoint"] == "ckpt-10"


@pytest.mark.parametrize(("event", "kind"), [("gpu_lost", "gpu_lost"), ("ecc_dbe", "ecc_dbe")])
def test_a_lost_gpu_or_double_bit_error_is_named_on_the_gpu(tl, event, kind):
    tl.add(tl.node(2), tl.at(HEALTHY_S + 0.5),
           {"kind": "device_event", "gpu": tl.gpu(2), "event": event})  # fmt: skip
    _waits(tl, missing=2)
    incident = only(tl.diagnose(at=HEALTHY_S + 2))
    assert (incident.kind, incident.subject) == (kind, f"gpu:{tl.gpu(2)}")


def test_a_thermally_throttled_gpu_makes_a_straggler(post_batch):
    t = Timeline(post=post_batch)
    t.boot(at=0)
    t.sample(1, at=5, temp_c=92.0, sm_clock_mhz=1100.0,
             throttle_reasons=["hw_thermal_slowdown", "sw_thermal_slowdown"])  # fmt: skip

    def phases(rank: int, step: int) -> dict[str, float]:
        compute = 1400.0 if rank == 1 else 650.0
        return {"compute": compute, "collective": 250.0, "input": 40.0, "optimizer": 60.0}

    t.steps(first=0, count=20, at=1, phases=phases)
    t.heartbeats(until=25)
    incident = only(t.diagnose(at=20.5))
    assert (incident.kind, incident.subject) == ("thermal_throttle", f"gpu:{t.gpu(1)}")
    assert "straggler" in symptoms(incident)


# -- process -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "kind"),
    [
        ({"signal": 9, "reason": "killed"}, "process_exit"),
        ({"exit_code": 0, "reason": "clean"}, "process_exit"),
        ({"exit_code": 1, "reason": "oom", "error_type": "OutOfMemoryError"}, "oom"),
        ({"exit_code": 1, "reason": "exception", "error_type": "RuntimeError"}, "exception"),
    ],
)
def test_a_rank_that_exits_is_the_root_cause_of_the_others_waits(tl, fields, kind):
    tl.add(tl.node(2), tl.at(HEALTHY_S + 0.5), {
        "kind": "process", "group": tl.group, "generation": 1, "rank": 2, "event": "exited",
        "gpu": tl.gpu(2), **fields})  # fmt: skip
    _waits(tl, missing=2)
    incident = only(tl.diagnose(at=HEALTHY_S + 10))
    assert (incident.kind, incident.subject) == (kind, f"rank:{tl.group}/2")
    assert symptoms(incident).count("collective_timeout") == 7


def test_a_silent_hang_without_evidence_is_undetermined_and_says_what_is_missing(tl):
    tl.steps(first=HEALTHY_S, count=10, at=HEALTHY_S + 1,
             ranks=[r for r in range(8) if r != 3])  # fmt: skip
    _waits(tl, missing=3, at=HEALTHY_S + 11)
    incidents = tl.diagnose(at=HEALTHY_S + 25)
    incident = only(incidents)
    assert incident.subject == f"rank:{tl.group}/3"
    assert incident.role == "undetermined"
    assert "missing_evidence" in incident.root_cause["evidence"]
    assert incident.recovery == {} or incident.recovery.get("auto_restart_safe") is False


# -- collectives ---------------------------------------------------------------------


def test_a_collective_mismatch_names_the_odd_rank_and_blocks_auto_restart(tl):
    tl.collectives(seq=HEALTHY_S, at=HEALTHY_S + 1, entered=list(range(8)),
                   **{"6": {"dtype": "float32"}})  # fmt: skip
    incident = only(tl.diagnose(at=HEALTHY_S + 20))
    assert (incident.kind, incident.subject) == ("collective_mismatch", f"rank:{tl.group}/6")
    assert incident.recovery["auto_restart_safe"] is False


def test_a_slow_nic_on_one_node_is_named_on_that_node(post_batch):
    t = Timeline(post=post_batch, ranks=12)
    t.boot(at=0)

    def phases(rank: int, step: int) -> dict[str, float]:
        collective = 900.0 if t.node(rank) == "node-1" else 250.0
        return {"compute": 650.0, "collective": collective, "input": 40.0, "optimizer": 60.0}

    t.steps(first=0, count=20, at=1, phases=phases)
    t.heartbeats(until=25)
    incident = only(t.diagnose(at=20.5))
    assert (incident.kind, incident.subject) == ("network_slow", "node:node-1")


# -- data and model --------------------------------------------------------------------


def test_a_nan_loss_is_a_group_root_cause_and_restart_is_not_safe(tl):
    tl.steps(first=HEALTHY_S, count=1, at=HEALTHY_S + 1,
             loss=lambda r, s: "NaN" if r == 4 else 1.9)  # fmt: skip
    incident = only(tl.diagnose(at=HEALTHY_S + 1.5))
    assert incident.kind == "nan_loss"
    assert incident.recovery["auto_restart_safe"] is False


def test_an_input_stall_on_a_healthy_gpu_is_named_on_the_rank(post_batch):
    t = Timeline(post=post_batch)
    t.boot(at=0)

    def phases(rank: int, step: int) -> dict[str, float]:
        data = 800.0 if rank == 2 else 40.0
        return {"compute": 650.0, "collective": 250.0, "input": data, "optimizer": 60.0}

    t.steps(first=0, count=20, at=1, phases=phases)
    t.heartbeats(until=25)
    incident = only(t.diagnose(at=20.5))
    assert (incident.kind, incident.subject) == ("input_stall", f"rank:{t.group}/2")


def test_a_data_cursor_going_backwards_is_flagged(tl):
    tl.add(tl.node(1), tl.at(HEALTHY_S + 1), {
        "kind": "step", "group": tl.group, "generation": 1, "rank": 1, "step": HEALTHY_S,
        "tokens": 4096, "data_cursor": 10, "duration_ms": 1000.0})  # fmt: skip
    incident = only(tl.diagnose(at=HEALTHY_S + 1.5))
    assert (incident.kind, incident.subject) == ("data_cursor_regression", f"rank:{tl.group}/1")


# -- checkpoints -----------------------------------------------------------------------


def test_a_corrupt_checkpoint_is_named_and_the_older_valid_one_is_advised(tl):
    tl.good_checkpoint("ckpt-20", at=20.5, step=20)
    tl.checkpoint("ckpt-20", at=25, step=20, phase="corrupt", detail="shard1.distcp sha256")
    incident = only(tl.diagnose(at=26))
    assert (incident.kind, incident.subject) == (
        "checkpoint_corrupt",
        f"checkpoint:{tl.group}/ckpt-20",
    )
    assert incident.recovery["checkpoint"] == "ckpt-10"


def test_a_partial_manifest_is_not_a_valid_checkpoint(tl):
    partial = {"shards": [{"path": "ckpt-20/shard0.distcp", "bytes": 1000}], "total_bytes": 2000}
    tl.checkpoint("ckpt-20", at=20.5, step=20, phase="committed", manifest=partial)
    incident = only(tl.diagnose(at=21))
    assert incident.kind == "checkpoint_partial"
    assert incident.recovery["checkpoint"] == "ckpt-10"


def test_a_shard_missing_from_the_committed_manifest_is_flagged(tl):
    two = {"shards": [{"path": f"c/s{i}", "bytes": 10, "sha256": f"{i:064x}"} for i in range(2)],
           "total_bytes": 20}  # fmt: skip
    one = {"shards": two["shards"][:1], "total_bytes": 10}
    tl.checkpoint("ckpt-20", at=20.5, step=20, phase="written", manifest=two)
    tl.checkpoint("ckpt-20", at=20.6, step=20, phase="committed", manifest=one)
    incident = only(tl.diagnose(at=21))
    assert incident.kind == "checkpoint_missing_shard"


# -- contracts -------------------------------------------------------------------------


def test_an_old_generation_still_writing_after_a_restart_is_split_brain(tl):
    tl.send()
    tl.add(tl.node(0), tl.at(HEALTHY_S + 1), {
        "kind": "transition", "group": tl.group, "generation": 2, "from_state": "recovering",
        "to_state": "running", "restart_count": 1})  # fmt: skip
    tl.send()
    tl.steps(first=HEALTHY_S, count=2, at=HEALTHY_S + 3, ranks=[6])  # generation 1 still writes
    incidents = tl.diagnose(at=HEALTHY_S + 5)
    incident = only(incidents)
    assert incident.kind == "split_brain"
    assert incident.recovery["auto_restart_safe"] is False


# -- host ------------------------------------------------------------------------------


def test_a_node_whose_heartbeats_and_ranks_stop_is_down(post_batch):
    t = Timeline(post=post_batch)
    t.boot(at=0)
    t.steps(first=0, count=20, at=1, ranks=range(4))
    t.steps(first=0, count=79, at=1, ranks=range(4, 8))
    t.heartbeats(until=20)
    for i in range(20, 90, 5):
        t.add("node-1", t.at(i), {"kind": "heartbeat", "uptime_s": float(i)})
    incident = only(t.diagnose(at=80))
    assert (incident.kind, incident.subject) == ("node_down", "node:node-0")


def test_a_stall_longer_than_the_step_window_stays_open(post_batch):
    """Silence must never resolve an incident: 20 minutes later the stall is still there."""
    from datetime import UTC, datetime, timedelta

    tl = Timeline(post=post_batch, start=datetime.now(UTC) - timedelta(minutes=25))
    tl.boot(at=0)
    tl.steps(first=0, count=HEALTHY_S, at=1)  # then every rank stops, nothing explains it
    tl.heartbeats(until=HEALTHY_S + 60)
    first = only(tl.diagnose(at=HEALTHY_S + 25))
    tl.heartbeats(until=HEALTHY_S + 20 * 60)  # the agents stay up; only the job is stuck
    later = only(tl.diagnose(at=HEALTHY_S + 20 * 60))
    assert later.pk == first.pk
    assert later.kind == "group_stall"


def _throttled_then_clean(t: Timeline, *, throttled_at: float) -> None:
    t.boot(at=0)
    t.sample(1, at=throttled_at, temp_c=92.0, sm_clock_mhz=1100.0,
             throttle_reasons=["hw_thermal_slowdown", "sw_thermal_slowdown"])  # fmt: skip
    t.sample(1, at=15, temp_c=60.0, sm_clock_mhz=1980.0, throttle_reasons=[])

    def phases(rank: int, step: int) -> dict[str, float]:
        compute = 1400.0 if rank == 1 else 650.0
        return {"compute": compute, "collective": 250.0, "input": 40.0, "optimizer": 60.0}

    t.steps(first=0, count=20, at=1, phases=phases)
    t.heartbeats(until=25)


def test_a_throttle_that_just_ended_still_explains_the_slow_steps_it_caused(post_batch):
    """`faultline demo`: the GPU's clocks recovered, its newest sample was clean, and the
    rank's slow steps, still in the straggler window, paged a second, undetermined
    `straggler` incident beside the `thermal_throttle` one."""
    t = Timeline(post=post_batch)
    _throttled_then_clean(t, throttled_at=5)
    incident = only(t.diagnose(at=20.5))
    assert (incident.kind, incident.subject) == ("thermal_throttle", f"gpu:{t.gpu(1)}")
    assert "straggler" in symptoms(incident)
    assert "clocks recovered" in incident.summary


def test_a_throttle_older_than_the_judged_steps_explains_nothing(post_batch):
    t = Timeline(post=post_batch)
    _throttled_then_clean(t, throttled_at=0.5)  # before the window's first step
    incident = only(t.diagnose(at=20.5))
    assert (incident.kind, incident.role) == ("straggler", "undetermined")


def _restart(t: Timeline, *, at: float, from_step: int) -> None:
    t.generation += 1
    t.boot(at=at)
    t.steps(first=from_step, count=5, at=at + 1)
    t.heartbeats(until=at + 8)


def test_a_corrupt_checkpoint_keeps_one_incident_across_the_restart_that_skipped_it(tl):
    """`faultline demo`: the corrupt checkpoint of generation 4 was paged again, as a new
    incident, at each of generations 5 and 6 (its finding was fingerprinted on the
    group's generation, not on the checkpoint's)."""
    tl.good_checkpoint("ckpt-20", at=20.5, step=20)
    tl.checkpoint("ckpt-20", at=25, step=20, phase="corrupt", detail="shard1.distcp sha256")
    first = only(tl.diagnose(at=26))
    assert first.kind == "checkpoint_corrupt"
    _restart(tl, at=30, from_step=10)  # restored the older valid ckpt-10
    after = [i for i in tl.diagnose(at=37) if i.kind == "checkpoint_corrupt"]
    assert [i.id for i in after] == [first.id]


def test_a_contract_violation_keeps_one_incident_across_the_next_restart(tl):
    _restart(tl, at=HEALTHY_S + 1, from_step=10)
    # A rank of generation 1 writes after generation 2's fence: split brain.
    tl.steps(first=40, count=1, at=HEALTHY_S + 4, ranks=[3])
    tl.records[tl.node(3)][-1]["generation"] = 1
    (first,) = [i for i in tl.diagnose(at=HEALTHY_S + 5) if i.kind == "split_brain"]
    _restart(tl, at=HEALTHY_S + 10, from_step=15)
    after = [i for i in tl.diagnose(at=HEALTHY_S + 17) if i.kind == "split_brain"]
    assert [i.id for i in after] == [first.id]
