"""A scriptable stand-in for NVML with the same interface as `nvml.NvmlBackend`.

Owns deterministic fake GPUs for tests, demos and benchmarks: N devices with UUIDs derived
from node name + index (stable across restarts), and fault scripts that can be set at
construction or at run time. Scripted events are delivered to the sink immediately, the
way NVML's event thread would. It must never pretend to be real hardware in production:
the agent only uses it when asked (`--fake-gpus N`).

Runtime control (demos and drills): when `FAULTLINE_FAKE_NVML_CONTROL_DIR` is set, the
fake GPUs of node N read new lines appended to `<dir>/<N>` once per sampling round, each
`<gpu>:<script>` as on the command line ("3:xid79", "3:clear"). Bad lines are skipped.
`script(i, "xid", code=62, recovery_action="gpu_reset")` also sets the GPU's recovery
action and, when it changed, emits the Xid 154 the driver would.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import uuid as uuidlib
from dataclasses import dataclass, field
from typing import Any

from agents import vocab, xid
from agents.nvml import EventSink, device_event, device_sample
from agents.wire import Record

log = logging.getLogger("faultline.agent.fake_nvml")
CONTROL_ENV = "FAULTLINE_FAKE_NVML_CONTROL_DIR"
SCRIPTS = (
    "temp_ramp",
    "thermal_throttle",
    "power_throttle",
    vocab.XID,
    "xid79",
    "dbe",
    vocab.GPU_LOST,
    vocab.ROW_REMAP_FAILURE,
    "slow_clocks",
    "nvlink_errors",
    "clear",
)
# What the fake GPUs call themselves: a name of its own (never a real device's), which the
# peak table (agents/flops.py) gives the H100 SXM's figure so demos show MFU.
FAKE_NAME = "Faultline Fake H100 80GB HBM3"
_NAMESPACE = uuidlib.UUID("6f1d4c1e-3b7a-4f5e-9a51-2c0b8e3d7a10")


def fake_uuid(node: str, index: int) -> str:
    """`GPU-<uuid5>` from node and index: the same fake GPU keeps its id across restarts."""
    return f"GPU-{uuidlib.uuid5(_NAMESPACE, f'{node}/{index}')}"


def fake_pci(index: int) -> str:
    """Fake GPU `index`'s PCI address (domain:bus:device): 0000:18:00, 0000:28:00, ..."""
    return f"0000:{(0x18 + 0x10 * index) % 0x100:02x}:{(0x10 * index) // 0xE8:02x}"


@dataclass
class _Gpu:
    uuid: str
    temp_c: float = 45.0
    power_w: float = 350.0
    sm_clock_mhz: float = 1980.0
    mem_clock_mhz: float = 2619.0
    util_pct: float = 97.0
    mem_util_pct: float = 41.0
    mem_used_bytes: int = 60 * 1024**3
    ecc_sbe: int = 0
    ecc_dbe: int = 0
    pending: int = 0
    nvlink_errors: int = 0
    pcie_replays: int = 0
    lost: bool = False
    throttle: list[str] = field(default_factory=list)
    ramp: float = 0.0  # degrees per sample while a temp_ramp runs
    ramp_to: float = 95.0
    clock_factor: float = 1.0
    recovery_action: str = xid.RECOVERY_NONE


class FakeNvml:
    """Fake GPUs. `script(index, name, **params)` changes one GPU's behaviour now."""

    name = "fake"

    def __init__(
        self,
        node: str,
        count: int,
        *,
        scripts: dict[int, list[str]] | None = None,
        seed: int = 0,
        driver: str = "fake-560.35.03",
        control: str | os.PathLike[str] | None = None,
    ) -> None:
        self._driver = driver
        control_dir = os.environ.get(CONTROL_ENV)
        if control is None and control_dir:
            control = os.path.join(control_dir, node)
        self._control = None if control is None else os.fspath(control)
        self._control_offset = 0
        self._gpus = [_Gpu(fake_uuid(node, i)) for i in range(count)]
        self._rng = random.Random(seed)
        self._sink: EventSink | None = None
        self._pending_events: list[Record] = []
        self._lock = threading.Lock()
        for index, names in (scripts or {}).items():
            for name in names:
                self.script(index, name)

    def driver_version(self) -> str | None:
        return self._driver

    def device_count(self) -> int:
        return len(self._gpus)

    def uuid(self, index: int) -> str:
        return self._gpus[index].uuid

    def pci_bus_id(self, index: int) -> str:
        return fake_pci(index)

    def start_events(self, sink: EventSink) -> None:
        with self._lock:
            self._sink = sink
            queued, self._pending_events = self._pending_events, []
        for event in queued:
            sink(event)

    def close(self) -> None:
        self._sink = None

    def _emit(self, event: Record) -> None:
        with self._lock:
            sink = self._sink
            if sink is None:
                self._pending_events.append(event)
                return
        sink(event)

    def script(self, index: int, name: str, **params: Any) -> None:
        """Apply a fault script to GPU `index`. Events it implies are emitted right away."""
        gpu = self._gpus[index]
        if name == "temp_ramp":
            gpu.ramp = float(params.get("rate", 2.0))
            gpu.ramp_to = float(params.get("to", 95.0))
        elif name == "thermal_throttle":
            gpu.temp_c = float(params.get("temp_c", 92.0))
            gpu.throttle = ["sw_thermal_slowdown", "hw_thermal_slowdown"]
            gpu.clock_factor = float(params.get("factor", 0.5))
            self._emit(device_event(gpu.uuid, "thermal", None, "thermal slowdown active"))
        elif name == "power_throttle":
            gpu.power_w = float(params.get("power_w", 700.0))
            gpu.throttle = ["sw_power_cap"]
            gpu.clock_factor = float(params.get("factor", 0.7))
        elif name in ("xid", "xid79"):
            code = int(params.get("code", 79 if name == "xid79" else 13))
            action = params.get("recovery_action")
            if action is not None and action not in xid.RECOVERY_ACTIONS:
                raise ValueError(f"recovery_action {action!r}: one of {list(xid.RECOVERY_ACTIONS)}")
            changed = action is not None and action != gpu.recovery_action
            gpu.recovery_action = action or gpu.recovery_action
            self._emit(device_event(gpu.uuid, "xid", code, xid.detail(code), gpu.recovery_action))
            if changed and code != 154:
                self._emit(device_event(gpu.uuid, "xid", 154, xid.detail(154), gpu.recovery_action))
            if code == 79:
                self._lose(gpu, "Xid 79: fallen off the bus")
        elif name == "dbe":
            gpu.ecc_dbe += 1
            gpu.pending += 1
            self._emit(device_event(gpu.uuid, "xid", 48, xid.detail(48)))
            self._emit(device_event(gpu.uuid, "ecc_dbe", 48, "double-bit ECC error"))
        elif name == "gpu_lost":
            self._lose(gpu, "GPU is lost (NVML_ERROR_GPU_IS_LOST)")
        elif name == "row_remap_failure":
            self._emit(device_event(gpu.uuid, "row_remap_failure", None, "row remapping failed"))
        elif name == "slow_clocks":
            # No throttle reason on purpose: a straggler the hardware does not explain.
            gpu.clock_factor = float(params.get("factor", 0.5))
        elif name == "nvlink_errors":
            # A degraded intra-node link: the NVLink error counters climb (cumulative).
            gpu.nvlink_errors += int(params.get("count", 50))
        elif name == "clear":
            gpu.throttle, gpu.clock_factor, gpu.ramp, gpu.lost = [], 1.0, 0.0, False
            gpu.temp_c, gpu.power_w = 45.0, 350.0
            gpu.nvlink_errors = 0  # a repaired link (the fake's counters start over)
            gpu.recovery_action = xid.RECOVERY_NONE
        else:
            raise ValueError(f"unknown fake NVML script {name!r}; known: {', '.join(SCRIPTS)}")

    def _lose(self, gpu: _Gpu, why: str) -> None:
        if not gpu.lost:
            gpu.lost = True
            self._emit(device_event(gpu.uuid, "gpu_lost", None, why))

    def poll_control(self) -> int:
        """Apply lines appended to the control file since the last poll; returns how many."""
        if self._control is None:
            return 0
        try:
            with open(self._control, "rb") as fh:
                fh.seek(self._control_offset)
                data = fh.read()
        except OSError:
            return 0  # no file yet: nothing scripted
        # Only whole lines: a writer may be mid-line; the rest is read next round.
        complete = data[: data.rfind(b"\n") + 1]
        self._control_offset += len(complete)
        applied = 0
        for line in complete.decode(errors="replace").splitlines():
            spec = line.strip()
            if not spec:
                continue
            try:
                for index, names in parse_scripts([spec]).items():
                    if index >= len(self._gpus):
                        raise ValueError(f"gpu {index} out of range (have {len(self._gpus)})")
                    for name in names:
                        self.script(index, name)
                        applied += 1
            except ValueError as exc:
                log.warning("fake NVML control %s: skipping %r (%s)", self._control, spec, exc)
        return applied

    def recovery_action(self, index: int) -> str | None:
        """The scripted recovery action, as `NvmlBackend.recovery_action` reads the driver's."""
        return self._gpus[index].recovery_action

    def sample(self, index: int) -> Record:
        if index == 0:
            self.poll_control()  # once per sampling round: the agent samples GPU 0 first
        gpu = self._gpus[index]
        if gpu.lost:
            # Every NVML query fails on a lost GPU: all fields missing, never zero.
            return device_sample(gpu.uuid, index, {})
        if gpu.ramp:
            gpu.temp_c = min(gpu.ramp_to, gpu.temp_c + gpu.ramp)
            if gpu.temp_c >= 87.0 and "sw_thermal_slowdown" not in gpu.throttle:
                gpu.throttle = [*gpu.throttle, "sw_thermal_slowdown"]
                gpu.clock_factor = min(gpu.clock_factor, 0.6)
        jitter = self._rng.uniform(-0.5, 0.5)
        return device_sample(
            gpu.uuid,
            index,
            {
                "temp_c": round(gpu.temp_c + jitter, 1),
                "power_w": round(gpu.power_w * (1 + jitter / 100), 1),
                "sm_clock_mhz": round(gpu.sm_clock_mhz * gpu.clock_factor),
                "mem_clock_mhz": gpu.mem_clock_mhz,
                "util_pct": gpu.util_pct,
                "mem_util_pct": gpu.mem_util_pct,
                "name": FAKE_NAME,
                "mem_used_bytes": gpu.mem_used_bytes,
                "ecc_sbe": gpu.ecc_sbe,
                "ecc_dbe": gpu.ecc_dbe,
                "retired_or_remapped_pending": gpu.pending,
                "throttle_reasons": list(gpu.throttle),
                "nvlink_errors": gpu.nvlink_errors,
                "pcie_replays": gpu.pcie_replays,
            },
        )


def parse_scripts(specs: list[str]) -> dict[int, list[str]]:
    """`["0:temp_ramp", "3:xid79"]` -> {0: ["temp_ramp"], 3: ["xid79"]} (CLI/TOML form)."""
    out: dict[int, list[str]] = {}
    for spec in specs:
        index, _, name = spec.partition(":")
        if not index.isdigit() or name not in SCRIPTS:
            raise ValueError(f"fake script {spec!r} must look like '<gpu>:<{'|'.join(SCRIPTS)}>'")
        out.setdefault(int(index), []).append(name)
    return out
