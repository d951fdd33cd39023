from __future__ import annotations

import ctypes.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agents import xid
from agents.fake_nvml import FakeNvml, fake_uuid, parse_scripts
from agents.nvml import NO_DRIVER_MESSAGE, NvmlBackend, decode_throttle_reasons

from .conftest import validate

ROOT = Path(__file__).resolve().parents[2]


def test_it_gives_each_fake_gpu_a_stable_uuid_from_node_and_index() -> None:
    first = FakeNvml("node-017", 4)
    again = FakeNvml("node-017", 4)
    other = FakeNvml("node-018", 4)
    uuids = [first.uuid(i) for i in range(4)]
    assert uuids == [again.uuid(i) for i in range(4)]
    assert len(set(uuids)) == 4
    assert set(uuids).isdisjoint(other.uuid(i) for i in range(4))
    assert uuids[2] == fake_uuid("node-017", 2)


def test_it_samples_every_gpu_with_records_valid_under_contract_v1() -> None:
    gpus = FakeNvml("n1", 8)
    batch = validate([gpus.sample(i) for i in range(8)])
    assert [r.index for r in batch.records] == list(range(8))
    assert all(r.temp_c is not None and r.ecc_dbe == 0 for r in batch.records)


def test_it_delivers_a_scripted_xid79_immediately_and_then_reports_fields_missing() -> None:
    gpus = FakeNvml("n1", 2)
    events: list[dict[str, Any]] = []
    gpus.start_events(events.append)
    gpus.script(1, "xid79")
    assert [(e["event"], e.get("code")) for e in events] == [("xid", 79), ("gpu_lost", None)]
    lost = gpus.sample(1)
    assert "temp_c" not in lost and "power_w" not in lost  # missing, never 0
    validate([*events, lost])


def test_it_queues_events_scripted_before_the_event_sink_starts() -> None:
    gpus = FakeNvml("n1", 1, scripts={0: ["dbe"]})
    events: list[dict[str, Any]] = []
    gpus.start_events(events.append)
    assert {e["event"] for e in events} == {"xid", "ecc_dbe"}
    assert gpus.sample(0)["ecc_dbe"] == 1


def test_it_ramps_temperature_until_thermal_throttling_starts() -> None:
    gpus = FakeNvml("n1", 1)
    gpus.script(0, "temp_ramp", rate=10.0, to=95.0)
    samples = [gpus.sample(0) for _ in range(6)]
    temps = [s["temp_c"] for s in samples]
    assert temps[-1] > temps[0] + 30
    assert "sw_thermal_slowdown" in samples[-1]["throttle_reasons"]
    assert samples[-1]["sm_clock_mhz"] < samples[0]["sm_clock_mhz"]


def test_it_lowers_clocks_without_a_throttle_reason_for_slow_clocks() -> None:
    gpus = FakeNvml("n1", 2)
    gpus.script(1, "slow_clocks", factor=0.5)
    slow, normal = gpus.sample(1), gpus.sample(0)
    assert slow["sm_clock_mhz"] == normal["sm_clock_mhz"] // 2
    assert slow["throttle_reasons"] == []


def test_it_rejects_an_unknown_fake_script() -> None:
    try:
        parse_scripts(["0:melt"])
    except ValueError as exc:
        assert "0:melt" in str(exc)
    else:
        raise AssertionError("unknown script accepted")


def test_it_decodes_throttle_reason_bits_to_names() -> None:
    assert decode_throttle_reasons(0x4 | 0x40) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert decode_throttle_reasons(0x1000) == ["bit_0x1000"]
    assert decode_throttle_reasons(0) == []


def test_it_labels_an_xid_event_with_the_catalogs_mnemonic_class_and_bucket() -> None:
    assert xid.detail(79).startswith("ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS:")
    assert "hardware; RESTART_BM" in xid.detail(79)
    assert "application; RESTART_APP" in xid.detail(13)
    assert len(xid.detail(31337)) <= 256 and "undetermined" in xid.detail(31337)


def test_it_scripts_a_recovery_action_and_emits_the_drivers_xid_154() -> None:
    gpus = FakeNvml("n1", 2)
    events: list[dict[str, Any]] = []
    gpus.start_events(events.append)
    gpus.script(1, "xid", code=62, recovery_action="gpu_reset")
    assert [(e["code"], e["recovery_action"]) for e in events] == [
        (62, "gpu_reset"),
        (154, "gpu_reset"),
    ]
    assert (gpus.recovery_action(1), gpus.recovery_action(0)) == ("gpu_reset", "none")
    validate(events)
    gpus.script(1, "clear")
    assert gpus.recovery_action(1) == "none"
    with pytest.raises(ValueError, match="recovery_action"):
        gpus.script(0, "xid", code=62, recovery_action="reboot_please")


@pytest.mark.parametrize(
    ("surface", "expected"),
    [
        ({"nvmlDeviceGetGpuRecoveryAction": lambda h: 2}, "node_reboot"),
        (
            {
                "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION": 230,
                "nvmlDeviceGetFieldValues": lambda h, ids: [
                    SimpleNamespace(nvmlReturn=0, value=SimpleNamespace(uiVal=4))
                ],
            },
            "drain_and_reset",
        ),
        (
            {
                "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION": 230,
                "nvmlDeviceGetFieldValues": lambda h, ids: [
                    SimpleNamespace(nvmlReturn=3, value=SimpleNamespace(uiVal=0))
                ],
            },
            None,
        ),
        ({}, None),  # an old driver/binding: absent symbol, no field id
        ({"nvmlDeviceGetGpuRecoveryAction": lambda h: 99}, None),  # a value we do not know
    ],
)
def test_it_reads_the_gpu_recovery_action_where_the_driver_has_it(surface, expected) -> None:
    backend = NvmlBackend(_fake_pynvml(**surface))
    assert backend.recovery_action(0) == expected


class _NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


def _fake_pynvml(**overrides: Any) -> SimpleNamespace:
    """Just enough of the pynvml module surface for NvmlBackend, one GPU."""

    def fail(code: int = 3) -> Any:
        def raise_(*_: Any) -> Any:
            raise _NVMLError(code)

        return raise_

    mod = SimpleNamespace(
        NVMLError=_NVMLError,
        NVML_ERROR_GPU_IS_LOST=15,
        NVML_ERROR_TIMEOUT=10,
        NVML_TEMPERATURE_GPU=0,
        NVML_CLOCK_SM=1,
        NVML_CLOCK_MEM=2,
        NVML_MEMORY_ERROR_TYPE_CORRECTED=0,
        NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1,
        NVML_VOLATILE_ECC=0,
        NVML_NVLINK_MAX_LINKS=2,
        NVML_NVLINK_ERROR_DL_REPLAY=0,
        NVML_NVLINK_ERROR_DL_RECOVERY=1,
        NVML_NVLINK_ERROR_DL_CRC_FLIT=2,
        NVML_NVLINK_ERROR_DL_CRC_DATA=3,
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: f"h{i}",
        nvmlDeviceGetUUID=lambda h: b"GPU-real-0",
        nvmlDeviceGetNvLinkState=lambda h, link: 1,
        nvmlDeviceGetNvLinkErrorCounter=lambda h, link, c: 2,
        nvmlDeviceGetTemperatureV=fail(),
        nvmlDeviceGetTemperature=lambda h, s: 71,
        nvmlDeviceGetPowerUsage=lambda h: 512_000,
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=88, memory=37),
        nvmlDeviceGetName=lambda h: b"NVIDIA H100 80GB HBM3",
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(used=1024),
        nvmlDeviceGetTotalEccErrors=fail(),  # ECC not supported on this card
        nvmlDeviceGetClockInfo=lambda h, c: 1400 if c == 1 else 2600,
        nvmlDeviceGetPcieReplayCounter=lambda h: 3,
        nvmlDeviceGetRemappedRows=fail(),
        nvmlDeviceGetRetiredPagesPendingStatus=lambda h: 1,
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: 0x4,
        nvmlSystemGetDriverVersion=lambda: "560.35.03",
        nvmlShutdown=lambda: None,
    )
    for key, value in overrides.items():
        setattr(mod, key, value)
    return mod


def test_it_reports_a_failing_nvml_field_as_missing_and_keeps_the_others() -> None:
    backend = NvmlBackend(_fake_pynvml())
    sample = backend.sample(0)
    assert "ecc_sbe" not in sample and "ecc_dbe" not in sample  # missing, not 0
    assert sample["temp_c"] == 71.0  # nvmlDeviceGetTemperatureV failed: fallback used
    assert sample["power_w"] == 512.0
    assert sample["retired_or_remapped_pending"] == 1
    assert sample["throttle_reasons"] == ["sw_power_cap"]
    assert sample["nvlink_errors"] == 2 * 4 * 2  # 2 links x 4 counters x 2 errors
    validate([sample])


def test_it_reports_the_device_name_and_memory_utilisation() -> None:
    sample = NvmlBackend(_fake_pynvml()).sample(0)
    assert sample["name"] == "NVIDIA H100 80GB HBM3"  # the key of the peak FLOPs
    assert sample["mem_util_pct"] == 37.0  # NVML's percentage, never bytes/s
    validate([sample])


def _refused(*_: Any) -> Any:
    raise _NVMLError(3)  # NVML_ERROR_NOT_SUPPORTED


@pytest.mark.parametrize(
    ("surface", "missing"),
    [
        ({"nvmlDeviceGetName": _refused}, "name"),
        ({"nvmlDeviceGetUtilizationRates": lambda h: SimpleNamespace(gpu=88)}, "mem_util_pct"),
    ],
)
def test_it_leaves_out_a_name_or_memory_utilisation_nvml_cannot_give(surface, missing) -> None:
    sample = NvmlBackend(_fake_pynvml(**surface)).sample(0)
    assert missing not in sample  # absent, never an empty name or a zero
    assert sample["power_w"] == 512.0  # the rest of the sample stands
    validate([sample])


def test_it_emits_gpu_lost_once_when_nvml_says_the_gpu_is_lost() -> None:
    def lost(*_: Any) -> Any:
        raise _NVMLError(15)

    backend = NvmlBackend(
        _fake_pynvml(nvmlDeviceGetPowerUsage=lost, nvmlDeviceGetPcieReplayCounter=lost)
    )
    events: list[dict[str, Any]] = []
    backend._sink = events.append  # the event thread is not needed for this path
    backend.sample(0)
    backend.sample(0)
    assert [e["event"] for e in events] == ["gpu_lost"]


@pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None, reason="this machine has an NVIDIA driver"
)
def test_it_prints_the_no_driver_line_once_and_keeps_running(short_dir: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LD_LIBRARY_PATH": str(short_dir)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agents.cli",
            "run",
            "--dry-run",
            "--interval",
            "0.2",
            "--state-dir",
            str(short_dir / "state"),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(2.0)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    lines = out.splitlines()
    assert lines.count(NO_DRIVER_MESSAGE) == 1
    assert sum('"kind":"heartbeat"' in line for line in lines) >= 3  # kept running


def test_it_delivers_xid_events_from_the_nvml_event_thread_at_once() -> None:
    import ctypes
    import threading

    handles = [ctypes.c_void_p(0x1000), ctypes.c_void_p(0x2000)]
    pending = [SimpleNamespace(device=ctypes.c_void_p(0x2000), eventType=0x8, eventData=79)]
    read_for: list[Any] = []

    def wait(event_set: Any, timeout_ms: int) -> Any:
        if pending:
            return pending.pop()
        time.sleep(timeout_ms / 1000 / 10)
        raise _NVMLError(10)  # NVML_ERROR_TIMEOUT

    backend = NvmlBackend(
        _fake_pynvml(
            nvmlDeviceGetCount=lambda: 2,
            nvmlDeviceGetHandleByIndex=lambda i: handles[i],
            nvmlDeviceGetUUID=lambda h: f"GPU-{h.value:x}",
            nvmlEventTypeXidCriticalError=0x8,
            nvmlEventTypeDoubleBitEccError=0x2,
            nvmlEventSetCreate=lambda: "set",
            nvmlDeviceGetSupportedEventTypes=lambda h: 0xFF,
            nvmlDeviceRegisterEvents=lambda h, types, s: None,
            nvmlEventSetWait=wait,
            nvmlEventSetFree=lambda s: None,
            nvmlDeviceGetGpuRecoveryAction=lambda h: read_for.append(h) or 1,
        )
    )
    arrived = threading.Event()
    events: list[dict[str, Any]] = []

    def sink(event: dict[str, Any]) -> None:
        events.append(event)
        arrived.set()

    backend.start_events(sink)
    assert arrived.wait(2.0)
    backend.close()
    assert [(e["gpu"], e["event"], e["code"]) for e in events] == [("GPU-2000", "xid", 79)]
    assert "fallen off the bus" in events[0]["detail"]
    assert events[0]["recovery_action"] == "gpu_reset"  # read for the GPU the event named
    assert read_for == [handles[1]]
    validate(events)


def test_it_scripts_climbing_nvlink_errors_that_a_clear_repairs() -> None:
    gpus = FakeNvml("n1", 2)
    gpus.script(1, "nvlink_errors")
    gpus.script(1, "nvlink_errors", count=5)
    assert gpus.sample(1)["nvlink_errors"] == 55
    assert gpus.sample(0)["nvlink_errors"] == 0
    validate([gpus.sample(1)])
    gpus.script(1, "clear")
    assert gpus.sample(1)["nvlink_errors"] == 0
