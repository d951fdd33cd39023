"""A second GPU source: scrape a local dcgm-exporter `/metrics` (Prometheus text format).

For nodes where NVML is not reachable from the agent's container but dcgm-exporter runs.
Maps DCGM_FI_* series to the same `device_sample` fields as the NVML backend; a series the
exporter does not export is missing (None), never 0. DCGM's Xid gauge holds only the LAST
Xid and never clears, so an event is emitted when its value changes, not while it stays.
Stdlib only.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any

from agents import prometheus
from agents.nvml import device_event, device_sample
from agents.wire import Record

MIB = 1024 * 1024

# DCGM field -> (device_sample field, scale)
FIELDS: dict[str, tuple[str, float]] = {
    "DCGM_FI_DEV_GPU_TEMP": ("temp_c", 1.0),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0),
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", 1.0),
    "DCGM_FI_DEV_MEM_CLOCK": ("mem_clock_mhz", 1.0),
    "DCGM_FI_DEV_GPU_UTIL": ("util_pct", 1.0),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("mem_util_pct", 1.0),  # NVML's memory utilisation
    "DCGM_FI_DEV_FB_USED": ("mem_used_bytes", MIB),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("ecc_sbe", 1.0),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("ecc_dbe", 1.0),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": ("retired_or_remapped_pending", 1.0),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("pcie_replays", 1.0),
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": ("nvlink_errors", 1.0),
}
INTEGER_FIELDS = {
    "mem_used_bytes",
    "ecc_sbe",
    "ecc_dbe",
    "retired_or_remapped_pending",
    "pcie_replays",
    "nvlink_errors",
}
XID = "DCGM_FI_DEV_XID_ERRORS"


def _dcgm(name: str) -> bool:
    return name.startswith("DCGM_FI_")


def model_names(scraped: str | prometheus.Exposition) -> dict[str, str]:
    """{gpu uuid: the `modelName` label}: NVML's device name, as the exporter labels it."""
    if isinstance(scraped, str):
        scraped = prometheus.parse(scraped, keep=_dcgm)
    out: dict[str, str] = {}
    for name, family in scraped.samples.items():
        if not _dcgm(name):
            continue
        for labels in family:
            tags = dict(labels)
            uuid = tags.get("UUID") or tags.get("uuid")
            if uuid and tags.get("modelName"):
                out.setdefault(uuid, tags["modelName"][:96])
    return out


def parse(scraped: str | prometheus.Exposition) -> dict[str, dict[str, float]]:
    """{gpu uuid: {metric: value}} from Prometheus text; series without a UUID are skipped."""
    if isinstance(scraped, str):
        scraped = prometheus.parse(scraped, keep=_dcgm)
    out: dict[str, dict[str, float]] = {}
    for name, family in scraped.samples.items():
        if not _dcgm(name):
            continue
        for labels, value in family.items():
            tags = dict(labels)
            uuid = tags.get("UUID") or tags.get("uuid")
            if not uuid:
                continue
            gpu = out.setdefault(uuid, {})
            gpu[name] = value
            if tags.get("gpu", "").isdigit():
                gpu["__index"] = float(tags["gpu"])
    return out


class DcgmBackend:
    """GpuBackend over dcgm-exporter; one scrape per sampling tick, shared by all GPUs."""

    name = "dcgm"

    def __init__(self, url: str, *, timeout: float = 2.0, poll_s: float = 1.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"dcgm-exporter URL must be http(s)://, got {url!r}")
        self.url, self.timeout, self.poll_s = url, timeout, poll_s
        self._cache: dict[str, dict[str, float]] = {}
        self._names: dict[str, str] = {}
        self._fetched = 0.0
        self._order: list[str] = []
        self._last_xid: dict[str, float] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()

    def _scrape(self, max_age: float = 0.5) -> dict[str, dict[str, float]]:
        with self._lock:
            if time.monotonic() - self._fetched < max_age:
                return self._cache
            # The scheme is checked in __init__: only http(s) to the configured exporter.
            request = urllib.request.Request(self.url, headers={"Accept": "text/plain"})  # noqa: S310
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310
                text = response.read().decode("utf-8", "replace")
            scraped = prometheus.parse(text, keep=_dcgm)  # once for both readings
            self._cache = parse(scraped)
            self._names = model_names(scraped)
            self._fetched = time.monotonic()
            self._order = sorted(self._cache, key=lambda u: (self._cache[u].get("__index", 1e9), u))
            return self._cache

    def driver_version(self) -> str | None:
        return None  # dcgm-exporter does not export it

    def device_count(self) -> int:
        return len(self._scrape())

    def uuid(self, index: int) -> str:
        self._scrape()
        return self._order[index]

    def sample(self, index: int) -> Record:
        metrics = self._scrape()
        uuid = self._order[index]
        values = metrics.get(uuid, {})
        fields: dict[str, Any] = {}
        for name, (field, scale) in FIELDS.items():
            if name in values:
                value = values[name] * scale
                fields[field] = int(value) if field in INTEGER_FIELDS else value
        fields["name"] = self._names.get(uuid)
        gpu_index = int(values.get("__index", index))
        return device_sample(uuid, gpu_index, fields)

    def start_events(self, sink: Callable[[Record], None]) -> None:
        threading.Thread(
            target=self._watch_xids, args=(sink,), daemon=True, name="faultline-dcgm-xid"
        ).start()

    def _watch_xids(self, sink: Callable[[Record], None]) -> None:
        first = True
        while not self._stop.wait(self.poll_s):
            try:
                metrics = self._scrape(max_age=self.poll_s / 2)
            except OSError:
                continue
            for uuid, values in metrics.items():
                xid = values.get(XID)
                if xid is None:
                    continue
                before = self._last_xid.get(uuid)
                self._last_xid[uuid] = xid
                # The gauge never clears: report a change, and on start only a live value
                # we have not seen (an old Xid from before the agent started is history).
                if xid and not first and xid != before:
                    sink(device_event(uuid, "xid", int(xid), "from dcgm-exporter"))
            first = False

    def close(self) -> None:
        self._stop.set()
