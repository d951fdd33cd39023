"""Alerts from Alertmanager's webhook into evidence and node incidents (actor `alertmanager`).

Owns mapping an alert's labels to the node (`node`, `instance`, `Hostname`), GPU (`UUID`,
or `gpu` as an index, as dcgm-exporter labels them) and group (`group`) it is about;
storing it (ExternalAlert, one row per fingerprint and start); a firing alert on a node
opening or joining that node's fleet incident; a DCGM Xid alert folding with the agent's
own Xid on the same GPU (one fault: node + GPU + code within XID_WINDOW); and a resolve
from Alertmanager resolving the evidence, and the incident the alerts opened once none of
its alerts fires. Hardware faults latched through `latch_fault` keep the health lifecycle's
rules: they resolve when the hardware is returned, not when the alert stops. It must not
parse HTTP or check tokens (faultline.alertmanager does).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import Q

from agents import vocab
from console import scheduling
from console.actions.audit import AuditRow, audit, audit_many
from console.actions.fleet import latch_fault, open_node_incident, publish_nodes
from console.actions.incidents import publish_incident, resolve_held
from console.choices import IncidentState
from console.models import ConsistencyGroup, Device, ExternalAlert, HealthEvent, Incident, Node

ACTOR = "alertmanager"
XID_METRIC = "DCGM_FI_DEV_XID_ERRORS"
XID_WINDOW = timedelta(minutes=10)  # a DCGM Xid and the agent's Xid this close are one fault
# An alert's `severity` label as ours: ours (agents.vocab) as they are, then other words.
SEVERITIES = {
    **{s: s for s in vocab.SEVERITY_ORDER},
    "page": vocab.SEVERITY_CRITICAL,
    "error": vocab.SEVERITY_MAJOR,
    "warning": vocab.SEVERITY_MINOR,
    "none": vocab.SEVERITY_INFO,
}
NODE_LABELS = ("node", "instance", "Hostname", "hostname")
MAX_CODE = 2**31  # the column's range; real Xid codes are below 200
# New GPU faults one delivery latches in its own request; the rest go to the urgent lane's
# worker (console.tasks.latch_alert_faults), so 3,000 Xid alerts answer in seconds.
INLINE_LATCHES = 16
LATCH_BATCH = 128  # alerts one later run latches at most


@dataclass(frozen=True)
class AlertIn:
    """One alert of the webhook payload (version 4), already parsed."""

    status: str  # firing | resolved
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: datetime
    ends_at: datetime | None
    fingerprint: str
    xid: int | None = None  # xid_code(labels, annotations)


def is_xid_alert(labels: dict[str, str]) -> bool:
    name = labels.get("alertname", "")
    return XID_METRIC in (name, labels.get("__name__", "")) or "xid" in name.lower()


def xid_code(labels: dict[str, str], annotations: dict[str, str]) -> int | None:
    """The Xid of a DCGM Xid alert (dcgm-exporter's gauge holds the last code: a rule passes
    it as a label or the `value` annotation); None for any other alert. A code that is a
    number but not a whole one from 0 to 2**31-1 ("inf", "1e30") raises ValueError naming
    the field; text that is no number at all is skipped, as before."""
    if not is_xid_alert(labels):
        return None
    for where, raw in (
        ("labels.code", labels.get("code")),
        ("labels.xid", labels.get("xid")),
        ("labels.err_code", labels.get("err_code")),
        ("annotations.code", annotations.get("code")),
        ("annotations.value", annotations.get("value")),
    ):
        if raw in (None, ""):
            continue
        try:
            number = float(raw)
        except (TypeError, ValueError):
            continue
        if not (math.isfinite(number) and number.is_integer() and 0 <= number < MAX_CODE):
            raise ValueError(
                f"{where} must be a whole Xid code from 0 to {MAX_CODE - 1}, got {str(raw)[:40]!r}"
            )
        if number:
            return int(number)
    return None


def _names(value: str) -> list[str]:
    """How a label may name a node: as is, `host:port`'s host, an FQDN's short name."""
    names = [value]
    host, sep, port = value.rpartition(":")
    if sep and port.isdigit():
        names.append(host.strip("[]"))  # instance is host:port
    names.append(names[-1].split(".")[0])  # an FQDN for a short inventory name
    return names


@dataclass
class _Known:
    """What the delivery's labels name, read in a few queries for every alert at once."""

    nodes: dict[str, Node]
    devices: dict[str, Device]  # by uuid
    by_index: dict[tuple[int, int], Device]  # (node id, index)
    groups: dict[str, ConsistencyGroup]
    rows: dict[tuple[str, datetime], ExternalAlert]  # (fingerprint, starts_at), locked

    def node_of(self, labels: dict[str, str]) -> Node | None:
        for key in NODE_LABELS:
            value = labels.get(key, "").strip()
            for name in _names(value) if value else ():
                if name in self.nodes:
                    return self.nodes[name]
        return None

    def device_of(self, node: Node | None, labels: dict[str, str]) -> Device | None:
        uuid = labels.get("UUID") or labels.get("uuid") or ""
        if uuid:
            return self.devices.get(uuid)
        index = labels.get("gpu", "")
        if node is not None and index.isascii() and index.isdigit() and len(index) < 9:
            return self.by_index.get((node.pk, int(index)))
        return None


def _known(alerts: list[AlertIn]) -> _Known:
    names = {
        n
        for a in alerts
        for key in NODE_LABELS
        if (v := a.labels.get(key, "").strip())
        for n in _names(v)
    }
    nodes = {n.name: n for n in Node.objects.filter(name__in=names)}
    uuids = {a.labels.get("UUID") or a.labels.get("uuid") or "" for a in alerts} - {""}
    devices = {d.uuid: d for d in Device.objects.select_related("node").filter(uuid__in=uuids)}
    indexed = {n.pk for n in nodes.values()}
    by_index = {
        (d.node_id, d.index): d
        for d in Device.objects.select_related("node").filter(node_id__in=indexed)
    }
    groups = {
        g.name: g
        for g in ConsistencyGroup.objects.filter(
            name__in={a.labels.get("group", "") for a in alerts} - {""}
        )
    }
    fingerprints = {a.fingerprint for a in alerts}
    rows = {
        (r.fingerprint, r.starts_at): r
        for r in ExternalAlert.objects.select_for_update(of=("self",))
        .select_related("incident")
        .filter(fingerprint__in=fingerprints)
        .order_by("pk")  # one lock order for concurrent deliveries
    }
    return _Known(nodes, devices, by_index, groups, rows)


def _fill(row: ExternalAlert, a: AlertIn, known: _Known, now: datetime) -> None:
    labels, annotations = a.labels, a.annotations
    node = known.node_of(labels)
    device = known.device_of(node, labels)
    if node is None and device is not None:
        node = device.node
    row.name = labels.get("alertname", "")[:200] or "alert"
    row.status = "resolved" if a.status == "resolved" else "firing"
    row.severity = SEVERITIES.get(labels.get("severity", "").lower(), vocab.SEVERITY_MAJOR)
    row.summary = (annotations.get("summary") or annotations.get("description") or "")[:512]
    row.labels, row.annotations, row.ends_at = labels, annotations, a.ends_at
    row.node, row.gpu = node, device.uuid if device else ""
    row.group = known.groups.get(labels.get("group", ""))
    row.xid = a.xid
    row.resolved_at = (a.ends_at or now) if row.status == "resolved" else None


_FIELDS = [
    "name",
    "status",
    "severity",
    "summary",
    "labels",
    "annotations",
    "ends_at",
    "node",
    "gpu",
    "group",
    "xid",
    "resolved_at",
]


def _values(row: ExternalAlert, fields: list[str]) -> tuple[Any, ...]:
    return tuple(getattr(row, ExternalAlert._meta.get_field(f).attname) for f in fields)


def _update(rows: list[ExternalAlert], fields: list[str]) -> None:
    """UPDATE ... FROM (VALUES ...) in batches: bulk_update's CASE expressions cost ~6 ms a
    row here (18 s for a delivery's 3,000 resolves)."""
    model = [ExternalAlert._meta.get_field(f) for f in fields]
    names = [connection.ops.quote_name(f.column) for f in model]
    cols = ", ".join(names)
    sets = ", ".join(f"{name} = v.{name}" for name in names)
    one = "(%s::bigint, " + ", ".join(f"%s::{f.db_type(connection)}" for f in model) + ")"
    table = connection.ops.quote_name(ExternalAlert._meta.db_table)
    for i in range(0, len(rows), 500):
        batch = rows[i : i + 500]
        params: list[Any] = []
        for row in batch:
            params.append(row.pk)
            params += [f.get_db_prep_value(getattr(row, f.attname), connection) for f in model]
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {table} AS t SET {sets} FROM (VALUES {', '.join([one] * len(batch))}) "  # noqa: S608 - column names from the model, values bound
                f"AS v(id, {cols}) WHERE t.id = v.id",
                params,
            )


def _known_faults(rows: list[ExternalAlert], now: datetime) -> tuple[set[Any], set[Any]]:
    """(node id, GPU, code) already a fault within XID_WINDOW: by the agent's own Xid, and by
    another alert already placed. Two queries for the whole delivery."""
    since = now - XID_WINDOW
    node_ids = {r.node_id for r in rows}
    codes = {r.xid for r in rows}
    ours = {r.pk for r in rows}
    agent = {
        (node_id, gpu, (evidence or {}).get("code"))
        for node_id, gpu, evidence in HealthEvent.objects.filter(
            node_id__in=node_ids, kind="fault", at__gte=since
        )
        .exclude(actor=ACTOR)
        .values_list("node_id", "gpu", "evidence")
    }
    alert = set(
        ExternalAlert.objects.filter(node_id__in=node_ids, xid__in=codes, received_at__gte=since)
        .filter(~Q(joined="") | Q(incident__isnull=False))  # placed: not one still waiting
        .exclude(pk__in=ours)
        .values_list("node_id", "gpu", "xid")
    )
    return agent, alert


def _alert_incident(node: Node, row: ExternalAlert, now: datetime) -> Incident:
    """The node's open fleet incident, or one this alert opens."""
    incident = open_node_incident(node.name)
    if incident is not None:
        return incident
    incident = Incident.objects.create(
        node=node,
        fingerprint=f"{ACTOR}:{node.name}",
        kind="external_alert",
        subject=f"node:{node.name}",
        role="root_cause",
        severity=row.severity,
        opened_at=now,
        summary=f"{row.name} on {node.name}: {row.summary}".rstrip(": ")[:512],
        root_cause={
            "kind": "external_alert",
            "subject": f"node:{node.name}",
            "node": node.name,
            "evidence": {"alertname": row.name, "labels": row.labels},
        },
        timeline={"first_evidence": row.starts_at.isoformat(), "detected": now.isoformat()},
    )
    audit(actor=ACTOR, verb="incident.opened", obj=incident, now=now, reason=incident.summary)
    publish_incident(incident)
    return incident


def _settle_alert_incident(incident: Incident | None, now: datetime) -> bool:
    """An incident the alerts opened resolves once none of its alerts fires."""
    if (
        incident is None
        or incident.kind != "external_alert"
        or incident.state == IncidentState.RESOLVED
        or incident.external_alerts.filter(status="firing").exists()
    ):
        return False
    resolve_held(incident, actor=ACTOR, reason="Alertmanager resolved its alerts", now=now)
    return True


@transaction.atomic
def record_alertmanager(*, alerts: list[AlertIn], actor: str = ACTOR, now: datetime) -> list[int]:
    """Store one webhook delivery's alerts; returns the ExternalAlert ids. Idempotent:
    Alertmanager re-sends firing alerts every repeat_interval.

    Batched: the nodes, GPUs, groups and stored rows every alert names are read in a few
    queries, rows are written and audited in bulk, and each node's incident is found or
    opened once per delivery; only a new hardware fault (a DCGM Xid nobody latched yet)
    costs work of its own (console.actions.fleet.latch_fault).
    """
    if actor != ACTOR:
        raise ValueError("Alertmanager deliveries are recorded as the alertmanager actor")
    known = _known(alerts)
    rows: dict[tuple[str, datetime], ExternalAlert] = {}
    before: dict[tuple[str, datetime], str | None] = {}
    stored: dict[tuple[str, datetime], tuple[Any, ...]] = {}
    for a in alerts:  # a fingerprint twice in one delivery: the last copy wins
        key = (a.fingerprint, a.starts_at)
        row = rows.get(key) or known.rows.get(key)
        if row is None:
            row = ExternalAlert(fingerprint=a.fingerprint, starts_at=a.starts_at, received_at=now)
        before.setdefault(key, row.status if row.pk else None)
        if row.pk and key not in stored:
            stored[key] = _values(row, _FIELDS)
        _fill(row, a, known, now)
        rows[key] = row
    ExternalAlert.objects.bulk_create([r for r in rows.values() if r.pk is None])
    # A re-delivery (repeat_interval) changes nothing: only rows that differ are written.
    _update([rows[k] for k in stored if _values(rows[k], _FIELDS) != stored[k]], _FIELDS)
    changed = [rows[k] for k in rows if before[k] != rows[k].status]
    audit_many(
        [
            AuditRow(
                verb=f"alert.{row.status}",
                obj=row,
                reason=f"{row.name}: {row.summary}".rstrip(": "),
                data={
                    "fingerprint": row.fingerprint,
                    "node": row.node.name if row.node else None,
                    "gpu": row.gpu,
                    "group": row.group.name if row.group else None,
                    "xid": row.xid,
                },
            )
            for row in changed
        ],
        actor=ACTOR,
        now=now,
    )
    _apply(changed, now)
    nodes = sorted({r.node.name for r in changed if r.node is not None})
    if nodes:  # a re-delivery changed none
        publish_nodes(nodes)
    return [r.pk for r in rows.values()]


def _apply(changed: list[ExternalAlert], now: datetime) -> None:
    """What the alerts whose status changed do to incidents and hardware state."""
    settled = {r.incident_id for r in changed if r.status == "resolved" and r.incident_id}
    firing = [r for r in changed if r.status == "firing" and r.node is not None]
    deferred = _place(firing, now, inline_latches=INLINE_LATCHES)
    if deferred:
        scheduling.schedule_alert_latches(deferred)
    for row in changed:
        if row.status == "resolved" and row.incident_id in settled:
            settled.discard(row.incident_id)
            _settle_alert_incident(row.incident, now)


def _place(rows: list[ExternalAlert], now: datetime, *, inline_latches: int | None) -> list[int]:
    """Latch, join or open what each firing alert on a node means; returns the ids of Xid
    alerts left to latch later (beyond `inline_latches` new faults, and any alert of the
    same fault): latching costs ~14 queries a GPU, and a delivery must finish in seconds."""
    xids = [r for r in rows if r.xid is not None]
    agent, alert = _known_faults(xids, now) if xids else (set(), set())
    incidents: dict[int, Incident] = {}  # node id -> its open fleet incident
    later: set[Any] = set()
    deferred: list[int] = []
    placed: list[ExternalAlert] = []
    for row in rows:
        node = row.node
        if node is None:
            continue
        if row.xid is not None:
            key = (node.pk, row.gpu, row.xid)
            if key in later:
                deferred.append(row.pk)  # joins its fault once that is latched
                continue
            row.joined = "agent" if key in agent else "alert" if key in alert else ""
            if not row.joined:
                if inline_latches is not None and inline_latches <= 0:
                    later.add(key)
                    deferred.append(row.pk)
                    continue
                inline_latches = None if inline_latches is None else inline_latches - 1
                alert.add(key)  # a later alert of this delivery on the same fault joins it
                latch = latch_fault(
                    node_id=node.pk,
                    event="xid",
                    gpu=row.gpu,
                    code=row.xid,
                    actor=ACTOR,
                    now=now,
                    detail=f"Alertmanager {row.name}",
                    evidence={
                        "source": ACTOR,
                        "fingerprint": row.fingerprint,
                        "ts": row.starts_at.isoformat(),
                    },
                )
                if latch is not None:
                    row.incident_id = latch.incident_id
                    incidents.pop(node.pk, None)  # the latch may have opened the node's
                    placed.append(row)
                    continue
        if node.pk not in incidents:
            incidents[node.pk] = _alert_incident(node, row, now)
        row.incident = incidents[node.pk]
        placed.append(row)
    _update(placed, ["incident", "joined"])
    return deferred


@transaction.atomic
def latch_alert_faults(*, alert_ids: list[int] | None, now: datetime) -> int:
    """Latch the faults of Xid alerts a delivery left for later (console.tasks): those
    named, or with None the oldest LATCH_BATCH still waiting. Alerts already placed,
    resolved since, gone, or held by another run are skipped, so a redelivered task is
    harmless. Returns how many alerts it placed."""
    waiting = ExternalAlert.objects.filter(
        status="firing", incident__isnull=True, joined="", xid__isnull=False, node__isnull=False
    )
    if alert_ids is not None:
        waiting = waiting.filter(pk__in=alert_ids)
    rows = list(
        waiting.select_for_update(of=("self",), skip_locked=True)
        .select_related("node")
        .order_by("pk")[:LATCH_BATCH]
    )
    left = _place(rows, now, inline_latches=None)
    if rows:
        publish_nodes(sorted({r.node.name for r in rows if r.node is not None}))
    return len(rows) - len(left)
