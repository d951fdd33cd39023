"""Handlers of host, network and kernel evidence: rows only, no live state, save the node
conditions they raise (a port down, a full checkpoint disk) and urgent host events that
schedule a diagnosis at once.
"""

from __future__ import annotations

from datetime import datetime

from agents import protocol as p
from console.policy import fleet_health
from ingest.copytext import json as cjson
from ingest.copytext import num, text, when
from ingest.store.fences import Fences
from ingest.store.kinds import Keep, Kind

# Kernel events that end or endanger a rank's process: diagnose without waiting.
HOST_URGENT = p.URGENT_HOST_EVENTS


def on_host_event(w: Fences, rec: p.HostEvent, ts: datetime) -> None:
    w.rows["hostevent"].append(
        f"{when(ts)}{w.node_cell}{text(rec.event)}\t{text(rec.device)}\t{num(rec.code)}\t"
        f"{num(rec.pid)}\t{text(rec.comm)}\t{text(rec.severity)}\n"
    )
    if rec.event in HOST_URGENT:
        w.critical_events += 1  # an OOM kill or a machine check: diagnose at once


def on_net_event(w: Fences, rec: p.NetEvent, ts: datetime) -> None:
    w.rows["netevent"].append(
        f"{when(ts)}{w.node_cell}{text(rec.port)}\t{text(rec.link)}\t{text(rec.event)}\t"
        f"{text(rec.state)}\t{num(rec.rate_gbps)}\t{num(rec.prev_rate_gbps)}\t"
        f"{cjson(rec.counters)}\n"
    )
    if rec.event == "link_down" and not fleet_health.port_up(rec.state):
        # A port that was up went down and stays down (a flap reads up again).
        w.conditions.append(
            {
                "kind": "nic_down",
                "key": rec.port,
                "summary": f"port {rec.port} ({rec.link}) on {w.node.name} is down "
                f"(state {rec.state or 'unknown'})",
                "evidence": {
                    "port": rec.port,
                    "link": rec.link,
                    "state": rec.state,
                    "counters": dict(rec.counters),
                    "ts": ts.isoformat(),
                },
            }
        )


def on_net_sample(w: Fences, rec: p.NetSample, ts: datetime) -> None:
    w.rows["netsample"].append(
        f"{when(ts)}{w.node_cell}{text(rec.port)}\t{text(rec.link)}\t{text(rec.state)}\t"
        f"{num(rec.rate_gbps)}\t{cjson(rec.counters)}\t{num(rec.interval_s)}\n"
    )


def on_host_sample(w: Fences, rec: p.HostSample, ts: datetime) -> None:
    w.rows["hostsample"].append(
        f"{when(ts)}{w.node_cell}{num(rec.mem_some_avg10)}\t{num(rec.mem_full_avg10)}\t"
        f"{num(rec.io_full_avg10)}\t{num(rec.swap_used_bytes)}\t"
        f"{num(rec.swap_total_bytes)}\t{num(rec.d_state)}\t{cjson(rec.disks)}\n"
    )
    for disk in rec.disks:
        if fleet_health.local_disk(disk.device) and fleet_health.disk_full(
            disk.free_bytes, disk.total_bytes
        ):
            free, total = disk.free_bytes or 0, disk.total_bytes or 0
            w.conditions.append(
                {
                    "kind": "disk_full",
                    "key": disk.root,
                    "summary": f"checkpoint disk {disk.device} ({disk.root}) on "
                    f"{w.node.name} is full: {free / 2**30:.1f} GiB free of "
                    f"{total / 2**30:.0f} GiB",
                    "evidence": {
                        "root": disk.root,
                        "device": disk.device,
                        "free_bytes": free,
                        "total_bytes": total,
                        "ts": ts.isoformat(),
                    },
                }
            )


# This family's kinds (ingest.store.kinds): each handler writes its table's COPY columns
# in this order.
KINDS = (
    Kind(
        p.HostEvent,
        on_host_event,
        table="hostevent",
        columns=(
            "ts",
            "node_id",
            "event",
            "device",
            "code",
            "pid",
            "comm",
            "severity",
        ),
        keep=Keep.NODE_EVENTS,
    ),
    Kind(
        p.NetEvent,
        on_net_event,
        table="netevent",
        columns=(
            "ts",
            "node_id",
            "port",
            "link",
            "event",
            "state",
            "rate_gbps",
            "prev_rate_gbps",
            "counters",
        ),
        keep=Keep.NODE_EVENTS,
    ),
    Kind(
        p.NetSample,
        on_net_sample,
        table="netsample",
        columns=(
            "ts",
            "node_id",
            "port",
            "link",
            "state",
            "rate_gbps",
            "counters",
            "interval_s",
        ),
        keep=Keep.A_DAY,
    ),
    Kind(
        p.HostSample,
        on_host_sample,
        table="hostsample",
        columns=(
            "ts",
            "node_id",
            "mem_some_avg10",
            "mem_full_avg10",
            "io_full_avg10",
            "swap_used_bytes",
            "swap_total_bytes",
            "d_state",
            "disks",
        ),
        keep=Keep.A_DAY,
    ),
)
