"""Handlers of a node's GPU records: heartbeats (liveness only), device samples (the newest
per GPU becomes live state; the newest throttled one is kept) and device events (a hardware
fault turns the GPU critical; what needs repair latches after the batch).
"""

from __future__ import annotations

from datetime import datetime

from agents import protocol as p
from agents import xid
from agents.gpu_health import CRITICAL_EVENTS
from console.policy import fleet_health
from ingest.copytext import json as cjson
from ingest.copytext import num, text, when
from ingest.store.fences import Fences
from ingest.store.kinds import Keep, Kind


def on_heartbeat(w: Fences, rec: p.Heartbeat, ts: datetime) -> None:
    return  # heartbeats only prove liveness (w.last_seen) and spool state


def on_device_sample(w: Fences, rec: p.DeviceSample, ts: datetime) -> None:
    w.rows["devicesample"].append(
        f"{when(ts)}{w.node_cell}{text(rec.gpu)}\t{rec.index}\t{num(rec.temp_c)}\t"
        f"{num(rec.power_w)}\t{num(rec.sm_clock_mhz)}\t{num(rec.mem_clock_mhz)}\t"
        f"{num(rec.util_pct)}\t{num(rec.mem_used_bytes)}\t{num(rec.ecc_sbe)}\t"
        f"{num(rec.ecc_dbe)}\t{num(rec.retired_or_remapped_pending)}\t"
        f"{cjson(rec.throttle_reasons)}\t{num(rec.nvlink_errors)}\t{num(rec.pcie_replays)}\t"
        f"{num(rec.mem_util_pct)}\n"
    )
    # Only the newest sample per GPU becomes live state: turn it into a dict at flush.
    w.devices[rec.gpu] = {"index": rec.index, "rec": rec, "ts": ts}
    if rec.throttle_reasons:  # and the newest throttled one, kept after clocks recover
        w.throttled[rec.gpu] = {
            "ts": ts.isoformat(),
            "throttle_reasons": list(rec.throttle_reasons),
            "temp_c": rec.temp_c,
            "power_w": rec.power_w,
            "sm_clock_mhz": rec.sm_clock_mhz,
        }


def on_device_event(w: Fences, rec: p.DeviceEvent, ts: datetime) -> None:
    w.rows["deviceevent"].append(
        f"{when(ts)}{w.node_cell}{text(rec.gpu)}\t{text(rec.event)}\t{num(rec.code)}\t"
        f"{text(rec.detail)}\t{text(rec.recovery_action)}\n"
    )
    if rec.event == fleet_health.GPU_RESET_EVENT:
        w.resets.append(rec.gpu)
    if rec.event in CRITICAL_EVENTS:
        w.critical_events += 1  # diagnose and push at once, whatever its class
        # Only a hardware fault turns the GPU (and so its node) critical: an application
        # Xid (13, 31, 43, 94...) leaves a healthy GPU (agents/xid.py decides).
        if xid.is_hardware_fault(rec.event, rec.code, rec.recovery_action):
            w.device_events[rec.gpu] = rec.event
        # What needs repair latches, after the live-state writes (ingest_batch).
        if fleet_health.repair_needed(rec.event, rec.code, rec.recovery_action) != "none":
            w.faults.append(
                {
                    "gpu": rec.gpu,
                    "event": rec.event,
                    "code": rec.code,
                    "recovery_action": rec.recovery_action,
                    "detail": rec.detail or "",
                    "ts": ts.isoformat(),
                }
            )


# This family's kinds (ingest.store.kinds): each handler writes its table's COPY columns
# in this order.
KINDS = (
    Kind(p.Heartbeat, on_heartbeat),  # liveness only: no rows
    Kind(
        p.DeviceSample,
        on_device_sample,
        table="devicesample",
        columns=(
            "ts",
            "node_id",
            "gpu",
            "index",
            "temp_c",
            "power_w",
            "sm_clock_mhz",
            "mem_clock_mhz",
            "util_pct",
            "mem_used_bytes",
            "ecc_sbe",
            "ecc_dbe",
            "retired_or_remapped_pending",
            "throttle_reasons",
            "nvlink_errors",
            "pcie_replays",
            "mem_util_pct",
        ),
        keep=Keep.PARTITIONS,
    ),
    Kind(
        p.DeviceEvent,
        on_device_event,
        table="deviceevent",
        columns=(
            "ts",
            "node_id",
            "gpu",
            "event",
            "code",
            "detail",
            "recovery_action",
        ),
        keep=Keep.NODE_EVENTS,
    ),
)
