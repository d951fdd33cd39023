"""Kernel, network and storage evidence, replayed through the real ingest path.

The records come from the agent's own code: captured kernel-log lines (tests/agents/
fixtures/kmsg/) through agents/kmsg.py and agents/evidence.py, and a fake HCA and disk
(agents/fake_host.py) read by the real sysfs readers (agents/host.py). Each scenario
asserts the finding, its subject and the evidence it cites.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from agents import kmsg
from agents.evidence import Evidence
from agents.fake_host import FakeHost
from ingest.models import DeviceEvent, HostEvent, NetEvent
from tests.server.scenarios.timeline import HEALTHY_S, Timeline, healthy_job, only, symptoms

pytestmark = pytest.mark.django_db

KMSG = Path(__file__).parents[2] / "agents" / "fixtures" / "kmsg" / "kmsg.txt"


def _line(prefix: str) -> str:
    """The captured /dev/kmsg record whose message starts with `prefix`."""
    return next(
        ln for ln in KMSG.read_text().splitlines() if ln.partition(";")[2].startswith(prefix)
    )


def _kernel(t: Timeline, node: str, line: str, at: float, gpus: dict[str, str] | None = None,
            evidence: Evidence | None = None) -> Evidence:  # fmt: skip
    """Feed one captured kmsg record, stamped at second `at`, through the agent's code."""
    usec = int(line.split(",")[2])
    epoch = t.at(at).timestamp() - usec / 1e6  # the boot time that puts the line at `at`
    parsed = kmsg.parse_kmsg_record(line, epoch)
    assert parsed is not None
    event = kmsg.parse_message(*parsed)
    assert event is not None, line
    ev = evidence or Evidence(_into(t, node), pci_to_gpu=lambda: dict(gpus or {}))
    ev.kernel_sink(event)
    return ev


def _into(t: Timeline, node: str):
    def emit(rec: dict[str, Any]) -> None:
        ts = datetime.fromisoformat(rec.pop("ts").replace("Z", "+00:00"))
        t.add(node, ts, rec)

    return emit


@pytest.fixture
def tl(post_batch) -> Timeline:
    return healthy_job(post_batch)


def _waits(t: Timeline, *, missing: int, at: float = HEALTHY_S + 1) -> None:
    t.collectives(seq=HEALTHY_S, at=at, entered=[r for r in range(t.ranks) if r != missing])


# -- kernel log -------------------------------------------------------------------------


def test_it_makes_one_event_of_a_kernel_log_xid_and_the_same_xid_through_nvml(tl):
    node, gpu = tl.node(5), tl.gpu(5)
    evidence = Evidence(_into(tl, node), pci_to_gpu=lambda: {"00000000:3B:00.0": gpu})
    nvml = {"kind": "device_event", "ts": tl.at(HEALTHY_S + 0.5).isoformat(), "gpu": gpu,
            "event": "xid", "code": 79, "detail": "GPU has fallen off the bus"}  # fmt: skip
    evidence.device_sink(nvml)
    # The driver prints the Xid and the fallen-off-the-bus line 0.2 s after NVML saw it.
    _kernel(tl, node, _line("NVRM: Xid (PCI:0000:3b:00): 79"), HEALTHY_S + 0.7,
            evidence=evidence)  # fmt: skip
    _kernel(tl, node, _line("NVRM: GPU 0000:3b:00.0: GPU has fallen off"), HEALTHY_S + 0.71,
            evidence=evidence)  # fmt: skip
    _waits(tl, missing=5)
    incident = only(tl.diagnose(at=HEALTHY_S + 1.5))
    assert DeviceEvent.objects.filter(gpu=gpu, event="xid").count() == 1
    assert evidence.xids.sources(gpu, 79) == {"nvml", "kmsg"}
    assert (incident.kind, incident.subject, incident.role) == ("xid", f"gpu:{gpu}", "root_cause")
    assert incident.root_cause["evidence"]["code"] == 79


def test_it_files_a_kernel_log_xid_alone_as_the_gpus_xid(tl):
    node, gpu = tl.node(5), tl.gpu(5)
    _kernel(tl, node, _line("NVRM: Xid (PCI:0000:5e:00): 48"), HEALTHY_S + 0.5,
            gpus={"0000:5e:00.0": gpu})  # fmt: skip
    _waits(tl, missing=5)
    incident = only(tl.diagnose(at=HEALTHY_S + 1.5))
    assert (incident.kind, incident.subject) == ("xid", f"gpu:{gpu}")
    assert incident.root_cause["evidence"]["code"] == 48


def test_it_explains_a_ranks_exit_by_the_oom_killer_line(tl):
    # Rank 2 (pid 102, node-0) dies by SIGKILL; the kernel says the OOM killer did it.
    line = _line("Out of memory: Killed process 4242").replace("4242", "102")
    _kernel(tl, tl.node(2), line, HEALTHY_S + 0.4)
    tl.add(tl.node(2), tl.at(HEALTHY_S + 0.5), {
        "kind": "process", "group": tl.group, "generation": 1, "rank": 2, "event": "exited",
        "pid": 102, "gpu": tl.gpu(2), "signal": 9})  # fmt: skip
    _waits(tl, missing=2)
    incident = only(tl.diagnose(at=HEALTHY_S + 1.5))
    assert (incident.kind, incident.subject, incident.role) == (
        "oom", f"rank:{tl.group}/2", "root_cause")  # fmt: skip
    kernel = incident.root_cause["evidence"]["kernel"]
    assert (kernel["event"], kernel["pid"], kernel["comm"]) == ("oom_kill", 102, "python")
    assert "OOM killer" in incident.summary
    assert HostEvent.objects.filter(event="oom_kill", pid=102).count() == 1


def test_it_files_an_oom_kill_of_another_pid_as_no_explanation(tl):
    _kernel(tl, tl.node(2), _line("Out of memory: Killed process 4242"), HEALTHY_S + 0.4)
    tl.add(tl.node(2), tl.at(HEALTHY_S + 0.5), {
        "kind": "process", "group": tl.group, "generation": 1, "rank": 2, "event": "exited",
        "pid": 102, "gpu": tl.gpu(2), "signal": 9})  # fmt: skip
    _waits(tl, missing=2)
    incident = only(tl.diagnose(at=HEALTHY_S + 1.5))
    assert incident.kind == "process_exit"
    assert "kernel" not in incident.root_cause["evidence"]


def test_it_files_a_machine_check_as_a_host_finding_that_needs_no_restart(tl):
    _kernel(tl, tl.node(6), _line("mce: [Hardware Error]: CPU 3"), HEALTHY_S + 0.5)
    tl.steps(first=HEALTHY_S, count=2, at=HEALTHY_S + 1)
    incident = only(tl.diagnose(at=HEALTHY_S + 2.5))
    assert (incident.kind, incident.subject, incident.role) == (
        "machine_check", "node:node-1", "root_cause")  # fmt: skip
    assert incident.recovery["reason"].startswith("no restart needed")


# -- network ------------------------------------------------------------------------------


def _slow_node_1(post_batch) -> Timeline:
    t = Timeline(post=post_batch, ranks=12)
    t.boot(at=0)

    def phases(rank: int, step: int) -> dict[str, float]:
        collective = 900.0 if t.node(rank) == "node-1" and step >= 10 else 250.0
        return {"compute": 650.0, "collective": collective, "input": 40.0, "optimizer": 60.0}

    t.steps(first=0, count=20, at=1, phases=phases)
    t.heartbeats(until=25)
    return t


def _host_round(t: Timeline, node: str, host: FakeHost, at: float) -> None:
    monitor = getattr(host, "_test_monitor", None) or host.monitor([Path("/ckpt")])
    host._test_monitor = monitor  # type: ignore[attr-defined]  # the test keeps one baseline
    emit = _into(t, node)
    for rec in monitor.round():
        rec["ts"] = t.at(at).isoformat()
        emit(rec)


def test_it_explains_the_slow_collectives_of_a_nodes_ranks_by_a_link_flap_on_its_hca(
    post_batch, tmp_path
):
    t = _slow_node_1(post_batch)
    host = FakeHost("node-1", root=tmp_path)
    _host_round(t, "node-1", host, at=5)  # the baseline
    host.script("link_flap")
    _host_round(t, "node-1", host, at=10)
    incident = only(t.diagnose(at=20.5))
    assert (incident.kind, incident.subject) == ("network_slow", "node:node-1")
    ev = incident.root_cause["evidence"]
    assert (ev["port"], ev["counter"]) == ("mlx5_0/1", "link_downed")
    assert ev["network"]["counters"]["link_downed"] == 1
    assert "link flap on mlx5_0/1" in incident.summary
    assert NetEvent.objects.filter(port="mlx5_0/1", event="link_down").count() == 1


def test_it_says_network_slow_has_no_port_evidence_when_no_counter_moved(post_batch, tmp_path):
    t = _slow_node_1(post_batch)
    host = FakeHost("node-1", root=tmp_path)
    _host_round(t, "node-1", host, at=5)
    _host_round(t, "node-1", host, at=10)
    incident = only(t.diagnose(at=20.5))
    assert incident.kind == "network_slow"
    ev = incident.root_cause["evidence"]
    assert "port" not in ev
    assert ev["missing_evidence"] == "no port counter moved on node-1"


# -- storage ----------------------------------------------------------------------------


def test_it_explains_a_failed_checkpoint_by_its_full_disk_and_names_the_disk(tl, tmp_path):
    host = FakeHost("node-0", root=tmp_path)
    host.script("disk_full")
    tl.checkpoint("ckpt-30", at=HEALTHY_S + 0.2, step=30, phase="staging")
    tl.steps(first=HEALTHY_S, count=3, at=HEALTHY_S + 1)
    _host_round(tl, "node-0", host, at=HEALTHY_S + 1)
    incident = only(tl.diagnose(at=HEALTHY_S + 3.5))
    assert (incident.kind, incident.subject, incident.role) == (
        "disk_full", "node:node-0", "root_cause")  # fmt: skip
    ev = incident.root_cause["evidence"]
    assert (ev["device"], ev["root"], ev["free_bytes"]) == ("nvme1n1", "/ckpt", 0)
    assert ev["failed_checkpoints"] == ["ckpt-30"]
    assert "nvme1n1" in incident.summary and "ckpt-30" not in incident.summary
    assert symptoms(incident) == ["checkpoint_failed"]
    assert incident.recovery["auto_restart_safe"] is False


def test_it_leaves_a_checkpoint_in_progress_alone_when_its_disk_has_room(tl, tmp_path):
    host = FakeHost("node-0", root=tmp_path)
    tl.checkpoint("ckpt-30", at=HEALTHY_S + 0.2, step=30, phase="staging")
    tl.steps(first=HEALTHY_S, count=3, at=HEALTHY_S + 1)
    _host_round(tl, "node-0", host, at=HEALTHY_S + 1)
    assert tl.diagnose(at=HEALTHY_S + 3.5) == []
