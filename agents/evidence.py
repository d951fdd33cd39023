"""Folds the kernel log into the agent's records: one Xid event per sighting pair, short host
events, I/O error counts per block device.

Owns the translation of `kmsg.KernelEvent`s into `device_event` (an NVRM Xid, or a GPU
fallen off the bus as `gpu_lost`, mapped from its PCI address to the GPU's UUID) and
`host_event` records, and the one `xid.XidDeduper` both the kernel log and NVML pass
through: an Xid (or a lost GPU) seen in both is sent once, unless the later witness adds
a recovery action the first did not carry. Standard library only; it must not read files
or sockets.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from agents import kmsg, vocab, xid
from agents.nvml import device_event
from agents.wire import Record, iso_ts, record

# Identical host events (same code, device and pid) within this window are one: the
# kernel prints a machine check as several lines, a hung task every timeout.
HOST_DEDUP_S = 5.0
# Recovery actions sent per device event are remembered for this many events at most.
MAX_OPEN_EVENTS = 4096
LOST_DETAIL = "the kernel log says the GPU has fallen off the bus"


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
        self._actions: dict[str, set[str]] = {}  # event key -> recovery actions sent
        self.io_errors: dict[str, int] = {}
        self._lock = threading.Lock()

    def gpu_of(self, pci: str | None) -> str:
        """The GPU UUID at a PCI address, else `PCI:<address>` (the evidence is kept)."""
        if self._map is None:
            self._map = {kmsg.pci_key(k): v for k, v in self._pci_to_gpu().items()}
        return self._map.get(pci or "", f"PCI:{pci}")

    def device_sink(self, rec: Record) -> None:
        event = rec.get("event")
        if rec.get("kind") == "device_event" and event in (vocab.XID, vocab.GPU_LOST):
            code = int(rec.get("code") or 0) if event == vocab.XID else event
            if not self._admit(rec, code, _when(rec["ts"]), "nvml"):
                return
        self.emit(rec)

    def _admit(self, rec: Record, code: int | str, ts: datetime, source: str) -> bool:
        """Whether this sighting is sent: the first of its event, or a later one that
        brings a recovery action the event has not carried yet (the kernel's Xid 154 line
        or NVLink5 decode beside an NVML read that had none; or the other way round), so
        what the service acts on does not depend on which witness came first."""
        key, new = self.xids.admit(rec["gpu"], code, ts, source)
        action = rec.get("recovery_action")
        with self._lock:
            sent = self._actions.setdefault(key, set())
            if not new and (action is None or action in sent):
                return False
            if action is not None:
                sent.add(action)
            if len(self._actions) > MAX_OPEN_EVENTS:  # keys of long-closed events
                self._actions.pop(next(iter(self._actions)))
        return True

    def kernel_sink(self, event: kmsg.KernelEvent) -> None:
        if event.event in (kmsg.XID, kmsg.GPU_OFF_BUS):
            gpu = self.gpu_of(event.device)
            if event.event == kmsg.GPU_OFF_BUS:
                # The driver's "fallen off the bus" lines are not an Xid (the Xid 79 line,
                # when printed, is its own event): the GPU is lost, NVML's word for it.
                rec = device_event(gpu, "gpu_lost", None, LOST_DETAIL)
                code: int | str = "gpu_lost"
            else:
                code = event.code if event.code is not None else 0
                detail = event.detail or xid.detail(code)
                rec = device_event(gpu, "xid", code, detail, event.recovery_action)
            rec["ts"] = iso_ts(event.ts.timestamp())
            if self._admit(rec, code, event.ts, "kmsg"):
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
            return sum(
                n for d, n in self.io_errors.items() if device.startswith(d) or d.startswith(device)
            )
