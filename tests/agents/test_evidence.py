"""The evidence fold for the kernel log's GPU lines: lost GPUs, recovery actions, decodes.

Records are read from the fixtures (tests/agents/fixtures/kmsg/) through the agent's parser
and folded with NVML's events in both orders; what is sent must satisfy the contract.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from agents import kmsg
from agents.evidence import Evidence

from .conftest import validate

FIXTURES = Path(__file__).parent / "fixtures" / "kmsg"
T0 = datetime(2026, 12, 1, 10, tzinfo=UTC)
PCI = {"00000000:3B:00.0": "GPU-a", "00000000:01:00.0": "GPU-b", "00000018:01:00.0": "GPU-c"}


def _record(name: str, starts: str) -> str:
    """The fixture record of `name` whose message starts with `starts`."""
    for line in (FIXTURES / name).read_text().splitlines():
        message = line.partition(";")[2] if name.endswith(".kmsg") else line
        if not line.startswith("#") and starts in message[: len(starts) + 200]:
            return line
    raise AssertionError(f"{name}: no record starting {starts!r}")


def _kernel(name: str, starts: str, at: datetime) -> kmsg.KernelEvent:
    line = _record(name, starts)
    usec = int(line.split(",")[2])
    event = kmsg.parse_record(line, fmt="kmsg", boot_epoch=at.timestamp() - usec / 1e6)
    assert event is not None, line
    return event


def _nvml(gpu: str, event: str, at: datetime, **fields: Any) -> dict[str, Any]:
    return {"kind": "device_event", "ts": at.isoformat(), "gpu": gpu, "event": event, **fields}


def _fold(*steps: Any) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    ev = Evidence(sent.append, pci_to_gpu=lambda: dict(PCI))
    for step in steps:
        if isinstance(step, kmsg.KernelEvent):
            ev.kernel_sink(step)
        else:
            ev.device_sink(dict(step))
    validate(sent)
    return sent


def test_it_sends_a_gpu_fallen_off_the_bus_without_an_xid_as_the_gpus_gpu_lost() -> None:
    sent = _fold(_kernel("gpu_off_bus.kmsg", "NVRM: The NVIDIA GPU 0000:3b:00.0", T0))
    assert [(r["gpu"], r["event"], r.get("code")) for r in sent] == [("GPU-a", "gpu_lost", None)]
    assert "fallen off the bus" in sent[0]["detail"]


def test_it_sends_one_gpu_lost_for_the_kernel_line_and_nvmls_in_either_order() -> None:
    line = _kernel("gpu_off_bus.kmsg", "NVRM: The NVIDIA GPU 0000:3b:00.0", T0)
    nvml = _nvml("GPU-a", "gpu_lost", T0 + timedelta(seconds=1), detail="GPU is lost")
    for steps in itertools.permutations([line, nvml]):
        sent = _fold(*steps)
        assert [(r["gpu"], r["event"]) for r in sent] == [("GPU-a", "gpu_lost")], steps


def test_it_sends_the_xid_79_and_the_lost_gpu_of_one_failure_as_two_events() -> None:
    xid79 = kmsg.KernelEvent("xid", T0, device="0000:3b:00", code=79)
    lost = kmsg.KernelEvent("gpu_off_bus", T0 + timedelta(seconds=0.01), device="0000:3b:00")
    assert [(r["event"], r.get("code")) for r in _fold(xid79, lost)] == [
        ("xid", 79), ("gpu_lost", None)]  # fmt: skip


def test_it_carries_the_recovery_action_of_a_kernel_xid_154_line() -> None:
    sent = _fold(_kernel("xid154.kmsg", "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action "
                         "changed from 0x0 (None) to 0x4", T0))  # fmt: skip
    assert [(r["gpu"], r["code"], r["recovery_action"]) for r in sent] == [
        ("GPU-b", 154, "drain_and_reset")]  # fmt: skip
    assert sent[0]["detail"] == "GPU recovery action changed from none to drain_and_reset"


@pytest.mark.parametrize("nvml_action", [None, "none"])
def test_it_sends_a_later_witness_that_brings_a_recovery_action_the_first_lacked(nvml_action):
    kernel = _kernel("xid154.kmsg", "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action "
                     "changed from 0x0 (None) to 0x1", T0)  # fmt: skip
    fields = {"code": 154} | ({} if nvml_action is None else {"recovery_action": nvml_action})
    nvml = _nvml("GPU-b", "xid", T0 + timedelta(seconds=0.2), **fields)
    for steps in itertools.permutations([kernel, nvml]):
        sent = _fold(*steps)
        actions = {r.get("recovery_action") for r in sent}
        assert "gpu_reset" in actions, steps  # whichever came first, the action reaches ingest
        # A witness that adds nothing is not sent again.
        assert len(sent) == (1 if nvml_action is None and steps[0] is kernel else 2), steps


def test_it_sends_the_same_xid_twice_only_when_the_second_adds_something() -> None:
    nvml = _nvml("GPU-b", "xid", T0, code=62, recovery_action="gpu_reset")
    again = _nvml("GPU-b", "xid", T0 + timedelta(seconds=1), code=62, recovery_action="gpu_reset")
    assert len(_fold(nvml, again)) == 1


def test_it_sends_an_nvlink5_xid_with_its_decode_as_detail_and_recovery_action() -> None:
    sent = _fold(_kernel("nvlink5.kmsg", "NVRM: Xid (PCI:0018:01:00): 149", T0))
    (rec,) = sent
    assert (rec["gpu"], rec["code"], rec["recovery_action"]) == ("GPU-c", 149, "gpu_reset")
    assert rec["detail"].startswith("NVLink5 NETIR_LINK_EVT link fatal on link 9")


def test_it_sends_an_xid_without_a_decode_with_the_catalogs_detail_and_no_action() -> None:
    (rec,) = _fold(kmsg.KernelEvent("xid", T0, device="0000:3b:00", code=13))
    assert "recovery_action" not in rec and rec["detail"].startswith("ROBUST_CHANNEL_GR_EXCEPTION")
