"""Every Xid class of the catalog (agents/xid.py), replayed through the real ingest path.

Same fleet as the fault matrix: 8 ranks on 2 nodes, 30 s healthy, then one GPU reports
an Xid. Each scenario asserts the finding, its role, the advice, and whether the node is
taken out (the restart advice excludes it; ingest marks the GPU and node critical).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agents import xid
from console.apps import apply_xid_overrides
from console.models import Device, Node
from tests.server.scenarios.timeline import HEALTHY_S, Timeline, healthy_job, only, symptoms

pytestmark = pytest.mark.django_db


@pytest.fixture
def tl(post_batch) -> Timeline:
    return healthy_job(post_batch)


def _xid(t: Timeline, rank: int, code: int, *, at: float, recovery: str | None = None) -> None:
    rec = {"kind": "device_event", "gpu": t.gpu(rank), "event": "xid", "code": code,
           "detail": xid.detail(code)}  # fmt: skip
    if recovery is not None:
        rec["recovery_action"] = recovery
    t.add(t.node(rank), t.at(at), rec)


def _exit(t: Timeline, rank: int, *, at: float, **fields) -> None:
    t.add(t.node(rank), t.at(at), {
        "kind": "process", "group": t.group, "generation": 1, "rank": rank, "event": "exited",
        "gpu": t.gpu(rank), **fields})  # fmt: skip


def _waits(t: Timeline, *, missing: int, at: float = HEALTHY_S + 1) -> None:
    t.collectives(seq=HEALTHY_S, at=at, entered=[r for r in range(t.ranks) if r != missing])


def _taken_out(t: Timeline, rank: int) -> bool:
    """Ingest's verdict: the GPU and its node are critical."""
    gpu = Device.objects.get(uuid=t.gpu(rank)).health
    node = Node.objects.get(name=t.node(rank)).health
    assert (gpu == "critical") == (node == "critical"), (gpu, node)
    return gpu == "critical"


# -- hardware -------------------------------------------------------------------------


def test_a_hardware_xid_is_the_gpus_root_cause_and_takes_the_node_out(tl):
    _xid(tl, 5, 95, at=HEALTHY_S + 0.5)
    _waits(tl, missing=5)
    incident = only(tl.diagnose(at=HEALTHY_S + 1.5))
    assert (incident.kind, incident.subject, incident.role) == (
        "xid", f"gpu:{tl.gpu(5)}", "root_cause")  # fmt: skip
    assert incident.root_cause["evidence"]["xid_class"] == "hardware"
    assert symptoms(incident).count("collective_timeout") == 7
    assert "without node-1" in incident.recovery["reason"]
    assert "reset it (nvidia-smi -r)" in incident.recovery["reason"]
    assert _taken_out(tl, 5)


def test_a_hardware_xid_advises_the_recovery_action_the_driver_reports(tl):
    _xid(tl, 5, 62, at=HEALTHY_S + 0.5, recovery="gpu_reset")
    _xid(tl, 5, 154, at=HEALTHY_S + 0.51, recovery="node_reboot")
    _waits(tl, missing=5)
    incident = only(tl.diagnose(at=HEALTHY_S + 1.5))
    assert incident.root_cause["evidence"]["code"] == 62
    assert incident.root_cause["evidence"]["recovery_action"] == "node_reboot"
    assert "the driver requires a node reboot" in incident.recovery["reason"]
    assert _taken_out(tl, 5)


# -- application ----------------------------------------------------------------------


def test_an_application_xid_folds_under_the_ranks_exception_and_keeps_the_node(tl):
    _xid(tl, 2, 13, at=HEALTHY_S + 0.5)
    _exit(tl, 2, at=HEALTHY_S + 0.6, exit_code=1, reason="exception", error_type="RuntimeError")
    _waits(tl, missing=2)
    incident = only(tl.diagnose(at=HEALTHY_S + 10))
    assert (incident.kind, incident.subject) == ("exception", f"rank:{tl.group}/2")
    assert incident.root_cause["evidence"]["xids"][0]["code"] == 13
    assert "xid" in symptoms(incident)
    assert "without" not in incident.recovery["reason"]
    assert not _taken_out(tl, 2)


def test_an_application_xid_alone_stands_as_an_application_root_cause(tl):
    _xid(tl, 2, 31, at=HEALTHY_S + 0.5)
    _waits(tl, missing=2)
    incident = only(tl.diagnose(at=HEALTHY_S + 1.5))
    assert (incident.kind, incident.subject, incident.role) == (
        "xid", f"rank:{tl.group}/2", "root_cause")  # fmt: skip
    assert incident.root_cause["evidence"]["takes_gpu_out"] is False
    assert "restart the application" in incident.recovery["reason"]
    assert "without" not in incident.recovery["reason"]
    assert symptoms(incident).count("collective_timeout") == 7
    assert not _taken_out(tl, 2)


# -- consequence ----------------------------------------------------------------------


def test_xid_45_after_a_kill_is_a_symptom_of_the_ranks_exit(tl):
    _exit(tl, 2, at=HEALTHY_S + 0.5, signal=9, reason="killed")
    _xid(tl, 2, 45, at=HEALTHY_S + 0.55)
    _waits(tl, missing=2)
    incident = only(tl.diagnose(at=HEALTHY_S + 10))
    assert (incident.kind, incident.subject) == ("process_exit", f"rank:{tl.group}/2")
    assert "xid" in symptoms(incident)
    assert "without" not in incident.recovery["reason"]
    assert not _taken_out(tl, 2)


# -- informational --------------------------------------------------------------------


def test_an_informational_xid_is_minor_and_asks_no_restart(tl):
    _xid(tl, 3, 92, at=HEALTHY_S + 0.5)
    tl.steps(first=HEALTHY_S, count=2, at=HEALTHY_S + 1)
    incident = only(tl.diagnose(at=HEALTHY_S + 2.5))
    assert (incident.kind, incident.severity) == ("xid", "minor")
    assert incident.recovery["reason"].startswith("no restart needed")
    assert not _taken_out(tl, 3)


# -- undetermined ---------------------------------------------------------------------


def test_an_unknown_xid_is_undetermined_and_a_human_looks_before_anything_moves(tl):
    _xid(tl, 3, 31337, at=HEALTHY_S + 0.5)
    tl.steps(first=HEALTHY_S, count=2, at=HEALTHY_S + 1)
    incident = only(tl.diagnose(at=HEALTHY_S + 2.5))
    assert (incident.kind, incident.role) == ("xid", "undetermined")
    assert incident.recovery["auto_restart_safe"] is False
    assert "without" not in incident.recovery["reason"]
    assert not _taken_out(tl, 3)


# -- the operator's override ----------------------------------------------------------


@pytest.fixture
def overrides(settings, tmp_path: Path):
    path = tmp_path / "xids.toml"
    path.write_text('13 = { class = "hardware", action = "RESET_GPU" }\n')
    settings.XID_OVERRIDES_FILE = str(path)
    apply_xid_overrides()
    yield
    settings.XID_OVERRIDES_FILE = None
    apply_xid_overrides()
    assert xid.active() is xid.CATALOG


def test_an_operators_override_turns_an_application_xid_into_a_hardware_fault(tl, overrides):
    _xid(tl, 5, 13, at=HEALTHY_S + 0.5)
    _waits(tl, missing=5)
    incident = only(tl.diagnose(at=HEALTHY_S + 1.5))
    assert (incident.kind, incident.subject) == ("xid", f"gpu:{tl.gpu(5)}")
    assert incident.root_cause["evidence"]["overridden"] is True
    assert "without node-1" in incident.recovery["reason"]
    assert _taken_out(tl, 5)
