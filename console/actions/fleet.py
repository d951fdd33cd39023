"""Fleet state the console changes: node health, marks, GPU isolation and the health lifecycle.

The lifecycle (console.policy.fleet_health decides every move): a fault that needs repair
latches on the GPU and its node and opens a fleet-scope incident (`latch_fault`); repair
evidence starts a validation window (`record_repair_evidence`); a take-out action moves it
out of service with its owner (`mark_out_of_service`); a return action or an approver puts
it back (`mark_returned`, `return_to_service`). Every move is a HealthEvent row and an
audit row in the same transaction.

Owns the writes to Node and Device rows outside ingest's hot path (ingest's COPY and
upserts record what agents report), each audited with its actor and followed by a
`node.changed` push after commit. It must not decide whether a change is wise: the
sweep (health) and a succeeded remediation action (marks) call in.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet

from agents import vocab
from console import events, formats, queries
from console.actions.audit import actor_name, audit, require
from console.actions.errors import ChangeError, NotFound
from console.actions.incidents import publish_incident, resolve_held
from console.choices import Health, IncidentState
from console.models import Device, HealthEvent, Incident, Node
from console.policy import fleet_health as fh
from console.policy.roles import Permission
from console.roles import Actor

NodeMark = Literal["quarantined", "cordoned"]


def publish_node(name: str) -> None:
    """Push the node's fleet card once the transaction commits."""
    publish_nodes([name])


def publish_nodes(names: list[str]) -> None:
    """Push these nodes' fleet cards once the transaction commits: one read for all."""

    def publish() -> None:
        for payload in queries.node_payloads(names=names):
            events.publish(events.FLEET, "node.changed", payload)

    transaction.on_commit(publish)


@transaction.atomic
def set_node_health(*, name: str, health: str, actor: str, now: datetime, reason: str = "") -> bool:
    """Set a node's health (e.g. the sweep marks a silent node down); False if unchanged.

    `actor` is the name on the audit entry: "system" for the sweep.
    """
    locked = Node.objects.select_for_update(no_key=True)
    node = locked.filter(name=name).exclude(health=health).first()
    if node is None:
        return False
    before = node.health
    node.health = health
    node.save(update_fields=["health"])
    audit(
        actor=actor,
        verb="node.health",
        obj=node,
        reason=reason,
        now=now,
        data={"before": before, "after": health},
    )
    if health == Health.DOWN:
        _silent_incident(node, reason=reason, now=now)
    publish_node(name)
    return True


SILENT = "silent"
NODE_SILENT = "node_silent"


def _silent_incident(node: Node, *, reason: str, now: datetime) -> None:
    """A silent node (agent gone) is a node incident too: opened by the sweep, resolved
    when the node reports again (`node_reporting`). The groups on it that find it down
    are its symptoms: their incidents link to it and wait for its page (one page for the
    node, not one per group: a node hosting 20 young jobs opened 20 critical incidents)."""
    fingerprint = f"{SILENT}:{node.name}"
    if (
        Incident.objects.filter(group=None, node=node, fingerprint=fingerprint)
        .exclude(state=IncidentState.RESOLVED)
        .exists()
    ):
        return
    incident = Incident.objects.create(
        node=node,
        fingerprint=fingerprint,
        kind=NODE_SILENT,
        subject=f"node:{node.name}",
        role="root_cause",
        severity="major",
        opened_at=now,
        summary=f"{node.name} stopped reporting ({reason or 'agent silent'})"[:512],
        root_cause={
            "kind": NODE_SILENT,
            "subject": f"node:{node.name}",
            "node": node.name,
            "evidence": {"last_seen": node.last_seen.isoformat() if node.last_seen else None},
        },
        timeline={"detected": now.isoformat()},
    )
    _link_silent_groups(incident, [node.name])
    publish_incident(incident)


FLEET_SILENT = "fleet_silent"
_LIVE = (IncidentState.OPEN, IncidentState.ACKNOWLEDGED)


def _fleet_silences() -> QuerySet[Incident]:
    return Incident.objects.filter(state__in=_LIVE, kind=FLEET_SILENT, group=None, node=None)


def _open_fleet_silence() -> Incident | None:
    return _fleet_silences().select_for_update(no_key=True).order_by("opened_at").first()


@transaction.atomic
def mark_silent_together(
    *, names: list[str], reporting: int, actor: str, now: datetime, reason: str
) -> list[str]:
    """Many nodes silent at once (fleet_health.mass_silence): each is marked down and
    audited as `set_node_health` would, but ONE fleet-scope incident (no group, no node)
    names them all, instead of an incident and a page per node. A later batch of silent
    nodes while it is open joins it. Returns the nodes marked down."""
    nodes = list(
        Node.objects.select_for_update(no_key=True)
        .filter(name__in=names)
        .exclude(health=Health.DOWN)
        .order_by("name")
    )
    marked = [node.name for node in nodes]
    if not nodes:
        return []
    Node.objects.filter(pk__in=[node.pk for node in nodes]).update(health=Health.DOWN)
    for node in nodes:
        audit(
            actor=actor,
            verb="node.health",
            obj=node,
            reason=reason,
            now=now,
            data={"before": node.health, "after": vocab.HEALTH_DOWN, "together": len(nodes)},
        )
    incident = _open_fleet_silence()
    silent = sorted({*marked, *(incident.root_cause.get("nodes", []) if incident else [])})
    summary = (
        f"{len(silent)} nodes stopped reporting together ({reason}): more likely the path "
        "to Faultline (ingest, a proxy, the network) than a fault on each node"
    )[:512]
    cause = {
        "kind": FLEET_SILENT,
        "subject": "fleet",
        "nodes": silent,
        "evidence": {"silent": len(silent), "reporting_before": reporting},
    }
    if incident is None:
        incident = Incident.objects.create(
            fingerprint=FLEET_SILENT,
            kind=FLEET_SILENT,
            subject="fleet",
            role="root_cause",
            severity="critical",
            opened_at=now,
            summary=summary,
            root_cause=cause,
            timeline={"detected": now.isoformat()},
        )
    else:
        incident.summary, incident.root_cause = summary, cause
        incident.version += 1
        incident.save(update_fields=["summary", "root_cause", "version"])
    _link_silent_groups(incident, marked)
    publish_incident(incident)
    publish_nodes(marked)
    return marked


# A group's findings about a node that only went quiet: under a fleet silence they are the
# fleet's, not each node's (every group on the silent nodes finds each node "down").
SILENCE_KINDS = frozenset({"node_down", "agent_silent"})


def open_silence_of(node_name: str) -> Incident | None:
    """The open silence that owns a group's node_down or agent_silent on `node_name` (it is
    linked as their root incident): the fleet silence that names the node, else the
    node's own silent-node incident."""
    fleet = _fleet_silences().filter(root_cause__nodes__contains=[node_name]).first()
    if fleet is not None:
        return fleet
    return (
        Incident.objects.filter(
            group=None, node__name=node_name, fingerprint=f"{SILENT}:{node_name}", state__in=_LIVE
        )
        .order_by("-opened_at")
        .first()
    )


def _link_silent_groups(incident: Incident, names: list[str]) -> None:
    """Open group incidents that blame one of these silent nodes name the silence. A
    node's own silence pages as the most severe of the groups it holds (critical when a
    job is down there), since their pages wait for its."""
    linked = (
        Incident.objects.filter(
            group__isnull=False,
            kind__in=SILENCE_KINDS,
            root_cause__evidence__node__in=names,
            root_incident__isnull=True,
        )
        .exclude(state=IncidentState.RESOLVED)
        .update(root_incident=incident)
    )
    if linked and incident.kind == NODE_SILENT:
        raise_severity(incident, "critical")


def raise_severity(incident: Incident, severity: str) -> None:
    """A node's silence is as severe as the worst group incident waiting for its page."""
    if incident.severity != "critical" and severity == "critical":
        incident.severity = "critical"
        incident.version += 1
        incident.save(update_fields=["severity", "version", "updated_at"])
        publish_incident(incident)


def held_by_fleet_silence(incident: Incident) -> bool:
    """Whether the incident's pages wait for the silence it is part of: one page for the
    fleet (16 nodes of one job quiet together opened 16 critical node_down incidents), or
    for the node (a node hosting 20 jobs opened 20). Paged as usual if it is still open
    once the silence resolves."""
    root = incident.root_incident
    return root is not None and root.kind in (FLEET_SILENT, NODE_SILENT) and root.state in _LIVE


def settle_fleet_silence(*, actor: str, now: datetime) -> list[str] | None:
    """Resolve the open fleet silence once what is left of it is no longer one: the
    nodes still silent (not reporting again) each get their own silent-node incident,
    as if they had gone quiet alone. None while none is open or it still holds; else the
    nodes still silent. The sweep calls it every second: with none open, one read."""
    if not _fleet_silences().exists():
        return None
    with transaction.atomic():
        return _settle_fleet_silence(actor=actor, now=now)


def _settle_fleet_silence(*, actor: str, now: datetime) -> list[str] | None:
    incident = _open_fleet_silence()
    if incident is None:
        return None
    names = list(incident.root_cause.get("nodes", []))
    still = list(Node.objects.filter(name__in=names, health=Health.DOWN).order_by("name"))
    reporting = Node.objects.exclude(health=Health.DOWN).count() + len(still)
    if still and fh.mass_silence(len(still), reporting):
        return None
    for node in still:
        _silent_incident(node, reason="still silent after the fleet's silence ended", now=now)
    why = f"{len(names) - len(still)} of {len(names)} nodes report again" + (
        f"; {len(still)} still silent, each with an incident of its own" if still else ""
    )
    resolve_held(incident, actor=actor, reason=why, now=now)
    return [node.name for node in still]


@transaction.atomic
def register_node(*, name: str, actor: str, now: datetime) -> Node:
    """The node an agent token is issued for, made on first use (audited then); the node's
    agent fills in the rest when it first reports."""
    node, created = Node.objects.get_or_create(name=name)
    if created:
        audit(actor=actor, verb="node.registered", obj=node, now=now, reason="agent token issued")
        publish_node(name)
    return node


@transaction.atomic
def node_reporting(*, node_id: int, actor: str, now: datetime) -> int:
    """The node reports again: its silent-node incident resolves; how many did. A node
    taken out for its silence has its condition cleared (repair evidence)."""
    resolved = 0
    for incident in (
        Incident.objects.select_for_update(no_key=True)
        .filter(group=None, node_id=node_id, kind=NODE_SILENT)
        .exclude(state=IncidentState.RESOLVED)
    ):
        resolve_held(incident, actor=actor, reason="the node reports again", now=now)
        resolved += 1
    if resolved:
        record_repair_evidence(
            node_id=node_id,
            evidence=fh.CONDITION_CLEARED,
            actor=actor,
            now=now,
            detail={"cleared": NODE_SILENT},
        )
    return resolved


@transaction.atomic
def mark_node(*, node_id: int, mark: NodeMark, actor: str, reason: str, now: datetime) -> None:
    """Mark a node quarantined or cordoned (the effect of a succeeded action)."""
    node = Node.objects.select_for_update(no_key=True).get(pk=node_id)
    setattr(node, mark, True)
    node.save(update_fields=[mark])
    audit(actor=actor, verb=f"node.{mark}", obj=node, now=now, reason=reason)
    publish_node(node.name)


@transaction.atomic
def isolate_gpu(*, uuid: str, actor: str, reason: str, now: datetime) -> None:
    """Mark a GPU isolated (the effect of a succeeded isolate_gpu action)."""
    Device.objects.filter(uuid=uuid).update(isolated=True)
    audit(
        actor=actor,
        verb="gpu.isolated",
        object_type="device",
        object_id=uuid,
        now=now,
        reason=reason,
    )


# -- the health lifecycle (console.policy.fleet_health decides; this stores) ---------------
def health_policy() -> fh.HealthPolicy:
    return fh.HealthPolicy(
        validation_window=timedelta(seconds=settings.FLEET_VALIDATION_WINDOW_S),
        repeat_faults=settings.FLEET_REPEAT_FAULTS,
        repeat_window=timedelta(days=settings.FLEET_REPEAT_WINDOW_DAYS),
    )


_REPAIR_RANK = {r: i for i, r in enumerate(fh.Repair)}  # none < reset < reboot < operator


def _stronger(a: str, b: str) -> str:
    a, b = a or fh.Repair.NONE, b or fh.Repair.NONE
    return a if _REPAIR_RANK[fh.Repair(a)] >= _REPAIR_RANK[fh.Repair(b)] else b


def _subject(node: Node, device: Device | None) -> str:
    return f"{node.name} GPU {device.index}" if device is not None else node.name


def _move_health(
    row: Node | Device,
    node: Node,
    target: fh.HealthState,
    *,
    kind: str,
    reason: str,
    actor: str,
    now: datetime,
    evidence: dict[str, Any] | None = None,
) -> None:
    """One lifecycle move of a node or a GPU: checked, stored, history row, audit row."""
    device = row if isinstance(row, Device) else None
    before = row.lifecycle
    if before != target:
        fh.check_move(before, target)
        row.lifecycle_since = now
    row.lifecycle = target
    row.lifecycle_reason = reason[:512]
    row.lifecycle_by = actor[:160]
    if evidence is not None:
        row.lifecycle_evidence = evidence
    row.save()
    HealthEvent.objects.create(
        node=node,
        gpu=device.uuid if device else "",
        kind=kind,
        before=before,
        after=target,
        reason=reason[:512],
        evidence=evidence or {},
        actor=actor[:160],
        at=now,
    )
    audit(
        actor=actor,
        verb=f"{'gpu' if device else 'node'}.lifecycle",
        now=now,
        reason=reason,
        object_type="device" if device else "node",
        object_id=device.uuid if device else str(node.pk),
        data={"kind": kind, "before": before, "after": str(target)},
    )


@dataclass(frozen=True)
class Latch:
    """What latching a fault did: the incident it opened or updated, whether it started a
    new fault episode and whether the hardware is now flagged for replacement."""

    incident_id: int
    new_episode: bool
    flagged: bool


@transaction.atomic
def latch_fault(
    *,
    node_id: int,
    event: str,
    actor: str,
    now: datetime,
    gpu: str = "",
    code: int | None = None,
    recovery_action: str | None = None,
    detail: str = "",
    evidence: dict[str, Any] | None = None,
) -> Latch | None:
    """A device event that needs repair latches a fault on its GPU and node and opens the
    node's incident, whether or not a job runs there. None when it needs no repair (an
    application Xid): nothing latches. A clean sample never calls back out of it."""
    needed = fh.repair_needed(event, code, recovery_action)
    if needed == fh.Repair.NONE:
        return None
    node = Node.objects.select_for_update(no_key=True).get(pk=node_id)
    devices = Device.objects.select_for_update(no_key=True)
    device = devices.filter(uuid=gpu, node=node).first() if gpu else None
    what = f"Xid {code}" if event == "xid" else event.replace("_", " ")
    reason = f"{what} on {_subject(node, device)}: needs {needed.replace('_', ' ')}"
    if detail:
        reason += f" ({detail})"
    proof = {
        "event": event,
        "code": code,
        "recovery_action": recovery_action,
        "gpu": gpu,
        "detail": detail[:256],
        **(evidence or {}),
    }
    new_episode = False
    for row in (device, node):
        if row is None:
            continue
        episode = row.lifecycle not in (fh.HealthState.FAULTED, fh.HealthState.OUT_OF_SERVICE)
        row.repair_needed = _stronger(row.repair_needed, needed) if not episode else needed
        if episode:
            new_episode = new_episode or row is (device or node)
            target = fh.HealthState.FAULTED
            _move_health(
                row, node, target, kind="fault", reason=reason, actor=actor, now=now, evidence=proof
            )
        else:
            row.save(update_fields=["repair_needed"])
    flagged = False
    if new_episode:
        flagged = _flag_repeat_offender(node, device, gpu=gpu, actor=actor, now=now)
    incident = _node_incident(
        node,
        device,
        event=event,
        reason=reason,
        proof=proof,
        now=now,
        new_episode=new_episode,
        flagged=flagged,
    )
    publish_node(node.name)
    return Latch(incident.pk, new_episode, flagged)


def _fault_episodes(node: Node, since: datetime) -> list[datetime]:
    """When each fault episode of the node began, on any of its GPUs or its own: a GPU's
    episode is its GPU row's fault event (the node's row that latched with it is the same
    episode), a node-level fault (no GPU) the node row's."""
    rows = HealthEvent.objects.filter(node=node, kind="fault", at__gte=since).values_list(
        "at", "gpu", "evidence__gpu"
    )
    return [at for at, gpu, of in rows if gpu or not of]


def _flag_repeat_offender(
    node: Node, device: Device | None, *, gpu: str, actor: str, now: datetime
) -> bool:
    """Flag the GPU and node for replacement after FAULTLINE_REPEAT_FAULTS faults of the GPU
    in the window, or the node alone after as many faults of the node spread over its
    GPUs (its board, power or cooling, as surely as one GPU's repeats). True if flagged."""
    p = health_policy()
    since = now - p.repeat_window
    faults = list(
        HealthEvent.objects.filter(node=node, gpu=gpu, kind="fault", at__gte=since).values_list(
            "at", flat=True
        )
    )
    row = device or node
    if not row.replace_flagged and fh.repeat_offender(faults, now, p):
        rows, what = [r for r in (device, node) if r is not None], "faults"
    elif not node.replace_flagged and fh.repeat_offender(
        faults := _fault_episodes(node, since), now, p
    ):
        rows, what = [node], "faults on the node's GPUs"
    else:
        return False
    for r in rows:
        r.replace_flagged = True
        r.save(update_fields=["replace_flagged"])
    why = (
        f"{len(faults)} {what} in {p.repeat_window.days} days: flagged for replacement; "
        "returning it needs an approver"
    )
    HealthEvent.objects.create(
        node=node,
        gpu=gpu if device in rows else "",
        kind="flagged",
        after=rows[0].lifecycle,
        reason=why,
        actor=actor,
        at=now,
    )
    audit(
        actor=actor,
        verb="node.flagged_for_replacement",
        obj=node,
        reason=why,
        now=now,
        data={"gpu": gpu, "faults": [t.isoformat() for t in faults]},
    )
    return True


def _node_incident(
    node: Node,
    device: Device | None,
    *,
    event: str,
    reason: str,
    proof: dict[str, Any],
    now: datetime,
    new_episode: bool,
    flagged: bool,
) -> Incident:
    """The node's (or GPU's) fleet-scope incident: one open per fingerprint, like a
    group's; group incidents on this node whose root cause is here link to it."""
    fingerprint = f"{HARDWARE}{device.uuid if device else node.name}"
    incident = (
        Incident.objects.select_for_update(no_key=True)
        .filter(group=None, node=node, fingerprint=fingerprint)
        .exclude(state=IncidentState.RESOLVED)
        .first()
    )
    created = incident is None
    if incident is None:
        incident = Incident(
            node=node,
            fingerprint=fingerprint,
            opened_at=now,
            role="root_cause",
            timeline={
                "first_evidence": proof.get("ts") or now.isoformat(),
                "detected": now.isoformat(),
            },
        )
    elif not new_episode and not flagged:
        return incident
    incident.kind = event
    incident.subject = f"gpu:{device.uuid}" if device else f"node:{node.name}"
    incident.severity = "critical"
    incident.summary = (reason + ("; flagged for replacement" if flagged else ""))[:512]
    incident.root_cause = {
        "kind": event,
        "subject": incident.subject,
        "evidence": proof,
        "node": node.name,
    }
    incident.symptom_count = 0 if created else incident.symptom_count + 1
    if not created:
        incident.version += 1
    incident.save()
    link_group_incidents(node=node, incident=incident)
    publish_incident(incident)
    return incident


HARDWARE_KINDS = vocab.HARDWARE_FAULT_KINDS
HARDWARE = "hardware:"  # a latched fault's node incident: hardware:<gpu uuid or node name>
# A node's conditions: its take-out latches the node until they clear (Repair.CONDITION).
CONDITION_KINDS = frozenset({"nic_down", "disk_full", NODE_SILENT})


def open_node_incident(node_name: str, *, hardware: bool = False) -> Incident | None:
    """The node's open fleet-scope incident (the newest), if any: a group's root cause.
    With `hardware`, only a latched hardware fault's (not a silence or a condition)."""
    found = Incident.objects.filter(group=None, node__name=node_name).exclude(
        state=IncidentState.RESOLVED
    )
    if hardware:
        found = found.filter(fingerprint__startswith=HARDWARE)
    return found.order_by("-opened_at").first()


def link_group_incidents(*, node: Node, incident: Incident) -> None:
    """Open group incidents whose root cause is a hardware fault on this node name it."""
    Incident.objects.filter(
        group__isnull=False,
        kind__in=HARDWARE_KINDS,
        root_cause__evidence__node=node.name,
        root_incident__isnull=True,
    ).exclude(state=IncidentState.RESOLVED).update(root_incident=incident)


_AWAITING = (fh.HealthState.FAULTED, fh.HealthState.OUT_OF_SERVICE, fh.HealthState.REPAIRING)


@transaction.atomic
def record_repair_evidence(
    *,
    node_id: int,
    evidence: str,
    actor: str,
    now: datetime,
    gpu: str = "",
    detail: dict[str, Any] | None = None,
) -> list[str]:
    """Evidence of repair: the node rebooted (a new boot_id) or a GPU was reset. Every
    latched GPU (and the node) whose fault this repair answers starts its validation
    window; returns the subjects that did ("node", or GPU uuids)."""
    node = Node.objects.select_for_update(no_key=True).get(pk=node_id)
    devices = list(Device.objects.select_for_update(no_key=True).filter(node=node))
    if gpu:
        devices = [d for d in devices if d.uuid == gpu]
    moved: list[str] = []
    why = {
        fh.Repair.NODE_REBOOT: "node rebooted",
        fh.Repair.GPU_RESET: "GPU reset",
        fh.CONDITION_CLEARED: "condition cleared",
    }.get(evidence, evidence)
    for d in devices:
        if d.lifecycle in _AWAITING and fh.repaired_by(d.repair_needed, evidence):
            _move_health(
                d,
                node,
                fh.HealthState.VALIDATING,
                kind="repair",
                actor=actor,
                now=now,
                reason=f"{why}; validating",
                evidence=detail or {},
            )
            moved.append(d.uuid)
    still = Device.objects.filter(node=node, lifecycle__in=_AWAITING).exists()
    if node.lifecycle in _AWAITING and not still and _node_repaired(node, evidence, moved):
        _move_health(
            node,
            node,
            fh.HealthState.VALIDATING,
            kind="repair",
            actor=actor,
            now=now,
            reason=f"{why}; validating",
            evidence=detail or {},
        )
        moved.append("node")
    if moved:
        publish_node(node.name)
    return moved


def _open_conditions(node: Node) -> QuerySet[Incident]:
    return Incident.objects.filter(group=None, node=node, kind__in=CONDITION_KINDS).exclude(
        state=IncidentState.RESOLVED
    )


def _node_repaired(node: Node, evidence: str, moved: list[str]) -> bool:
    """Whether the node itself (its GPUs no longer awaiting repair) may start validating:
    none of its conditions (silent, NIC down, disk full) is still open, and a fault of the
    node's own (a node-level incident: no GPU named) is answered by this evidence. A node
    latched only through its GPUs and conditions follows them."""
    if _open_conditions(node).exists():
        return False
    own = Incident.objects.filter(group=None, node=node, fingerprint=f"{HARDWARE}{node.name}")
    if own.exclude(state=IncidentState.RESOLVED).exists():
        return fh.repaired_by(node.repair_needed, evidence)
    return (
        bool(moved)
        or fh.repaired_by(node.repair_needed, evidence)
        or (evidence == fh.CONDITION_CLEARED)
    )


@transaction.atomic
def latch_condition(
    *, node_id: int, incident_id: int | None, actor: str, reason: str, now: datetime
) -> None:
    """Faultline took the node out for a condition (silent, NIC down, disk full): it
    latches (Repair.CONDITION), so it comes back only through validation once the
    condition clears. A node already latched by a fault keeps that need as well. A
    condition that cleared before the take-out finished counts as cleared now."""
    node = Node.objects.select_for_update(no_key=True).get(pk=node_id)
    if node.lifecycle in (fh.HealthState.HEALTHY, fh.HealthState.SUSPECT):
        node.repair_needed = fh.Repair.CONDITION
        _move_health(
            node,
            node,
            fh.HealthState.FAULTED,
            kind="condition",
            reason=reason,
            actor=actor,
            now=now,
            evidence={"incident": incident_id},
        )
    elif not node.repair_needed:
        node.repair_needed = fh.Repair.CONDITION
        node.save(update_fields=["repair_needed"])
    publish_node(node.name)


def _return_reason(node: Node, window: timedelta) -> str:
    ran = formats.duration(window.total_seconds())
    return f"{node.name} ran {ran} after repair with no fault ({node.lifecycle_reason})"


@transaction.atomic
def mark_returned(*, node_id: int, actor: str, reason: str, now: datetime, gpu: str = "") -> None:
    """The hardware is back in service (a succeeded uncordon/release, or an approver):
    the latched GPUs and the node go healthy, their incidents resolve. A GPU's return
    (`gpu`: a release_gpu) returns that GPU and resolves its incident only: never the
    node, whose own fault, conditions and cordon are returned by its uncordon."""
    node = Node.objects.select_for_update(no_key=True).get(pk=node_id)
    devices = Device.objects.select_for_update(no_key=True).filter(node=node)
    if gpu:
        devices = devices.filter(uuid=gpu)
        devices.filter(isolated=True).update(isolated=False)
    for d in devices.exclude(lifecycle="healthy"):
        _move_health(
            d, node, fh.HealthState.HEALTHY, kind="returned", reason=reason, actor=actor, now=now
        )
        d.repair_needed, d.taken_out_by, d.replace_flagged, d.isolated = "", "", False, False
        d.save(update_fields=["repair_needed", "taken_out_by", "replace_flagged", "isolated"])
    if gpu:
        for incident in (
            Incident.objects.select_for_update(no_key=True)
            .filter(group=None, node=node, fingerprint=f"{HARDWARE}{gpu}")
            .exclude(state=IncidentState.RESOLVED)
        ):
            resolve_held(incident, actor=actor, reason=reason, now=now)
        publish_node(node.name)
        return
    latched = Device.objects.filter(node=node).exclude(lifecycle="healthy").exists()
    if not latched:
        if node.lifecycle != fh.HealthState.HEALTHY:
            _move_health(
                node,
                node,
                fh.HealthState.HEALTHY,
                kind="returned",
                reason=reason,
                actor=actor,
                now=now,
            )
        node.repair_needed, node.taken_out_by, node.replace_flagged = "", "", False
        node.cordoned = node.quarantined = False
        node.save()
    for incident in (
        Incident.objects.select_for_update(no_key=True)
        .filter(group=None, node=node)
        .exclude(state=IncidentState.RESOLVED)
    ):
        uuid = incident.fingerprint.partition(":")[2]
        if (
            latched
            and uuid != node.name
            and Device.objects.filter(uuid=uuid, lifecycle="healthy").exists() is False
        ):
            continue
        resolve_held(incident, actor=actor, reason=reason, now=now)
    publish_node(node.name)


@transaction.atomic
def mark_out_of_service(
    *, node_id: int, taken_out_by: str, actor: str, reason: str, now: datetime, gpu: str = ""
) -> None:
    """A take-out action succeeded (Faultline's), or found the node already out (someone
    else's: `taken_out_by="scheduler"`): latched hardware moves to out_of_service."""
    node = Node.objects.select_for_update(no_key=True).get(pk=node_id)
    rows: list[Node | Device] = list(
        Device.objects.select_for_update(no_key=True).filter(
            node=node, **({"uuid": gpu} if gpu else {})
        )
    )
    if not gpu:
        rows.append(node)
    for row in rows:
        if row.lifecycle == fh.HealthState.FAULTED:
            _move_health(
                row,
                node,
                fh.HealthState.OUT_OF_SERVICE,
                kind="moved",
                reason=reason,
                actor=actor,
                now=now,
            )
        if isinstance(row, Node) or row.lifecycle != fh.HealthState.HEALTHY:
            row.taken_out_by = taken_out_by
            row.save(update_fields=["taken_out_by"])
    publish_node(node.name)


def validated_due(*, now: datetime) -> list[Node]:
    """Nodes whose validation window has passed with no fault (the sweep proposes them),
    that report, and whose repaired GPUs each reported after their repair: a new boot id
    alone says nothing of a GPU nobody has heard from since."""
    p = health_policy()
    due = list(
        Node.objects.filter(
            lifecycle=fh.HealthState.VALIDATING, lifecycle_since__lte=now - p.validation_window
        ).exclude(health=Health.DOWN)
    )
    if not due:
        return []
    repaired: dict[int, list[tuple[datetime | None, datetime | None]]] = {}
    for node_id, since, seen in Device.objects.filter(
        node__in=due, lifecycle=fh.HealthState.VALIDATING
    ).values_list("node_id", "lifecycle_since", "last_seen"):
        repaired.setdefault(node_id, []).append((since, seen))
    return [
        node
        for node in due
        if node.lifecycle_since is not None
        and fh.validation_passed(node.lifecycle_since, now, p, repaired.get(node.pk, []))
    ]


@transaction.atomic
def return_to_service(*, node_name: str, actor: Actor, reason: str, now: datetime) -> Node:
    """An approver states why the hardware is fixed: it returns whatever its state, a
    replacement flag or another party's cordon (audited with the reason)."""
    require(actor, Permission.RETURN_TO_SERVICE)
    if len(reason.strip()) < 3:
        raise ChangeError("returning hardware to service needs a reason: say what was repaired")
    node = Node.objects.filter(name=node_name).first()
    if node is None:
        raise NotFound(f"node {node_name} is not in the fleet inventory")
    who = actor_name(actor)
    if node.lifecycle not in (fh.HealthState.HEALTHY, fh.HealthState.VALIDATING):
        node.lifecycle = fh.HealthState.VALIDATING  # an operator's word is the repair
    for d in Device.objects.filter(node=node).exclude(lifecycle="healthy"):
        d.lifecycle = fh.HealthState.VALIDATING
        d.save(update_fields=["lifecycle"])
    node.save(update_fields=["lifecycle"])
    mark_returned(node_id=node.pk, actor=who, reason=f"{who}: {reason.strip()}", now=now)
    node.refresh_from_db()
    return node
