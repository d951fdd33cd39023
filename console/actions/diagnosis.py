"""Diagnosis results into incidents: the write half of the pipeline.

Owns how findings fold into incidents (one per root cause, or per undetermined cluster,
symptoms attached by their `caused_by` chain), the settle window before a resolve, the
reopen window, the alerts of each incident and the group's diagnosis summary. A root
cause that is a node's hardware fault links to the node's incident (`root_incident`): the
group's incident may resolve when the job moves on, the node's stays open until repaired.
One that blames a node quiet in a fleet silence links to that fleet incident. The actor
is the engine ("system"); nothing here is audited per finding (the incident timeline is
the record). It must not run the engine or read telemetry: console.pipeline does both.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q

from console import events, locks
from console.actions.fleet import (
    HARDWARE_KINDS,
    SILENCE_KINDS,
    open_node_incident,
    open_silence_of,
    raise_severity,
)
from console.actions.incidents import publish_incident
from console.choices import IncidentState
from console.diagnosis.engine import Diagnosis
from console.diagnosis.findings import MINOR, ROOT_CAUSE, Recovery
from console.models import Alert, ConsistencyGroup, Incident

log = logging.getLogger(__name__)

# An incident resolves once its root cause has been absent this long (flap damping), and a
# root cause that comes back within REOPEN_WITHIN of its resolve reopens the same incident.
SETTLE = timedelta(seconds=15)
REOPEN_WITHIN = timedelta(minutes=10)


@transaction.atomic
def record_diagnosis(*, group_name: str, diagnosis: Diagnosis, now: datetime) -> list[int]:
    """Fold findings into incidents: one per root cause (or undetermined cluster).

    Returns the ids of incidents opened or changed. Re-running with the same findings
    changes nothing (idempotent under Celery redelivery).
    """
    # FOR NO KEY UPDATE: passes exclude each other and a transition (FOR UPDATE) waits for
    # this one, but the group's own batches (FOR KEY SHARE, and rows that point at it) do
    # not: a pass stuck here (a frozen worker) must not hold its group's ingest.
    group = ConsistencyGroup.objects.select_for_update(no_key=True).get(name=group_name)
    if diagnosis.generation < group.generation:
        # Read before a restart committed: it judged a generation that has ended. Its
        # stall would open as an incident of the new one (seen at 16k ranks: it then held
        # the new generation's own stall); the next pass reads the new generation.
        return []
    findings = [f.to_dict() for f in diagnosis.findings]
    by_id = {f["id"]: f for f in findings}
    heads, followers = _fold(findings, by_id)

    changed: list[int] = _revise(group, heads, followers, now)
    live_fps: set[str] = set()
    for head in heads:
        live_fps.add(head["fingerprint"])
        incident, was_changed = _upsert_incident(
            group, head, followers[head["id"]], now, generation=diagnosis.generation
        )
        if was_changed:
            changed.append(incident.pk)
    for incident in group.incidents.exclude(state=IncidentState.RESOLVED).exclude(
        fingerprint__in=live_fps
    ):
        # The urgent lane wrote it from evidence newer than this pass's read: not this
        # pass's to settle (its alerts would flip off and on); the next pass judges it.
        located = incident.timeline.get("urgent_lane")
        if located and datetime.fromisoformat(located) > now:
            continue
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
        for incident in Incident.objects.filter(pk__in=changed).select_related("group"):
            publish_incident(incident)
    events.publish_on_commit(
        events.group_channel(group.name), "group.changed", {"name": group.name}
    )
    return changed


@transaction.atomic
def record_ended_generation(
    *, group_name: str, diagnosis: Diagnosis, now: datetime, judged_key: str
) -> list[int]:
    """A generation that ended before a pass judged its end (console.pipeline): open or
    update the incidents the engine found in it as of its end, in that generation. It
    settles nothing and leaves the group's summary to the ordinary pass, but for
    `judged_key` (the newest generation judged so: each ending is judged once); the next
    ordinary pass, of the new generation, settles these incidents as the job moved on.
    Returns the ids opened or changed."""
    group = ConsistencyGroup.objects.select_for_update(no_key=True).get(name=group_name)
    findings = [f.to_dict() for f in diagnosis.findings]
    by_id = {f["id"]: f for f in findings}
    heads, followers = _fold(findings, by_id)
    changed: list[int] = []
    for head in heads:
        incident, was_changed = _upsert_incident(
            group, head, followers[head["id"]], now, generation=diagnosis.generation
        )
        if was_changed:
            changed.append(incident.pk)
    judged = group.summary.get(judged_key)
    if not isinstance(judged, int) or judged < diagnosis.generation:
        group.summary = {**group.summary, judged_key: diagnosis.generation}
        group.save(update_fields=["summary"])
    if changed:
        for incident in Incident.objects.filter(pk__in=changed).select_related("group"):
            publish_incident(incident)
    return changed


# The urgent lane's wait for a row an ordinary pass holds, before its task retries: the
# lane's Xid-to-incident goal is 2 s (tests/system/test_chaos.py).
URGENT_LOCK_WAIT_MS = 500

# The urgent lane's incidents carry this until the group's full pass writes its advice.
ADVICE_PENDING = Recovery(
    auto_restart_safe=False,
    reason="restart advice follows the group's full diagnosis (this incident was opened from "
    "the evidence of the node that reported it)",
).to_dict()


@transaction.atomic
def record_located(
    *, group_name: str, diagnosis: Diagnosis, subjects: frozenset[str], now: datetime
) -> list[int]:
    """The urgent lane's write (console.pipeline.diagnose_urgent): open or update only the
    incidents of major root causes on `subjects` (the GPUs and nodes that reported an
    urgent event), from a diagnosis of just those nodes' evidence. It settles nothing,
    writes no group summary, prunes no alert and keeps what a full pass wrote (restart
    advice, symptom count): the group's full pass owns all of that. A new incident's advice
    is ADVICE_PENDING (not restart-safe) until then. Returns the ids opened or changed.

    It takes no lock on the group: the lane exists for the Xid that must not wait behind an
    ordinary pass, which may be stuck inside its transaction holding the group's row. One
    open incident per fingerprint is the database's (partial unique index), and an ordinary
    pass leaves alone what this lane wrote after its read (`urgent_lane`). A row such a pass
    holds (the same incident, judged by both) is waited for at most URGENT_LOCK_WAIT_MS:
    then console.locks.held_elsewhere(exc) and the task retries."""
    locks.wait_at_most(URGENT_LOCK_WAIT_MS)
    group = ConsistencyGroup.objects.get(name=group_name)
    findings = [f.to_dict() for f in diagnosis.findings]
    by_id = {f["id"]: f for f in findings}
    heads, followers = _fold(findings, by_id)
    changed: list[int] = []
    for head in heads:
        if head["role"] != ROOT_CAUSE or head["severity"] == MINOR:
            continue
        if head["subject"] not in subjects:
            continue
        incident, was_changed = _upsert_incident(
            group,
            {**head, "recovery": ADVICE_PENDING},
            followers[head["id"]],
            now,
            located=True,
            generation=diagnosis.generation,
        )
        incident.timeline = {**incident.timeline, "urgent_lane": now.isoformat()}
        incident.save(update_fields=["timeline", "updated_at"])
        if was_changed:
            changed.append(incident.pk)
    if changed:
        for incident in Incident.objects.filter(pk__in=changed).select_related("group"):
            publish_incident(incident)
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


def _revise(
    group: ConsistencyGroup,
    heads: list[dict[str, Any]],
    followers: dict[str, list[dict[str, Any]]],
    now: datetime,
) -> list[int]:
    """Revise provisional verdicts: an open incident whose verdict has not settled
    (Incident.verdict_settled) and whose root cause is now folded under another one (the
    peer's error that turned out to follow a rank's death, once the death's record came)
    becomes that root cause's incident: same incident, same page, the new root cause, the
    old one kept on its timeline. Several such incidents folding into one root cause: the
    oldest is revised, the others resolve into it. A settled incident is never revised (its
    verdict may have been acted on): it clears and resolves as before, and the new root
    cause opens its own. Returns the ids changed."""
    # Only the provisional incidents are locked (a pass already holds its heads' rows): the
    # settled ones are left to acknowledges and the escalation sweep.
    provisional = {
        i.fingerprint: i
        for i in group.incidents.select_for_update(no_key=True)
        .exclude(state=IncidentState.RESOLVED)
        .exclude(Incident.settled_at(now))
    }
    if not provisional:
        return []
    head_fps = {h["fingerprint"] for h in heads}
    changed: list[int] = []
    for head in heads:
        fp = head["fingerprint"]
        folded = {f["fingerprint"] for f in followers[head["id"]]} - head_fps
        moved = sorted(
            (i for f, i in provisional.items() if f in folded),
            key=lambda i: (i.opened_at, i.pk),
        )
        if not moved:
            continue
        into: int | None = (
            group.incidents.exclude(state=IncidentState.RESOLVED)
            .filter(fingerprint=fp)
            .values_list("pk", flat=True)
            .first()
        )
        if into is None:
            revised, moved = moved[0], moved[1:]
            was = {
                k: revised.root_cause.get(k) for k in ("kind", "subject", "summary", "fingerprint")
            }
            revised.timeline = {
                **revised.timeline,
                "revised": [
                    *revised.timeline.get("revised", []),
                    {
                        "at": now.isoformat(),
                        "from": was,
                        "to": {"kind": head["kind"], "subject": head["subject"]},
                    },
                ],
            }
            del provisional[revised.fingerprint]
            revised.fingerprint = fp
            revised.version += 1
            revised.save(update_fields=["fingerprint", "timeline", "version", "updated_at"])
            into = revised.pk
            changed.append(revised.pk)
        for other in moved:
            del provisional[other.fingerprint]
            other.state, other.resolved_at = IncidentState.RESOLVED, now
            other.version += 1
            other.timeline = {**other.timeline, "resolved": now.isoformat(), "merged_into": into}
            other.save(update_fields=["state", "resolved_at", "version", "timeline", "updated_at"])
            other.alerts.filter(active=True).update(active=False)
            changed.append(other.pk)
    return changed


def _summary(diagnosis: Diagnosis) -> dict[str, Any]:
    """What the group page and GET /groups/<name>/ show between diagnoses."""
    data = diagnosis.to_dict()
    return {
        "goodput": data["goodput"],
        "tail_ratio": data["tail_ratio"],
        "phase_medians_ms": data["phase_medians_ms"],
        "step_scale_ms": data["step_scale_ms"],
        "newest_valid_checkpoint": data["checkpoint"],
        "recovery_advice": data["recovery"],
        "serving_state": data["serving_state"],
        "utilisation": data["utilisation"],
    }


def _upsert_incident(
    group: ConsistencyGroup,
    head: dict[str, Any],
    symptoms: list[dict[str, Any]],
    now: datetime,
    located: bool = False,
    *,
    generation: int,
) -> tuple[Incident, bool]:
    """`located`: the urgent lane's partial view (record_located): an existing incident
    keeps its advice, its symptom count and its alerts; new alerts are added. A new
    incident belongs to `generation`, the one its findings were judged in."""
    fp = head["fingerprint"]
    # FOR NO KEY UPDATE: passes still exclude each other, but a row that points at the
    # incident (its escalation, a delivery, an alert) checks its foreign key at commit
    # with FOR KEY SHARE, which FOR UPDATE would hold until the pass commits.
    incident = (
        Incident.objects.select_for_update(no_key=True)
        .filter(group=group, fingerprint=fp)
        .filter(Q(resolved_at=None) | Q(resolved_at__gte=now - REOPEN_WITHIN))
        .order_by("-opened_at")
        .first()
    )
    created = incident is None
    if incident is None:
        incident = Incident(
            group=group,
            generation=generation,
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
    if created or not located:
        incident.recovery = head.get("recovery") or {}
        incident.symptom_count = len(symptoms)
    incident.clear_since = None
    where = (head.get("evidence") or {}).get("node")
    if head["kind"] in HARDWARE_KINDS and where and incident.root_incident_id is None:
        # The fault is the node's: its fleet-scope incident owns it, this one links to it.
        root = open_node_incident(str(where), hardware=True)
        incident.root_incident = root
    elif head["kind"] in SILENCE_KINDS and where and incident.root_incident_id is None:
        # The node is silent (alone, or one of many quiet together): the silence owns it.
        root = open_silence_of(str(where))
        incident.root_incident = root
        if root is not None:
            raise_severity(root, head["severity"])
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
    _sync_alerts(incident, [head, *symptoms], now, prune=not located)
    return incident, changed


def _sync_alerts(
    incident: Incident, findings: list[dict[str, Any]], now: datetime, prune: bool = True
) -> None:
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
        elif (
            not alert.active
            or alert.last_seen.isoformat() != f["last_seen"]
            or (alert.role, alert.caused_by) != (f["role"], f["caused_by"])
        ):
            # A revised verdict: the old root cause's alert is now a symptom of the new one.
            alert.active, alert.last_seen, alert.evidence = True, f["last_seen"], f["evidence"]
            alert.role, alert.severity, alert.caused_by = f["role"], f["severity"], f["caused_by"]
            alert.summary = f["summary"][:512]
            updated.append(alert)
    for fid, alert in existing.items():
        if prune and fid not in seen and alert.active:
            alert.active = False
            updated.append(alert)
    Alert.objects.bulk_create(new, ignore_conflicts=True)
    if updated:
        Alert.objects.bulk_update(
            updated, ["active", "last_seen", "evidence", "role", "severity", "caused_by", "summary"]
        )


def _settle(incident: Incident, now: datetime) -> bool:
    """The root cause is gone: start the settle clock, resolve once it has run out.

    Its alerts go inactive at once: `active` says the finding is in the newest diagnosis
    (a rolled-back canary's `stale_version` clears on the next window that shows the fixed
    version); only the incident waits out SETTLE, and a finding that returns re-activates."""
    if incident.clear_since is None:
        incident.clear_since = now
        incident.save(update_fields=["clear_since", "updated_at"])
        incident.alerts.filter(active=True).update(active=False)
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
