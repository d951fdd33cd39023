"""A node's conditions: a NIC port down, a full local checkpoint disk.

Owns the condition incidents of a node (fleet scope, no group; fingerprint
`condition:<kind>:<node>:<port or root>`): opened from ingest when the node's agent reports
a port that was up going down and staying down (a `link_down` net_event whose state is not
up) or a checkpoint root on a local disk with at most DISK_FULL_FRACTION free
(`open_condition`), and resolved by the node sweep once the same port reports up or the
disk has DISK_CLEAR_FRACTION free (`settle_conditions`). A cleared condition is repair
evidence for a node Faultline took out for it. What a condition calls for (take the node
out, by placement) is console.policy.remediation's; when is console.policy.fleet_health's.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction

from console.actions.audit import SYSTEM
from console.actions.fleet import record_repair_evidence
from console.actions.incidents import publish_incident, resolve_held
from console.choices import IncidentState
from console.models import Incident, Node
from console.policy import fleet_health as fh
from console.queries.telemetry import node_evidence

NIC_DOWN = "nic_down"
DISK_FULL = "disk_full"
KINDS = (NIC_DOWN, DISK_FULL)
PREFIX = "condition:"


def fingerprint(kind: str, node: str, key: str) -> str:
    return f"{PREFIX}{kind}:{node}:{key}"[:128]


@transaction.atomic
def open_condition(
    *,
    node_id: int,
    kind: str,
    key: str,
    summary: str,
    evidence: dict[str, Any],
    actor: str,
    now: datetime,
) -> Incident | None:
    """The node's incident for this condition (one open per node and port or root); None
    when one is open already (ingest reports a full disk every sample)."""
    node = Node.objects.get(pk=node_id)
    fp = fingerprint(kind, node.name, key)
    if (
        Incident.objects.filter(group=None, node=node, fingerprint=fp)
        .exclude(state=IncidentState.RESOLVED)
        .exists()
    ):
        return None
    subject = f"node:{node.name}"
    incident = Incident.objects.create(
        node=node,
        fingerprint=fp,
        kind=kind,
        subject=subject,
        role="root_cause",
        severity="major",
        opened_at=now,
        summary=summary[:512],
        root_cause={
            "kind": kind,
            "subject": subject,
            "node": node.name,
            "evidence": {**evidence, "node": node.name, "key": key, "by": actor},
        },
        timeline={
            "first_evidence": str(evidence.get("ts") or now.isoformat()),
            "detected": now.isoformat(),
        },
    )
    publish_incident(incident)
    return incident


def _cleared(incident: Incident) -> str | None:
    """Why the condition is gone, or None while it holds: the newest report after it
    opened shows the port up, or the disk with room again."""
    evidence = (incident.root_cause or {}).get("evidence") or {}
    key = str(evidence.get("key") or "")
    if incident.node_id is None:
        return "the node left the inventory"
    if incident.kind == NIC_DOWN:
        state = node_evidence.port_state_since(incident.node_id, key, incident.opened_at)
        return f"port {key} is {state} again" if state and fh.port_up(state) else None
    disks = node_evidence.disks_since(incident.node_id, incident.opened_at) or []
    for disk in disks:
        if disk.get("root") == key:
            free, total = disk.get("free_bytes"), disk.get("total_bytes")
            if free is not None and not fh.disk_full(free, total, fraction=fh.DISK_CLEAR_FRACTION):
                return f"checkpoint root {key} has {free / 2**30:.1f} GiB free again"
    return None


def settle_conditions(*, now: datetime) -> list[str]:
    """Resolve each open condition that cleared; returns their nodes. The node sweep calls
    it every second: with no condition open, one query."""
    open_ = list(
        Incident.objects.filter(group=None, kind__in=KINDS)
        .exclude(state=IncidentState.RESOLVED)
        .select_related("node")
    )
    cleared = []
    for incident in open_:
        why = _cleared(incident)
        if why is not None:
            _resolve(incident.pk, why, now=now)
            cleared.append(incident.node.name if incident.node else "")
    return cleared


@transaction.atomic
def _resolve(incident_id: int, why: str, *, now: datetime) -> None:
    incident = Incident.objects.select_for_update(no_key=True).get(pk=incident_id)
    if incident.state == IncidentState.RESOLVED:
        return
    resolve_held(incident, actor=SYSTEM, reason=why, now=now)
    if incident.node_id is not None:
        record_repair_evidence(
            node_id=incident.node_id,
            evidence=fh.CONDITION_CLEARED,
            actor=SYSTEM,
            now=now,
            detail={"cleared": incident.kind, "incident": incident.pk, "why": why},
        )


def others_with(incident: Incident) -> int:
    """How many other nodes have the same condition open now: the same checkpoint root
    full (a shared filesystem), or any port down (the fabric)."""
    others = (
        Incident.objects.filter(group=None, kind=incident.kind)
        .exclude(state=IncidentState.RESOLVED)
        .exclude(node=incident.node_id)
    )
    if incident.kind == DISK_FULL:
        key = ((incident.root_cause or {}).get("evidence") or {}).get("key")
        others = others.filter(root_cause__evidence__key=key)
    return others.values("node").distinct().count()
