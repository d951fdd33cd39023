"""GPU collection over NVML (module `pynvml` from the nvidia-ml-py package).

Owns the backend interface the agent samples through, the real NVML backend and the Xid/ECC
event thread (throttle reason names are `agents.gpu_health`'s). `pynvml` is imported lazily
inside `load_backend` so the agent runs (without GPU collection) on a node with no driver.
A field that NVML cannot read is reported missing (None), never 0: a zero temperature or
ECC count would be a lie the console would reason from.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import sys
import threading
from collections.abc import Callable
from typing import IO, Any, Protocol

from agents import xid
from agents.gpu_health import decode_throttle_reasons as decode_throttle_reasons
from agents.wire import Record, record

log = logging.getLogger("faultline.agent.nvml")

NO_DRIVER_MESSAGE = "NVML library not found: running without GPU collection"

EventSink = Callable[[Record], None]


# A device_event the agent sends when NVML's remapped rows report a failure.
REMAP_FAILURE = "row_remap_failure"


def device_sample(uuid: str, index: int, fields: dict[str, Any]) -> Record:
    """A `device_sample` record; missing fields stay None and are omitted on the wire."""
    return record(
        "device_sample",
        gpu=uuid,
        index=index,
        throttle_reasons=list(fields.get("throttle_reasons") or []),
        **{k: v for k, v in fields.items() if k != "throttle_reasons"},
    )


def device_event(
    uuid: str,
    event: str,
    code: int | None = None,
    detail: str | None = None,
    recovery_action: str | None = None,
) -> Record:
    """A `device_event`; `recovery_action` is the driver's (agents/xid.RECOVERY_ACTIONS)."""
    return record(
        "device_event",
        gpu=uuid,
        event=event,
        code=code,
        detail=(detail or None) and detail[:256],
        recovery_action=recovery_action,
    )


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


class GpuBackend(Protocol):
    """What the agent needs from a GPU source; NvmlBackend and FakeNvml both provide it."""

    name: str

    def driver_version(self) -> str | None: ...

    def device_count(self) -> int: ...

    def uuid(self, index: int) -> str: ...

    def sample(self, index: int) -> Record: ...

    def start_events(self, sink: EventSink) -> None: ...

    def close(self) -> None: ...


def load_backend(out: IO[str] | None = None) -> NvmlBackend | None:
    """The real backend, or None after printing one line when there is no NVML to talk to."""
    stream = out or sys.stdout
    try:
        import pynvml
    except ImportError:
        print(NO_DRIVER_MESSAGE, file=stream, flush=True)
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        if getattr(exc, "value", None) == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
            print(NO_DRIVER_MESSAGE, file=stream, flush=True)
        else:
            print(
                f"NVML init failed ({exc}): running without GPU collection", file=stream, flush=True
            )
        return None
    return NvmlBackend(pynvml)


class NvmlBackend:
    """Real NVML. Every field read is wrapped on its own: one unsupported query (ECC on a
    consumer card, NVLink on PCIe parts) must not blank the whole sample."""

    name = "nvml"

    def __init__(self, pynvml: Any) -> None:
        self._nv = pynvml
        self._handles = [
            pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())
        ]
        self._uuids = [self._text(pynvml.nvmlDeviceGetUUID(h)) for h in self._handles]
        self._names = [self._device_name(h) for h in self._handles]  # fixed for a device
        self._links = [self._active_links(h) for h in self._handles]
        self._lost: set[int] = set()
        self._remap_failed: set[int] = set()
        self._sink: EventSink | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @staticmethod
    def _text(value: Any) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    def _device_name(self, handle: Any) -> str | None:
        """NVML's name of the device ("NVIDIA H100 80GB HBM3"): the key of its peak FLOPs."""
        read = getattr(self._nv, "nvmlDeviceGetName", None)
        try:
            return None if read is None else self._text(read(handle))[:96] or None
        except self._nv.NVMLError:
            return None

    def driver_version(self) -> str | None:
        try:
            return self._text(self._nv.nvmlSystemGetDriverVersion())
        except self._nv.NVMLError:
            return None

    def device_count(self) -> int:
        return len(self._handles)

    def uuid(self, index: int) -> str:
        return self._uuids[index]

    def pci_bus_id(self, index: int) -> str | None:
        """`00000000:3B:00.0` as NVML reports it; the kernel log names GPUs by it."""
        try:
            return self._text(self._nv.nvmlDeviceGetPciInfo(self._handles[index]).busId)
        except (self._nv.NVMLError, AttributeError, OSError):
            return None

    def _active_links(self, handle: Any) -> list[int]:
        links = []
        for link in range(getattr(self._nv, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                if self._nv.nvmlDeviceGetNvLinkState(handle, link):
                    links.append(link)
            except self._nv.NVMLError:
                continue
        return links

    def _read(self, index: int, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except self._nv.NVMLError as exc:
            if getattr(exc, "value", None) == self._nv.NVML_ERROR_GPU_IS_LOST:
                self._gpu_lost(index, str(exc))
            return None
        except (OSError, ValueError, TypeError, AttributeError):
            return None

    def _gpu_lost(self, index: int, why: str) -> None:
        if index in self._lost:
            return
        self._lost.add(index)
        if self._sink is not None:
            self._sink(device_event(self._uuids[index], "gpu_lost", None, why))

    def _temperature(self, index: int, h: Any) -> float | None:
        nv = self._nv
        if hasattr(nv, "nvmlDeviceGetTemperatureV"):
            value = self._read(index, nv.nvmlDeviceGetTemperatureV, h, nv.NVML_TEMPERATURE_GPU)
            if value is not None:
                return float(value)
        value = self._read(index, nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
        return None if value is None else float(value)

    def _pending(self, index: int, h: Any) -> int | None:
        nv = self._nv
        rows = self._read(index, nv.nvmlDeviceGetRemappedRows, h)
        if rows is not None:
            # (corrected, uncorrected, pending, failure): a failed remap means the GPU ran
            # out of spare rows; said once, as an event (it latches until repaired).
            if rows[3] and index not in self._remap_failed and self._sink is not None:
                self._remap_failed.add(index)
                self._sink(
                    device_event(self._uuids[index], REMAP_FAILURE, None, "row remapping failed")
                )
            return int(rows[2])
        pages = self._read(index, nv.nvmlDeviceGetRetiredPagesPendingStatus, h)
        return None if pages is None else int(pages)

    def _throttle(self, index: int, h: Any) -> list[str]:
        nv = self._nv
        fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
        fn = fn or nv.nvmlDeviceGetCurrentClocksThrottleReasons  # drivers before 535
        mask = self._read(index, fn, h)
        return [] if mask is None else decode_throttle_reasons(int(mask))

    def _nvlink_errors(self, index: int, h: Any) -> int | None:
        nv = self._nv
        if not self._links[index]:
            return None
        total, seen = 0, False
        counters = (
            nv.NVML_NVLINK_ERROR_DL_REPLAY,
            nv.NVML_NVLINK_ERROR_DL_RECOVERY,
            nv.NVML_NVLINK_ERROR_DL_CRC_FLIT,
            nv.NVML_NVLINK_ERROR_DL_CRC_DATA,
        )
        for link in self._links[index]:
            for counter in counters:
                value = self._read(index, nv.nvmlDeviceGetNvLinkErrorCounter, h, link, counter)
                if value is not None:
                    total += int(value)
                    seen = True
        return total if seen else None

    def recovery_action(self, index: int) -> str | None:
        """The driver's GPU recovery action (none, gpu_reset, ...), or None where the driver
        or pynvml cannot say: nvmlDeviceGetGpuRecoveryAction where the binding has it, else
        the NVML_FI_DEV_GET_GPU_RECOVERY_ACTION field (R570 and newer drivers)."""
        nv, h = self._nv, self._handles[index]
        fn = getattr(nv, "nvmlDeviceGetGpuRecoveryAction", None)
        if fn is not None:
            value = self._read(index, fn, h)
            if value is not None:
                return xid.recovery_action_name(int(value))
        field_id = getattr(nv, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
        if field_id is None:
            return None
        values = self._read(index, nv.nvmlDeviceGetFieldValues, h, [field_id])
        if not values or getattr(values[0], "nvmlReturn", 0) != 0:
            return None
        try:
            return xid.recovery_action_name(int(values[0].value.uiVal))
        except (AttributeError, TypeError, ValueError):
            return None

    def sample(self, index: int) -> Record:
        nv, h = self._nv, self._handles[index]
        power = self._read(index, nv.nvmlDeviceGetPowerUsage, h)
        util = self._read(index, nv.nvmlDeviceGetUtilizationRates, h)
        mem = self._read(index, nv.nvmlDeviceGetMemoryInfo, h)
        sbe = self._read(
            index,
            nv.nvmlDeviceGetTotalEccErrors,
            h,
            nv.NVML_MEMORY_ERROR_TYPE_CORRECTED,
            nv.NVML_VOLATILE_ECC,
        )
        dbe = self._read(
            index,
            nv.nvmlDeviceGetTotalEccErrors,
            h,
            nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nv.NVML_VOLATILE_ECC,
        )
        sm = self._read(index, nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
        memclk = self._read(index, nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM)
        replays = self._read(index, nv.nvmlDeviceGetPcieReplayCounter, h)
        fields = {
            "temp_c": self._temperature(index, h),
            "power_w": None if power is None else power / 1000.0,  # NVML reports mW
            "sm_clock_mhz": None if sm is None else float(sm),
            "mem_clock_mhz": None if memclk is None else float(memclk),
            "util_pct": None if util is None else float(util.gpu),
            # The share of the period device memory was busy: a percentage, not bytes/s.
            "mem_util_pct": _float(getattr(util, "memory", None)),
            "name": self._names[index],
            "mem_used_bytes": None if mem is None else int(mem.used),
            "ecc_sbe": None if sbe is None else int(sbe),
            "ecc_dbe": None if dbe is None else int(dbe),
            "retired_or_remapped_pending": self._pending(index, h),
            "throttle_reasons": self._throttle(index, h),
            "nvlink_errors": self._nvlink_errors(index, h),
            "pcie_replays": None if replays is None else int(replays),
        }
        return device_sample(self._uuids[index], index, fields)

    def start_events(self, sink: EventSink) -> None:
        """Register Xid and DBE events on every GPU and deliver them from a waiting thread."""
        self._sink = sink
        nv = self._nv
        wanted = nv.nvmlEventTypeXidCriticalError | nv.nvmlEventTypeDoubleBitEccError
        try:
            event_set = nv.nvmlEventSetCreate()
        except nv.NVMLError as exc:
            log.warning("NVML events unavailable (%s): Xids come only from samples", exc)
            return
        registered = 0
        for i, h in enumerate(self._handles):
            try:
                supported = nv.nvmlDeviceGetSupportedEventTypes(h)
                nv.nvmlDeviceRegisterEvents(h, wanted & supported, event_set)
                registered += 1
            except nv.NVMLError as exc:
                log.warning("GPU %d: cannot register NVML events (%s)", i, exc)
        if not registered:
            return
        self._thread = threading.Thread(
            target=self._wait_events, args=(event_set,), name="nvml-events", daemon=True
        )
        self._thread.start()

    def _index_of(self, device: Any) -> int | None:
        target = ctypes.cast(device, ctypes.c_void_p).value
        for i, h in enumerate(self._handles):
            if ctypes.cast(h, ctypes.c_void_p).value == target:
                return i
        return None

    def _wait_events(self, event_set: Any) -> None:
        nv = self._nv
        while not self._stop.is_set():
            try:
                data = nv.nvmlEventSetWait(event_set, 500)
            except nv.NVMLError as exc:
                if getattr(exc, "value", None) == nv.NVML_ERROR_TIMEOUT:
                    continue
                log.warning("NVML event wait failed (%s); retrying", exc)
                self._stop.wait(1.0)
                continue
            index = self._index_of(data.device)
            uuid = self._uuids[index] if index is not None else "unknown"
            sink = self._sink
            if sink is None:
                continue
            # NVML reports a DBE both as Xid 48 and as a DBE event: pass each through once.
            if data.eventType & nv.nvmlEventTypeXidCriticalError:
                code = int(data.eventData)
                # Read at once: Xid 154 means the recovery action just changed.
                action = None if index is None else self.recovery_action(index)
                sink(device_event(uuid, "xid", code, xid.detail(code), action))
            if data.eventType & nv.nvmlEventTypeDoubleBitEccError:
                sink(device_event(uuid, "ecc_dbe", None, "double-bit ECC error"))
        with contextlib.suppress(nv.NVMLError):
            nv.nvmlEventSetFree(event_set)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        with contextlib.suppress(self._nv.NVMLError):
            self._nv.nvmlShutdown()
