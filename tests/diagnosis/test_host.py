"""Host rules over plain records: kernel-log findings, network_slow's port, full disks."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from console.diagnosis import ROOT_CAUSE, SYMPTOM, UNDETERMINED, diagnose
from console.diagnosis.findings import MINOR
from tests.diagnosis.factory import (
    T0,
    checkpoint,
    heartbeats,
    node_of,
    of_kind,
    process,
    rank_subject,
    snap,
    training,
    transition,
)

NOW = T0 + timedelta(seconds=1)


def _host_event(node: str, event: str, ago_s: float = 5.0, **fields: Any) -> dict[str, Any]:
    return {"kind": "host_event", "ts": NOW - timedelta(seconds=ago_s), "node": node,
            "event": event, **fields}  # fmt: skip


def _diag(recs: list[dict], ranks: int = 16):
    return diagnose(snap(recs, nodes=heartbeats(ranks, NOW)), NOW)


def _slow_node(recs: list[dict], ranks: set[int], extra_ms: float = 700.0) -> list[dict]:
    out = []
    for r in recs:
        if r["kind"] == "step" and r["rank"] in ranks:
            phases = {**r["phases"], "collective": r["phases"]["collective"] + extra_ms}
            r = {**r, "duration_ms": r["duration_ms"] + extra_ms, "phases": phases}
        out.append(r)
    return out


def test_it_files_kernel_events_as_node_findings_with_their_roles_and_severities() -> None:
    node = node_of(3)
    recs = [
        *training(ranks=16),
        _host_event(node, "mce"),
        _host_event(node, "mce", ago_s=4.0),
        _host_event(node, "aer_corrected", device="0000:01:00", severity="corrected"),
        _host_event(node, "aer_fatal", device="0000:81:00", severity="fatal"),
        _host_event(node, "sxid", device="0000:c8:00", code=20034, severity="fatal"),
        _host_event(node, "hung_task", pid=77, comm="python"),
    ]
    d = _diag(recs)
    (mce,) = of_kind(d, "machine_check")
    assert (mce.subject, mce.role, mce.severity, mce.evidence["count"]) == (
        f"node:{node}", ROOT_CAUSE, "major", 2)  # fmt: skip
    aers = {f.evidence["device"]: (f.role, f.severity) for f in of_kind(d, "pcie_aer")}
    assert aers == {"0000:01:00": (ROOT_CAUSE, MINOR), "0000:81:00": (ROOT_CAUSE, "critical")}
    (sx,) = of_kind(d, "nvswitch_error")
    assert (sx.severity, sx.evidence["codes"]) == ("critical", [20034])
    (hung,) = of_kind(d, "hung_task")
    assert hung.role == UNDETERMINED and hung.evidence["tasks"] == [{"pid": 77, "comm": "python"}]
    assert mce.recovery is not None and mce.recovery.reason.startswith("no restart needed")


def test_it_ignores_kernel_events_older_than_the_host_window() -> None:
    recs = [*training(ranks=16), _host_event(node_of(3), "mce", ago_s=3600.0)]
    assert of_kind(_diag(recs), "machine_check") == []


def test_it_calls_an_exit_the_oom_killer_ended_an_oom_with_the_kernel_line() -> None:
    recs = training(ranks=16)
    recs.append(_host_event(node_of(4), "oom_kill", ago_s=0.6, pid=1004, comm="python"))
    recs.append(process(4, NOW - timedelta(seconds=0.5), "exited", signal=9))
    (oom,) = of_kind(_diag(recs), "oom")
    assert (oom.subject, oom.role) == (rank_subject(4), ROOT_CAUSE)
    assert oom.evidence["kernel"]["pid"] == 1004 and oom.evidence["memory"] == "host"


def test_it_cites_the_moved_counter_of_the_slow_nodes_port() -> None:
    ranks = 32
    recs = _slow_node(training(ranks=ranks), {16, 17, 18})
    node = node_of(16)
    recs.append({"kind": "net_event", "ts": NOW - timedelta(seconds=10), "node": node,
                 "port": "mlx5_2/1", "link": "ib", "event": "errors",
                 "counters": {"symbol_error": 900, "port_rcv_errors": 4}})  # fmt: skip
    recs.append({"kind": "net_event", "ts": NOW - timedelta(seconds=8), "node": node_of(0),
                 "port": "mlx5_0/1", "link": "ib", "event": "link_down",
                 "counters": {"link_downed": 1}})  # fmt: skip
    (net,) = of_kind(_diag(recs, ranks), "network_slow")
    assert (net.subject, net.evidence["port"], net.evidence["counter"]) == (
        f"node:{node}", "mlx5_2/1", "symbol_error")  # fmt: skip
    assert "error counters on mlx5_2/1: symbol_error +900" in net.summary


def test_it_says_when_the_slow_node_sends_no_network_counters() -> None:
    ranks = 32
    d = _diag(_slow_node(training(ranks=ranks), {16, 17, 18}), ranks)
    (net,) = of_kind(d, "network_slow")
    missing = net.evidence["missing_evidence"]
    assert (
        missing
        == f"no network counters from {node_of(16)} (agent without host evidence, or no HCA)"
    )


def _disk(node: str, free: int, total: int = 1000) -> dict[str, Any]:
    return {"kind": "host_sample", "ts": NOW, "node": node,
            "disks": [{"root": "/ckpt", "device": "nvme1n1", "free_bytes": free,
                       "total_bytes": total}]}  # fmt: skip


def test_it_blames_the_full_disk_for_a_corrupt_checkpoint_and_names_the_disk() -> None:
    recs = training(ranks=16)
    recs.append(checkpoint(NOW - timedelta(seconds=0.5), "ckpt-119", 119, "corrupt"))
    recs.append(_disk(node_of(0), free=5))
    d = _diag(recs)
    (disk,) = of_kind(d, "disk_full")
    (bad,) = of_kind(d, "checkpoint_corrupt")
    assert (disk.role, disk.evidence["device"], disk.evidence["failed_checkpoints"]) == (
        ROOT_CAUSE, "nvme1n1", ["ckpt-119"])  # fmt: skip
    assert (bad.role, bad.caused_by) == (SYMPTOM, (disk.id,))
    assert disk.recovery is not None and not disk.recovery.auto_restart_safe


def test_it_does_not_call_a_disk_with_room_full() -> None:
    recs = [*training(ranks=16), _disk(node_of(0), free=500)]
    assert of_kind(_diag(recs), "disk_full") == []


def _restarted(extra: list[dict], *, gen2_ranks: bool = False):
    """Generation 1 ran on ranks 0-15; generation 2 began at NOW - 2 s, its ranks not
    reported yet unless `gen2_ranks` (then rank 3 is back on its old node)."""
    began = NOW - timedelta(seconds=2)
    recs = [*training(ranks=16), transition(began, "recovering", "running", gen=2), *extra]
    if gen2_ranks:
        recs.append(process(3, began, "started", gen=2))
    return diagnose(snap(recs, gen=2, nodes=heartbeats(16, NOW)), NOW)


KERNEL = [("mce", "machine_check"), ("aer_fatal", "pcie_aer"), ("io_error", "io_error")]


@pytest.mark.parametrize(("event", "kind"), KERNEL)
def test_a_kernel_fault_from_the_generation_before_is_not_the_next_ones_before_its_ranks_report(
    event, kind
) -> None:
    """The group restarted (maybe onto a spare): the node whose kernel fault stopped
    generation 1 is no finding of generation 2 while no generation-2 rank names a node."""
    d = _restarted([_host_event(node_of(3), event, ago_s=4.0, device="0000:81:00")])
    assert of_kind(d, kind) == []


@pytest.mark.parametrize(("event", "kind"), KERNEL)
def test_a_kernel_fault_after_the_restart_or_on_a_node_the_ranks_name_is_judged(
    event, kind
) -> None:
    after = _restarted([_host_event(node_of(3), event, ago_s=1.0, device="0000:81:00")])
    assert [f.subject for f in of_kind(after, kind)] == [f"node:{node_of(3)}"]
    back = _restarted([_host_event(node_of(3), event, ago_s=4.0, device="0000:81:00")],
                      gen2_ranks=True)  # fmt: skip
    assert [f.subject for f in of_kind(back, kind)] == [f"node:{node_of(3)}"]
