"""Folds the kernel log into the agent's records: one Xid event per sighting pair, short host
events, I/O error counts per block device.

Owns the translation of `kmsg.KernelEvent`s into `device_event` (an NVRM Xid or a GPU
fallen off the bus, mapped from its PCI address to the GPU's UUID) and `host_event`
records, and the one `xid.XidDeduper` both the kernel log and NVML pass through: an Xid
seen in both is sent once. Standard library only; it must not read files or sockets.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from agents import kmsg, xid
from agents.nvml import device_event
from agents.wire import Record, iso_ts, record

# Identical host events (same code, device and pid) within this window are one: the
# kernel prints a machine check as several lines, a hung task every timeout.
HOST_DEDUP_S = 5.0


def _when(ts: Any) -> datetime:
    if isinstance(ts, datetime):
        return ts
    return datetime.fromisoformat(str(ts).replace("Z", "+00:00"))


class Evidence:
    """The agent's one place where device and kernel events meet.

    `device_sink(rec)` wraps the GPU backend's event sink; `kernel_sink(event)` is the
    kernel log's. Both end in `emit` (the agent's enqueue) at most once per event.
    """

    def __init__(
        self,
        emit: Callable[[Record], None],
        *,
        pci_to_gpu: Callable[[], dict[str, str]] | None = None,
        window_s: float = xid.DEDUP_WINDOW_S,
    ) -> None:
        self.emit = emit
        self._pci_to_gpu = pci_to_gpu or dict
        self._map: dict[str, str] | None = None
        self.xids = xid.XidDeduper(window_s)
        self._host_seen: dict[tuple[str, str | None, int | None], datetime] = {}
        self.io_errors: dict[str, int] = {}
        self._lock = threading.Lock()

    def gpu_of(self, pci: str | None) -> str:
        """The GPU UUID at a PCI address, else `PCI:<address>` (the evidence is kept)."""
        if self._map is None:
            self._map = {kmsg.pci_key(k): v for k, v in self._pci_to_gpu().items()}
        return self._map.get(pci or "", f"PCI:{pci}")

    def device_sink(self, rec: Record) -> None:
        if rec.get("kind") == "device_event" and rec.get("event") == "xid":
            _, new = self.xids.admit(rec["gpu"], int(rec.get("code") or 0), _when(rec["ts"]),
                                     "nvml")  # fmt: skip
            if not new:
                return
        self.emit(rec)

    def kernel_sink(self, event: kmsg.KernelEvent) -> None:
        if event.event in (kmsg.XID, kmsg.GPU_OFF_BUS):
            # A GPU fallen off the bus is Xid 79, whichever line says it first.
            code = event.code if event.code is not None else 79
            gpu = self.gpu_of(event.device)
            _, new = self.xids.admit(gpu, code, event.ts, "kmsg")
            if new:
                rec = device_event(gpu, "xid", code, xid.detail(code))
                rec["ts"] = iso_ts(event.ts.timestamp())
                self.emit(rec)
            return
        key = (event.event, event.device, event.pid)
        with self._lock:
            if event.event == kmsg.IO_ERROR and event.device:
                self.io_errors[event.device] = self.io_errors.get(event.device, 0) + 1
            last = self._host_seen.get(key)
            if last is not None and abs((event.ts - last).total_seconds()) <= HOST_DEDUP_S:
                return
            self._host_seen[key] = event.ts
        self.emit(
            record(
                "host_event",
                ts=iso_ts(event.ts.astimezone(UTC).timestamp()),
                event=event.event,
                device=event.device,
                code=event.code,
                pid=event.pid,
                comm=event.comm,
                severity=event.severity,
            )
        )

    def io_errors_of(self, device: str) -> int:
        """Kernel I/O error lines for `device` or its partitions' disk (nvme1n1p1 -> nvme1n1)."""
        with self._lock:
            return sum(n for d, n in self.io_errors.items() if device.startswith(d) or
                       d.startswith(device))  # fmt: skip
