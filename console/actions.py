"""The one write path for console state: node health, diagnosis results, incidents.

Every function is keyword-only, atomic, and publishes live events only after commit.
(Remediation actions and approvals live in console.remediation, the same way.)
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q

from console import events, live
from console.choices import IncidentState
from console.models import Alert, ConsistencyGroup, Incident, IncidentComment, Node

log = logging.getLogger(__name__)

# An incident resolves once its root cause has been absent this long (flap damping), and a
# root cause that comes back within REOPEN_WITHIN of its resolve reopens the same incident.
SETTLE = timedelta(seconds=15)
REOPEN_WITHIN = timedelta(minutes=10)


def _on_commit_publish(channel: str, kind: str, data: Any) -> None:
    transaction.on_commit(lambda: live.publish(channel, kind, data))


@transaction.atomic
def set_node_health(*, name: str, health: str, actor: Any | None) -> None:
    updated = Node.objects.filter(name=name).exclude(health=health).update(health=health)
    if updated:
        from console.queries import node_payloads

        def publish() -> None:
            for payload in node_payloads(names=[name]):
                live.publish(events.FLEET, "node.changed", payload)

        transaction.on_commit(publish)


def incident_payload(incident: Incident) -> dict[str, Any]:
    return {
        "id": incident.pk,
        "group": incident.group.name if incident.group else None,
        "generation": incident.generation,
        "state": incident.state,
        "kind": incident.kind,
        "subject": incident.subject,
        "role": incident.role,
        "severity": incident.severity,
        "summary": incident.summary,
        "symptom_count": incident.symptom_count,
        "opened_at": incident.opened_at.isoformat(),
        "resolved_at": incident.resolved_at.isoformat() if incident.resolved_at else None,
        "recovery": incident.recovery,
        "version": incident.version,
    }


@transaction.atomic
def record_diagnosis(*, group_name: str, diagnosis: Any, now: datetime) -> list[int]:
    """Fold findings into incidents: one per root cause (or undetermined cluster).

    Returns the ids of incidents opened or changed. Re-running with the same findings
    changes nothing (idempotent under Celery redelivery).
    """
    group = ConsistencyGroup.objects.select_for_update().get(name=group_name)
    findings = [f.to_dict() for f in diagnosis.findings]
    by_id = {f["id"]: f for f in findings}
    heads, followers = _fold(findings, by_id)

    changed: list[int] = []
    live_fps: set[str] = set()
    for head in heads:
        live_fps.add(head["fingerprint"])
        incident, was_changed = _upsert_incident(group, head, followers[head["id"]], now)
        if was_changed:
            changed.append(incident.pk)
    for incident in group.incidents.exclude(state=IncidentState.RESOLVED).exclude(
        fingerprint__in=live_fps
    ):
        if _settle(incident, now):
            changed.append(incident.pk)

    group.summary = {
        **group.summary,
        **_summary(diagnosis),
        "diagnosed_at": now.isoformat(),
        "finding_count": len(by_id),
    }
    group.save(update_fields=["summary"])
    if changed:
        payloads = [
            incident_payload(i)
            for i in Incident.objects.filter(pk__in=changed).select_related("group")
        ]
        for payload in payloads:
            _on_commit_publish(events.group_channel(group.name), "incident.changed", payload)
            _on_commit_publish(events.FLEET, "incident.changed", payload)
    _on_commit_publish(events.group_channel(group.name), "group.changed", {"name": group.name})
    return changed


def _fold(
    findings: list[dict[str, Any]], by_id: dict[str, dict[str, Any]]
) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """Group findings into incidents: each head (a root cause, or an undetermined finding
    that nothing else explains) with everything whose `caused_by` chain leads to it."""

    def head_of(f: dict[str, Any], seen: frozenset[str] = frozenset()) -> dict[str, Any]:
        for cause in f["caused_by"]:
            if cause in by_id and cause not in seen:
                return head_of(by_id[cause], seen | {f["id"]})
        return f

    heads: list[dict[str, Any]] = []
    followers: dict[str, list[dict[str, Any]]] = {}
    for f in findings:
        head = head_of(f)
        if head["id"] not in followers:
            heads.append(head)
            followers[head["id"]] = []
        if head is not f:
            followers[head["id"]].append(f)
    return heads, followers


def _summary(diagnosis: Any) -> dict[str, Any]:
    """What the group page and GET /groups/<name>/ show between diagnoses."""
    data = diagnosis.to_dict()
    return {
        "goodput": data["goodput"],
        "tail_ratio": data["tail_ratio"],
        "phase_medians_ms": data["phase_medians_ms"],
        "newest_valid_checkpoint": data["checkpoint"],
        "recovery_advice": data["recovery"],
    }


def _upsert_incident(
    group: ConsistencyGroup, head: dict[str, Any], symptoms: list[dict[str, Any]], now: datetime
) -> tuple[Incident, bool]:
    fp = head["fingerprint"]
    incident = (
        Incident.objects.select_for_update()
        .filter(group=group, fingerprint=fp)
        .filter(Q(resolved_at=None) | Q(resolved_at__gte=now - REOPEN_WITHIN))
        .order_by("-opened_at")
        .first()
    )
    created = incident is None
    if incident is None:
        incident = Incident(
            group=group,
            generation=group.generation,
            fingerprint=fp,
            opened_at=now,
            timeline={"first_evidence": head["first_seen"], "detected": now.isoformat()},
        )
    before = (incident.state, incident.symptom_count, incident.severity, incident.clear_since)
    if incident.state == IncidentState.RESOLVED:
        incident.state = IncidentState.OPEN
        incident.resolved_at = None
        incident.timeline = {**incident.timeline, "reopened": now.isoformat()}
    incident.kind, incident.subject = head["kind"], head["subject"]
    incident.role, incident.severity = head["role"], head["severity"]
    incident.summary = head["summary"][:512]
    incident.root_cause = head
    incident.recovery = head.get("recovery") or {}
    incident.symptom_count = len(symptoms)
    incident.clear_since = None
    after = (incident.state, incident.symptom_count, incident.severity, incident.clear_since)
    changed = created or before != after
    if changed:
        incident.version += 0 if created else 1
    try:
        with transaction.atomic():
            incident.save()
    except IntegrityError:
        # Another worker opened it first: the partial unique index decided; update theirs.
        incident = Incident.objects.get(group=group, fingerprint=fp, resolved_at=None)
        changed = False
    _sync_alerts(incident, [head, *symptoms], now)
    return incident, changed


def _sync_alerts(incident: Incident, findings: list[dict[str, Any]], now: datetime) -> None:
    existing = {a.finding_id: a for a in incident.alerts.all()}
    seen = set()
    new, updated = [], []
    for f in findings:
        seen.add(f["id"])
        alert = existing.get(f["id"])
        if alert is None:
            new.append(
                Alert(
                    incident=incident,
                    finding_id=f["id"],
                    kind=f["kind"],
                    subject=f["subject"],
                    role=f["role"],
                    severity=f["severity"],
                    summary=f["summary"][:512],
                    caused_by=f["caused_by"],
                    evidence=f["evidence"],
                    first_seen=f["first_seen"],
                    last_seen=f["last_seen"],
                )
            )
        elif not alert.active or alert.last_seen.isoformat() != f["last_seen"]:
            alert.active, alert.last_seen, alert.evidence = True, f["last_seen"], f["evidence"]
            updated.append(alert)
    for fid, alert in existing.items():
        if fid not in seen and alert.active:
            alert.active = False
            updated.append(alert)
    Alert.objects.bulk_create(new, ignore_conflicts=True)
    if updated:
        Alert.objects.bulk_update(updated, ["active", "last_seen", "evidence"])


def _settle(incident: Incident, now: datetime) -> bool:
    """The root cause is gone: start the settle clock, resolve once it has run out."""
    if incident.clear_since is None:
        incident.clear_since = now
        incident.save(update_fields=["clear_since", "updated_at"])
        return False
    if now - incident.clear_since < SETTLE:
        return False
    incident.state = IncidentState.RESOLVED
    incident.resolved_at = now
    incident.version += 1
    incident.timeline = {**incident.timeline, "resolved": now.isoformat()}
    incident.save(update_fields=["state", "resolved_at", "version", "timeline", "updated_at"])
    incident.alerts.filter(active=True).update(active=False)
    return True


class IncidentChangeError(ValueError):
    """A person's change to an incident that cannot apply (stale version, resolved...)."""


def _locked_incident(incident_id: int, expected_version: int | None) -> Incident:
    incident = (
        Incident.objects.select_for_update(of=("self",)).select_related("group").get(pk=incident_id)
    )
    # Versioned updates: an acknowledge that raced an auto-resolve must not un-resolve it.
    if expected_version is not None and incident.version != expected_version:
        raise IncidentChangeError(
            f"incident #{incident_id} changed (version {incident.version}, you saw "
            f"{expected_version}): reload and try again"
        )
    return incident


def _publish_incident(incident: Incident) -> None:
    payload = incident_payload(incident)
    if incident.group is not None:
        _on_commit_publish(events.group_channel(incident.group.name), "incident.changed", payload)
    _on_commit_publish(events.FLEET, "incident.changed", payload)


@transaction.atomic
def acknowledge_incident(
    *, incident_id: int, actor: Any, now: datetime, expected_version: int | None = None
) -> Incident:
    incident = _locked_incident(incident_id, expected_version)
    if incident.state == IncidentState.RESOLVED:
        raise IncidentChangeError(f"incident #{incident_id} is already resolved")
    if incident.state == IncidentState.ACKNOWLEDGED:
        return incident
    incident.state = IncidentState.ACKNOWLEDGED
    incident.acknowledged_by, incident.acknowledged_at = actor, now
    incident.version += 1
    incident.timeline = {**incident.timeline, "acknowledged": now.isoformat()}
    incident.save(
        update_fields=["state", "acknowledged_by", "acknowledged_at", "version", "timeline",
                       "updated_at"]
    )  # fmt: skip
    _publish_incident(incident)
    return incident


@transaction.atomic
def assign_incident(
    *, incident_id: int, assignee: Any, actor: Any, expected_version: int | None = None
) -> Incident:
    incident = _locked_incident(incident_id, expected_version)
    incident.assignee = assignee
    incident.version += 1
    incident.save(update_fields=["assignee", "version", "updated_at"])
    _publish_incident(incident)
    return incident


@transaction.atomic
def comment_on_incident(*, incident_id: int, actor: Any, body: str) -> IncidentComment:
    text = body.strip()
    if not text:
        raise IncidentChangeError("a comment cannot be empty")
    if len(text) > 4000:
        raise IncidentChangeError(f"a comment is at most 4000 characters, got {len(text)}")
    incident = _locked_incident(incident_id, None)
    comment = IncidentComment.objects.create(incident=incident, author=actor, body=text)
    _publish_incident(incident)
    return comment


SLO_KEYS = {"ttft_ms_p99", "tpot_ms_p99", "e2e_ms_p99", "goodput_target"}


class SloError(ValueError):
    """An SLO value we cannot use; the message names the key, the value and the range."""


def _validated_slo(raw: dict[str, Any]) -> dict[str, float]:
    unknown = sorted(set(raw) - SLO_KEYS)
    if unknown:
        raise SloError(f"unknown SLO key(s) {', '.join(unknown)}; allowed: {sorted(SLO_KEYS)}")
    out: dict[str, float] = {}
    for key, value in raw.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SloError(f"{key} must be a number, got {value!r}")
        if key == "goodput_target" and not 0 < value <= 1:
            raise SloError(f"goodput_target must be in (0, 1], got {value}")
        if key != "goodput_target" and not 0 < value <= 3_600_000:
            raise SloError(f"{key} must be a positive number of milliseconds, got {value}")
        out[key] = float(value)
    return out


@transaction.atomic
def set_group_slo(*, group_name: str, slo: dict[str, Any], actor: Any, now: datetime) -> Any:
    """Replace a serving group's SLO overrides (absent keys fall back to defaults)."""
    from console.remediation import actor_name, audit

    values = _validated_slo(slo)
    group = ConsistencyGroup.objects.select_for_update().get(name=group_name)
    before = group.slo
    group.slo = values
    group.save(update_fields=["slo"])
    audit(actor=actor_name(actor), verb="group.slo_changed", obj=group, now=now,
          data={"before": before, "after": values})  # fmt: skip
    _on_commit_publish(events.group_channel(group.name), "group.changed", {"name": group.name})
    from console.live import schedule_diagnosis

    transaction.on_commit(lambda: schedule_diagnosis(group.name))
    return group
