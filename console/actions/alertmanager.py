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

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction

from console.actions.audit import audit
from console.actions.fleet import latch_fault, open_node_incident, publish_node
from console.actions.incidents import publish_incident, resolve_held
from console.choices import IncidentState
from console.models import ConsistencyGroup, Device, ExternalAlert, HealthEvent, Incident, Node

ACTOR = "alertmanager"
XID_METRIC = "DCGM_FI_DEV_XID_ERRORS"
XID_WINDOW = timedelta(minutes=10)  # a DCGM Xid and the agent's Xid this close are one fault
SEVERITIES = {"critical": "critical", "page": "critical", "error": "major", "major": "major",
              "warning": "minor", "minor": "minor", "info": "info", "none": "info"}  # fmt: skip
NODE_LABELS = ("node", "instance", "Hostname", "hostname")


@dataclass(frozen=True)
class AlertIn:
    """One alert of the webhook payload (version 4), already parsed."""

    status: str  # firing | resolved
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: datetime
    ends_at: datetime | None
    fingerprint: str


def _node_of(labels: dict[str, str]) -> Node | None:
    for key in NODE_LABELS:
        value = labels.get(key, "").strip()
        if not value:
            continue
        names = [value]
        host, sep, port = value.rpartition(":")
        if sep and port.isdigit():
            names.append(host.strip("[]"))  # instance is host:port
        names.append(names[-1].split(".")[0])  # an FQDN for a short inventory name
        node = Node.objects.filter(name__in=names).first()
        if node is not None:
            return node
    return None


def _device_of(node: Node | None, labels: dict[str, str]) -> Device | None:
    uuid = labels.get("UUID") or labels.get("uuid") or ""
    if uuid:
        return Device.objects.filter(uuid=uuid).first()
    index = labels.get("gpu", "")
    if node is not None and index.isdigit():
        return Device.objects.filter(node=node, index=int(index)).first()
    return None


def _xid_code(labels: dict[str, str], annotations: dict[str, str]) -> int | None:
    """The Xid of a DCGM Xid alert (dcgm-exporter's gauge holds the last code: a rule passes
    it as a label or the `value` annotation); None for any other alert."""
    name = labels.get("alertname", "")
    if XID_METRIC not in (name, labels.get("__name__", "")) and "xid" not in name.lower():
        return None
    for raw in (labels.get("code"), labels.get("xid"), labels.get("err_code"),
                annotations.get("code"), annotations.get("value")):  # fmt: skip
        try:
            code = int(float(raw)) if raw not in (None, "") else None
        except ValueError:
            continue
        if code:
            return code
    return None


def _known_fault(node: Node, gpu: str, code: int, now: datetime, own: int | None) -> str:
    """ "agent" or "alert" when this Xid on this GPU is already a fault within the window."""
    since = now - XID_WINDOW
    agent = HealthEvent.objects.filter(
        node=node, gpu=gpu, kind="fault", at__gte=since, evidence__code=code
    ).exclude(actor=ACTOR)
    if agent.exists():
        return "agent"
    other = ExternalAlert.objects.filter(node=node, gpu=gpu, xid=code, received_at__gte=since)
    if own is not None:
        other = other.exclude(pk=own)
    return "alert" if other.exists() else ""


def _alert_incident(node: Node, row: ExternalAlert, now: datetime) -> Incident:
    """The node's open fleet incident, or one this alert opens."""
    incident = open_node_incident(node.name)
    if incident is not None:
        return incident
    incident = Incident.objects.create(
        node=node, fingerprint=f"{ACTOR}:{node.name}", kind="external_alert",
        subject=f"node:{node.name}", role="root_cause", severity=row.severity, opened_at=now,
        summary=f"{row.name} on {node.name}: {row.summary}".rstrip(": ")[:512],
        root_cause={"kind": "external_alert", "subject": f"node:{node.name}",
                    "node": node.name, "evidence": {"alertname": row.name,
                                                    "labels": row.labels}},
        timeline={"first_evidence": row.starts_at.isoformat(), "detected": now.isoformat()},
    )  # fmt: skip
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


def _one(a: AlertIn, now: datetime) -> ExternalAlert:
    labels, annotations = a.labels, a.annotations
    node = _node_of(labels)
    device = _device_of(node, labels)
    if node is None and device is not None:
        node = device.node
    group = ConsistencyGroup.objects.filter(name=labels.get("group", "")).first()
    row = (
        ExternalAlert.objects.select_for_update()
        .filter(fingerprint=a.fingerprint, starts_at=a.starts_at)
        .first()
    )
    created = row is None
    if row is None:
        row = ExternalAlert(fingerprint=a.fingerprint, starts_at=a.starts_at, received_at=now)
    before = row.status
    row.name = labels.get("alertname", "")[:200] or "alert"
    row.status = "resolved" if a.status == "resolved" else "firing"
    row.severity = SEVERITIES.get(labels.get("severity", "").lower(), "major")
    row.summary = (annotations.get("summary") or annotations.get("description") or "")[:512]
    row.labels, row.annotations, row.ends_at = labels, annotations, a.ends_at
    row.node, row.group, row.gpu = node, group, device.uuid if device else ""
    row.xid = _xid_code(labels, annotations)
    row.resolved_at = (a.ends_at or now) if row.status == "resolved" else None
    row.save()
    if row.status == before and not created:
        return row  # a re-delivery (group_interval / repeat_interval): nothing new
    audit(actor=ACTOR, verb=f"alert.{row.status}", obj=row, now=now,
          reason=f"{row.name}: {row.summary}".rstrip(": "),
          data={"fingerprint": row.fingerprint, "node": node.name if node else None,
                "gpu": row.gpu, "group": group.name if group else None,
                "xid": row.xid})  # fmt: skip
    if row.status == "resolved":
        _settle_alert_incident(row.incident, now)
    elif node is not None:
        _fire_on_node(row, node, now)
    if node is not None:
        publish_node(node.name)
    return row


def _fire_on_node(row: ExternalAlert, node: Node, now: datetime) -> None:
    if row.xid is not None:
        row.joined = _known_fault(node, row.gpu, row.xid, now, own=row.pk)
        if not row.joined:
            latch = latch_fault(
                node_id=node.pk, event="xid", gpu=row.gpu, code=row.xid, actor=ACTOR, now=now,
                detail=f"Alertmanager {row.name}",
                evidence={"source": ACTOR, "fingerprint": row.fingerprint,
                          "ts": row.starts_at.isoformat()},
            )  # fmt: skip
            if latch is not None:
                row.incident_id = latch.incident_id
                row.save(update_fields=["incident", "joined"])
                return
    row.incident = _alert_incident(node, row, now)
    row.save(update_fields=["incident", "joined"])


@transaction.atomic
def record_alertmanager(*, alerts: list[AlertIn], actor: str = ACTOR, now: datetime) -> list[int]:
    """Store one webhook delivery's alerts; returns the ExternalAlert ids. Idempotent:
    Alertmanager re-sends firing alerts every repeat_interval."""
    if actor != ACTOR:
        raise ValueError("Alertmanager deliveries are recorded as the alertmanager actor")
    return [_one(a, now).pk for a in alerts]
