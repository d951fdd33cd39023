"""Every kernel-log format of the fixtures, through the agent's code and the real ingest path.

Each record is taken from tests/agents/fixtures/kmsg/ as the agent reads it (a /dev/kmsg
record or a journal entry), parsed by agents/kmsg.py, folded by agents/evidence.py and
posted by the node's agent to POST /api/v1/ingest on real Postgres. Each scenario asserts
the stored event (its GPU, process, severity), the hardware lifecycle (out of service only
for what NVIDIA says needs it) and, where a job runs, the diagnosis.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from agents import kmsg
from agents.evidence import Evidence
from console.models import Device, Incident, Node
from ingest.models import DeviceEvent, HostEvent
from tests.conftest import make_batch
from tests.server.scenarios.timeline import HEALTHY_S, Timeline, healthy_job, only

pytestmark = pytest.mark.django_db

FIXTURES = Path(__file__).parents[2] / "agents" / "fixtures" / "kmsg"
NODE, GPU = "gb-1", "GPU-gb-1-0"


def _fixture(name: str, contains: str) -> str:
    """The one record of fixture `name` that contains `contains`."""
    found = [ln for ln in (FIXTURES / name).read_text().splitlines()
             if ln and not ln.startswith(("#", " ")) and contains in ln]  # fmt: skip
    assert len(found) == 1, (name, contains, found)
    return found[0]


def _read(name: str, contains: str, at: datetime) -> kmsg.KernelEvent | None:
    """The fixture record read by the agent's parser as if the kernel logged it at `at`."""
    line = _fixture(name, contains)
    if name.endswith(".kmsg"):
        usec = int(line.split(",")[2])
        return kmsg.parse_record(line, fmt="kmsg", boot_epoch=at.timestamp() - usec / 1e6)
    entry = json.loads(line)
    entry["__REALTIME_TIMESTAMP"] = str(int(at.timestamp() * 1e6))
    return kmsg.parse_record(json.dumps(entry), fmt="journal")


def _agent_records(events: list[kmsg.KernelEvent | None], pci: str) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    evidence = Evidence(sent.append, pci_to_gpu=lambda: {pci: GPU})
    for event in events:
        if event is not None:
            evidence.kernel_sink(event)
    return sent


def _post(post_batch, records: list[dict[str, Any]]) -> None:
    sample = {"kind": "device_sample", "gpu": GPU, "index": 0, "temp_c": 50.0, "power_w": 90.0}
    response = post_batch(make_batch([sample, *records], node=NODE))
    assert response.status_code == 202, response.content


def _idle_node(post_batch, name: str, *contains: str, pci: str) -> None:
    """The fixture records, logged now on an idle node whose GPU 0 sits at `pci`."""
    now = datetime.now(UTC)
    _post(post_batch, _agent_records([_read(name, c, now) for c in contains], pci))


def _gpu() -> Device:
    return Device.objects.get(uuid=GPU)


def _node_incident() -> Incident | None:
    return Incident.objects.filter(node__name=NODE, group=None).exclude(state="resolved").first()


def _out(repair: str) -> None:
    gpu, node = _gpu(), Node.objects.get(name=NODE)
    assert (gpu.lifecycle, node.lifecycle, gpu.health, node.health) == (
        "faulted", "faulted", "critical", "critical")  # fmt: skip
    assert gpu.repair_needed == repair


def _in_service() -> None:
    gpu, node = _gpu(), Node.objects.get(name=NODE)
    assert (gpu.lifecycle, node.lifecycle, gpu.repair_needed) == ("healthy", "healthy", "")
    assert "critical" not in (gpu.health, node.health)
    assert _node_incident() is None


# -- a GPU fallen off the bus, with no Xid line ----------------------------------------------


@pytest.mark.parametrize(
    ("name", "contains", "pci"),
    [("gpu_off_bus.kmsg", r"GPU 0000:3b:00.0\x0a", "00000000:3B:00.0"),
     ("gpu_off_bus.journal.jsonl", r"GPU 0000:3b:00.0\n", "0000:3b:00.0")],
)  # fmt: skip
def test_a_gpu_fallen_off_the_bus_without_an_xid_is_lost_and_needs_a_reboot(
    post_batch, name, contains, pci
) -> None:
    _idle_node(post_batch, name, contains, pci=pci)
    (event,) = DeviceEvent.objects.filter(gpu=GPU)
    assert (event.event, event.code) == ("gpu_lost", None)
    _out("node_reboot")
    incident = _node_incident()
    assert incident is not None and (incident.kind, incident.subject) == ("gpu_lost", f"gpu:{GPU}")


def test_the_run_time_fall_off_the_bus_is_one_xid_79_and_one_lost_gpu(post_batch) -> None:
    _idle_node(post_batch, "gpu_off_bus.kmsg", "(PCI:0000:5e:00): 79", "0000:5e:00.0: GPU has",
               pci="0000:5e:00.0")  # fmt: skip
    assert sorted(DeviceEvent.objects.filter(gpu=GPU).values_list("event", "code")) == [
        ("gpu_lost", None), ("xid", 79)]  # fmt: skip
    _out("node_reboot")


# -- Xid 154: the recovery action in the line ------------------------------------------------


@pytest.mark.parametrize(
    ("contains", "action", "repair"),
    [
        ("154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU", "gpu_reset", "gpu_reset"),
        ("to 0x2 (Node Reboot Required)", "node_reboot", "node_reboot"),
        ("to 0x3 (Drain P2P)", "drain_p2p", "gpu_reset"),
        ("to 0x4 (Drain and Reset)", "drain_and_reset", "gpu_reset"),
        ("to 0x2 (OS Reboot)", "node_reboot", "node_reboot"),
    ],
)
def test_an_xid_154_line_alone_takes_the_gpu_out_for_the_action_it_reports(
    post_batch, contains, action, repair
) -> None:
    line = _fixture("xid154.kmsg", contains)
    pci = line.split("(PCI:")[1].split(")")[0] + ".0"
    _idle_node(post_batch, "xid154.kmsg", contains, pci=pci)
    (event,) = DeviceEvent.objects.filter(gpu=GPU)
    assert (event.code, event.recovery_action) == (154, action)
    _out(repair)
    incident = _node_incident()
    assert incident is not None and incident.root_cause["evidence"]["recovery_action"] == action


@pytest.mark.parametrize("contains", ["0x1 (GPU Reset Required) to 0x0 (None)",
                                      "to 0x5 (Recover IMEX Domain)"])  # fmt: skip
def test_an_xid_154_to_no_action_or_an_unknown_one_leaves_the_gpu_in_service(
    post_batch, contains
) -> None:
    _idle_node(post_batch, "xid154.kmsg", contains, pci="0000:01:00.0")
    if "0x5" in contains:  # that record is of another GPU: map it to ours
        DeviceEvent.objects.all().delete()
        _idle_node(post_batch, "xid154.kmsg", contains, pci="0008:01:00.0")
    (event,) = DeviceEvent.objects.filter(gpu=GPU)
    assert event.code == 154 and event.recovery_action in ("none", None)
    _in_service()


# -- NVLink5: only a fatal decode takes the GPU out ------------------------------------------


@pytest.mark.parametrize(
    ("contains", "pci", "fatal", "shown"),
    [
        ("NETIR_LINK_EVT  Fatal", "0018:01:00.0", True, "NETIR_LINK_EVT link fatal on link 9"),
        ("NETIR_MFDE_EVENT Fatal", "0008:01:00.0", True, "NETIR_MFDE_EVENT fatal"),
        ("145, RLW_REMAP Fatal", "0009:01:00.0", True, "RLW_REMAP fatal"),
        ("MSE_WATCHDOG Fatal", "0009:01:00.0", True, "MSE_WATCHDOG fatal"),
        ("NETIR_BER_EVENT Nonfatal", "0008:01:00.0", False, "NETIR_BER_EVENT non-fatal"),
        ("name=python, RLW_REMAP Nonfatal", "0009:01:00.0", False, "RLW_REMAP non-fatal"),
        ("(0x026001c6", "0008:01:00.0", False, "link fatal on link 0"),  # NVIDIA: IGNORE
        ("TREX Nonfatal", "0009:01:00.0", False, "TREX non-fatal"),
    ],
)
def test_an_nvlink5_xid_takes_the_gpu_out_only_when_its_decode_is_fatal(
    post_batch, contains, pci, fatal, shown
) -> None:
    _idle_node(post_batch, "nvlink5.kmsg", contains, pci=pci)
    (event,) = DeviceEvent.objects.filter(gpu=GPU)
    assert shown in event.detail  # the decode is the evidence shown
    assert event.recovery_action == ("gpu_reset" if fatal else "none")
    if fatal:
        _out("gpu_reset")
        incident = _node_incident()
        assert incident is not None and shown in incident.summary
    else:
        _in_service()


def test_an_nvlink5_xid_with_no_decode_is_left_for_a_human_not_taken_out(post_batch) -> None:
    _idle_node(post_batch, "nvlink5.kmsg", "RLW_REMAP error", pci="0009:01:00.0")
    (event,) = DeviceEvent.objects.filter(gpu=GPU)
    assert (event.code, event.recovery_action) == (145, None)
    _in_service()


@pytest.fixture
def tl(post_batch) -> Timeline:
    return healthy_job(post_batch)


def _feed(t: Timeline, rank: int, name: str, contains: str, at: float, pci: str) -> None:
    sent: list[dict[str, Any]] = []
    evidence = Evidence(sent.append, pci_to_gpu=lambda: {pci: t.gpu(rank)})
    event = _read(name, contains, t.at(at))
    if event is not None:  # the OOM killer's choice line is none: it names no kill
        evidence.kernel_sink(event)
    for rec in sent:
        ts = datetime.fromisoformat(rec.pop("ts").replace("Z", "+00:00"))
        t.add(t.node(rank), ts, rec)


def _waits(t: Timeline, *, missing: int, at: float = HEALTHY_S + 1) -> None:
    t.collectives(seq=HEALTHY_S, at=at, entered=[r for r in range(t.ranks) if r != missing])


def test_a_fatal_nvlink5_decode_is_the_jobs_root_cause_on_its_gpu(tl) -> None:
    _feed(tl, 5, "nvlink5.kmsg", "NETIR_LINK_EVT  Fatal", HEALTHY_S + 0.5, "0018:01:00.0")
    _waits(tl, missing=5)
    incident = only(tl.diagnose(at=HEALTHY_S + 1.5))
    assert (incident.kind, incident.subject, incident.severity) == (
        "xid", f"gpu:{tl.gpu(5)}", "critical")  # fmt: skip
    evidence = incident.root_cause["evidence"]
    assert (evidence["code"], evidence["xid_class"], evidence["recovery_action"]) == (
        149, "hardware", "gpu_reset")  # fmt: skip
    assert "NETIR_LINK_EVT link fatal" in evidence["detail"]


def test_a_non_fatal_nvlink5_decode_is_minor_and_blames_nothing(tl) -> None:
    _feed(tl, 3, "nvlink5.kmsg", "NETIR_BER_EVENT Nonfatal", HEALTHY_S + 0.5, "0008:01:00.0")
    tl.steps(first=HEALTHY_S, count=2, at=HEALTHY_S + 1)
    incident = only(tl.diagnose(at=HEALTHY_S + 2.5))
    assert (incident.kind, incident.severity) == ("xid", "minor")
    assert incident.root_cause["evidence"]["xid_class"] == "informational"
    assert "NETIR_BER_EVENT non-fatal" in incident.root_cause["evidence"]["detail"]
    assert Device.objects.get(uuid=tl.gpu(3)).health != "critical"


def test_an_nvml_xid_without_an_action_and_the_kernels_decode_are_judged_as_one(tl) -> None:
    # NVML saw the Xid first and could not read a recovery action; the kernel line's
    # decode (non-fatal) arrives 0.2 s later: one informational Xid, not an undetermined one.
    tl.add(tl.node(3), tl.at(HEALTHY_S + 0.3), {"kind": "device_event", "gpu": tl.gpu(3),
           "event": "xid", "code": 149, "detail": "NVLINK_NETIR_ERROR"})  # fmt: skip
    _feed(tl, 3, "nvlink5.kmsg", "NETIR_BER_EVENT Nonfatal", HEALTHY_S + 0.5, "0008:01:00.0")
    tl.steps(first=HEALTHY_S, count=2, at=HEALTHY_S + 1)
    incident = only(tl.diagnose(at=HEALTHY_S + 2.5))
    assert (incident.kind, incident.severity, incident.role) == ("xid", "minor", "root_cause")


# -- codes above 172 ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("contains", "out", "repair"),
    [("173, C2C", True, "node_reboot"), ("175, memory", True, "gpu_reset"),
     ("174, pid=4242", False, ""), ("176, PCIe", False, "")],
)  # fmt: skip
def test_the_codes_above_172_take_the_gpu_out_as_their_class_says(post_batch, contains, out,
                                                                   repair) -> None:  # fmt: skip
    _idle_node(post_batch, "xid.kmsg", contains, pci="0008:01:00.0")
    assert DeviceEvent.objects.filter(gpu=GPU, event="xid").count() == 1
    if out:
        _out(repair)
    else:
        _in_service()


# -- PCIe AER: evidence on the node, never a lifecycle move ----------------------------------


@pytest.mark.parametrize(
    ("name", "contains", "event", "device"),
    [
        ("aer.kmsg", "Uncorrected (Fatal) error received: id=8100", "aer_fatal", "0000:81:00"),
        ("aer.kmsg", "AER: Uncorrectable (Fatal) error message received from", "aer_fatal",
         "0000:81:00"),
        ("aer.kmsg", "from 0000:02:00.0 (no details found", "aer_corrected", "0000:02:00"),
        ("aer.kmsg", "CXL Bus Error", "aer_nonfatal", "0000:0d:00"),
        ("aer.kmsg", "Corrected error received: id=00e5", "aer_corrected", "0000:00:1c"),
        ("classes.journal.jsonl", "Uncorrectable (Fatal) error message", "aer_fatal",
         "0000:81:00"),
    ],
)  # fmt: skip
def test_an_aer_line_of_any_kernel_is_stored_with_its_severity_and_moves_no_lifecycle(
    post_batch, name, contains, event, device
) -> None:
    _idle_node(post_batch, name, contains, pci="0000:81:00.0")
    (stored,) = HostEvent.objects.all()
    assert (stored.event, stored.device, stored.severity) == (
        event, device, event.removeprefix("aer_"))  # fmt: skip
    _in_service()


# -- the OOM killer: the killed task, not the one chosen ---------------------------------------


def _exit(t: Timeline, rank: int, pid: int, at: float) -> None:
    t.add(t.node(rank), t.at(at), {
        "kind": "process", "group": t.group, "generation": 1, "rank": rank, "event": "exited",
        "pid": pid, "gpu": t.gpu(rank), "signal": 9})  # fmt: skip


def _oom_lines(t: Timeline, rank: int, at: float) -> None:
    for contains in ("Kill process 1234 (torchrun)", "Killed process 1240 (pt_data_worker)"):
        _feed(t, rank, "oom.kmsg", contains, at, "0000:00:00.0")
        at += 0.01


def test_an_oom_kill_of_a_sacrificed_child_explains_the_childs_exit(tl) -> None:
    _oom_lines(tl, 2, HEALTHY_S + 0.4)
    _exit(tl, 2, 1240, HEALTHY_S + 0.5)
    _waits(tl, missing=2)
    incident = only(tl.diagnose(at=HEALTHY_S + 1.5))
    assert (incident.kind, incident.subject) == ("oom", f"rank:{tl.group}/2")
    kernel = incident.root_cause["evidence"]["kernel"]
    assert (kernel["pid"], kernel["comm"]) == (1240, "pt_data_worker")
    assert list(HostEvent.objects.values_list("event", "pid")) == [("oom_kill", 1240)]


def test_the_task_the_oom_killer_chose_but_spared_is_not_explained_by_it(tl) -> None:
    _oom_lines(tl, 2, HEALTHY_S + 0.4)
    _exit(tl, 2, 1234, HEALTHY_S + 0.5)  # the parent named in "Kill process 1234"
    _waits(tl, missing=2)
    incident = only(tl.diagnose(at=HEALTHY_S + 1.5))
    assert incident.kind == "process_exit"
    assert "kernel" not in incident.root_cause["evidence"]


@pytest.mark.parametrize(
    ("contains", "pid", "comm"),
    [("(python3 (train))", 5200, "python3 (train)"), ("([rank3] python)", 5201, "[rank3] python"),
     ("Killed process 5203", 5203, "训练")],
)  # fmt: skip
def test_an_oom_kill_keeps_a_task_name_with_brackets_whole(tl, contains, pid, comm) -> None:
    _feed(tl, 2, "oom.kmsg", contains, HEALTHY_S + 0.4, "0000:00:00.0")
    _exit(tl, 2, pid, HEALTHY_S + 0.5)
    _waits(tl, missing=2)
    incident = only(tl.diagnose(at=HEALTHY_S + 1.5))
    assert incident.kind == "oom"
    assert incident.root_cause["evidence"]["kernel"]["comm"] == comm


# -- user space cannot fake a GPU fault --------------------------------------------------------


@pytest.mark.parametrize("name", ["untrusted.kmsg", "untrusted.journal.jsonl"])
def test_no_user_space_record_or_echo_of_a_users_string_becomes_an_xid(post_batch, name) -> None:
    now = datetime.now(UTC)
    lines = [ln for ln in (FIXTURES / name).read_text().splitlines()
             if ln and not ln.startswith(("#", " "))]  # fmt: skip
    records: list[dict[str, Any]] = []
    for line in lines[:-1]:  # the last record is the control
        fmt = "kmsg" if name.endswith(".kmsg") else "journal"
        if fmt == "journal":
            entry = json.loads(line)
            entry["__REALTIME_TIMESTAMP"] = str(int(now.timestamp() * 1e6))
            line = json.dumps(entry)
        event = kmsg.parse_record(line, fmt=fmt, boot_epoch=now.timestamp() - 10)
        records += _agent_records([event], "0000:3b:00.0")
    _post(post_batch, records)
    assert not DeviceEvent.objects.exists()
    _in_service()
    # The control: the same words from the kernel are an Xid that takes the GPU out.
    if name.endswith(".kmsg"):
        _idle_node(post_batch, name, "4,8030,", pci="0000:3b:00.0")
    else:
        _idle_node(post_batch, name, '"1764587200700000"', pci="0000:3b:00.0")
    assert DeviceEvent.objects.filter(gpu=GPU, code=79).count() == 1
    _out("node_reboot")
