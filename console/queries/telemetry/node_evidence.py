"""Node-scoped telemetry: device events, host, network and kernel evidence, and the GPU
samples that say which nodes reported (exposure); what a node's conditions read back
(console.actions.conditions). Node-scoped reads are binary (console.queries.binary): a
group's ~2k node ids cost ~10 ms of Django's query compiling per query. Must not write.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import Model

from agents.protocol import URGENT_HOST_EVENTS
from agents.vocab import HARDWARE_FAULT_KINDS as CRITICAL_EVENTS
from console.queries import binary
from console.queries.telemetry.shared import EVENT_WINDOW, HISTORY_WINDOW, columns, decode_rows
from ingest import models as m

# The record kinds whose tables this module reads (each kind has a reader: tests/server/ingest/
# test_record_kinds.py).
READS: dict[str, type[Model]] = {
    "device_sample": m.DeviceSample,
    "device_event": m.DeviceEvent,
    "host_event": m.HostEvent,
    "net_event": m.NetEvent,
    "net_sample": m.NetSample,
    "host_sample": m.HostSample,
}


def device_events(
    node_ids: set[int], *, node_names: dict[int, str], now: datetime
) -> list[dict[str, Any]]:
    """Device events of the last day on these nodes, as records."""
    return _node_rows(
        m.DeviceEvent,
        "device_event",
        ["gpu", "event", "code", "detail", "recovery_action"],
        "ts >= %s",
        [sorted(node_ids), now - HISTORY_WINDOW],
        node_names,
    )


def nodes_with_urgent_events(node_ids: set[int], *, since: datetime) -> set[int]:
    """Which of these nodes reported, since `since`, an event ingest diagnoses at once: a
    GPU's critical device event (Xid, GPU lost, DBE) or an urgent host event."""
    devices = m.DeviceEvent.objects.filter(
        node_id__in=node_ids, ts__gte=since, event__in=CRITICAL_EVENTS
    ).values_list("node_id", flat=True)
    hosts = m.HostEvent.objects.filter(
        node_id__in=node_ids, ts__gte=since, event__in=URGENT_HOST_EVENTS
    ).values_list("node_id", flat=True)
    return set(devices.distinct()) | set(hosts.distinct())


# Kernel events explain exits for as long as the stop lasts (a day, like device events);
# net events and the newest samples speak for the last EVENT_WINDOW only: a link that
# flapped an hour ago does not explain a collective that is slow now.
def host_records(
    node_ids: set[int], *, node_names: dict[int, str], now: datetime
) -> list[dict[str, Any]]:
    """Host events, net events, and the newest net sample per port and host sample per node
    of these nodes, as records of the wire contract (`node` is the node's name)."""
    ids = sorted(node_ids)
    records = _node_rows(
        m.HostEvent,
        "host_event",
        ["event", "device", "code", "pid", "comm", "severity"],
        "ts >= %s",
        [ids, now - HISTORY_WINDOW],
        node_names,
    )
    records += _node_rows(
        m.NetEvent,
        "net_event",
        ["port", "link", "event", "state", "rate_gbps", "prev_rate_gbps", "counters"],
        "ts >= %s",
        [ids, now - EVENT_WINDOW],
        node_names,
    )
    records += _node_rows(
        m.NetSample,
        "net_sample",
        ["port", "link", "state", "rate_gbps", "counters", "interval_s"],
        "ts >= %s",
        [ids, now - EVENT_WINDOW],
        node_names,
        distinct="node_id, port",
        tail="ORDER BY node_id, port, ts DESC",
    )
    records += _node_rows(
        m.HostSample,
        "host_sample",
        [
            "mem_some_avg10",
            "mem_full_avg10",
            "io_full_avg10",
            "swap_used_bytes",
            "swap_total_bytes",
            "d_state",
            "disks",
        ],
        "ts >= %s",
        [ids, now - EVENT_WINDOW],
        node_names,
        distinct="node_id",
        tail="ORDER BY node_id, ts DESC",
    )
    return records


def _node_rows(
    model: type[Any],
    kind: str,
    fields: list[str],
    where: str,
    params: list[Any],
    node_names: dict[int, str],
    *,
    distinct: str = "",
    tail: str = "ORDER BY id",
) -> list[dict[str, Any]]:
    """`contract_rows` of a node-scoped table (node_id = ANY(the first parameter) AND `where`), read
    in binary: a group's ~2k node ids were ~10 ms of Django's query compiling per query."""
    lead = f"DISTINCT ON ({distinct}) " if distinct else ""
    table = model._meta.db_table
    sql = f"SELECT {lead}ts, node_id, {columns(fields)} FROM {table}"  # noqa: S608
    sql += f" WHERE node_id = ANY(%s::bigint[]) AND {where} {tail}"
    return decode_rows(binary.fetch(sql, params), kind, fields, node_names, lead=("ts", "node"))


# The minute rollup recomputes closed minutes a little after they close; minutes this
# recent are read from raw samples too (a minute counted twice is one minute: max).
EXPOSURE_RAW_TAIL = timedelta(minutes=5)
_EXPOSURE_SQL = """
WITH minutes AS (
    SELECT node_id, minute, gpus FROM ingest_devicerollup
    WHERE minute >= %(since)s AND minute < %(until)s
    UNION ALL
    SELECT node_id, date_trunc('minute', ts), count(DISTINCT gpu) FROM ingest_devicesample
    WHERE ts >= %(tail)s AND ts < %(until)s
    GROUP BY 1, 2
), per AS (
    SELECT node_id, minute, max(gpus) AS gpus FROM minutes GROUP BY node_id, minute
)
SELECT n.name, count(*), sum(per.gpus), (SELECT count(DISTINCT minute) FROM per)
FROM per JOIN console_node n ON n.id = per.node_id
GROUP BY n.name
"""


def exposure(since: datetime, until: datetime) -> dict[str, Any]:
    """What reported in [since, until): minutes in which any node sent a GPU sample, and
    per node its minutes and GPU-minutes (the minute rollups, raw samples for the tail)."""
    params = {"since": since, "until": until, "tail": max(since, until - EXPOSURE_RAW_TAIL)}
    with connection.cursor() as cur:
        cur.execute(_EXPOSURE_SQL, params)
        rows = cur.fetchall()
    return {
        "minutes": int(rows[0][3]) if rows else 0,
        "nodes": {name: (int(minutes), int(gpus or 0)) for name, minutes, gpus, _ in rows},
    }


def port_state_since(node_id: int, port: str, since: datetime) -> str | None:
    """The newest state one port of a node reported after `since` (a sample or an event),
    or None when it reported none."""
    sample = (
        m.NetSample.objects.filter(node_id=node_id, port=port, ts__gt=since)
        .order_by("-ts")
        .values_list("ts", "state")
        .first()
    )
    event = (
        m.NetEvent.objects.filter(node_id=node_id, port=port, ts__gt=since)
        .order_by("-ts")
        .values_list("ts", "state")
        .first()
    )
    newest = max((r for r in (sample, event) if r is not None), default=None, key=lambda r: r[0])
    return None if newest is None else (newest[1] or "")


def disks_since(node_id: int, since: datetime) -> list[dict[str, Any]] | None:
    """The checkpoint disks of a node's newest host sample after `since`, or None."""
    row = (
        m.HostSample.objects.filter(node_id=node_id, ts__gt=since)
        .order_by("-ts")
        .values_list("disks", flat=True)
        .first()
    )
    return None if row is None else list(row or [])
