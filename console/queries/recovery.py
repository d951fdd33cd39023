"""Reads for the seed's recovery costs and the fleet's reliability record.

Owns turning an incident's records (its timeline, the group's transitions, steps and
checkpoint manifests, read through console.queries.telemetry) into the plain data of
console.diagnosis.recovery_costs, and the fleet's incidents into the plain data of
console.diagnosis.reliability. The computation is theirs; this module only reads and
shapes. `objectives_of` is where a group's RPO/RTO in force enter the costs. Writes nothing
(console.actions.recovery stores the costs).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import Min, Q, QuerySet

from agents import vocab
from console.choices import IncidentState
from console.diagnosis import recovery_costs as rc
from console.diagnosis import reliability
from console.diagnosis.findings import RISK_KINDS
from console.diagnosis.layers import layer_of
from console.models import ConsistencyGroup, Incident
from console.queries import objectives as group_objectives
from console.queries.telemetry import checkpoint_rows, lifecycle, node_evidence, step_rows

# Costs of a resolved incident are re-measured (console.pipeline.measure_recovery, a beat
# task) until they are final (the new generation caught up) or this long after it resolved.
MEASURE_FOR = timedelta(hours=1)
# The fleet report measures incidents this young live when they have no final costs yet.
LIVE_FOR = timedelta(hours=2)
TERMINAL_STATES = vocab.TERMINAL_GROUP_STATES
SERVING_SLO_KINDS = frozenset({"slo_breach"})


def _ts(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def objectives_of(group: ConsistencyGroup) -> dict[str, float | None]:
    """The group's recovery objectives in force (console.queries.objectives: operator over
    launcher over pool default), in the costs' units: RTO (s), RPO (steps or s)."""
    eff = group_objectives.effective(group)

    def num(key: str) -> float | None:
        raw = eff.get(key)
        if isinstance(raw, (int, float)) and not isinstance(raw, bool) and raw >= 0:
            return float(raw)
        return None

    minutes = num("rpo_minutes")
    return {
        "rto_s": num("rto_s"),
        "rpo_steps": num("rpo_steps"),
        "rpo_s": None if minutes is None else minutes * 60.0,
    }


def incident_records(incident: Incident) -> rc.IncidentRecords | None:
    """The incident's records as plain data; None for a fleet-scope (node) incident or a
    risk (`rpo_exceeded`, `rto_exceeded`: nothing was interrupted, so nothing to cost)."""
    group = incident.group
    if group is None or incident.kind in RISK_KINDS:
        return None
    timeline = incident.timeline or {}
    first = _ts(timeline.get("first_evidence")) or incident.opened_at.timestamp()
    detected = _ts(timeline.get("detected")) or incident.opened_at.timestamp()
    first = min(first, detected)
    since = datetime.fromtimestamp(first, UTC)
    transitions = [
        rc.TransitionPoint(
            ts=t["ts"].timestamp(),
            generation=t["generation"],
            to_state=t["to_state"],
            from_state=t["from_state"],
            world_size=t["world_size"],
            data_cursor=t["data_cursor"],
        )
        for t in lifecycle.recovery_transitions(group, since - timedelta(seconds=1))
    ]
    g = incident.generation
    restart = next((t for t in transitions if t.to_state == "running" and t.generation > g), None)
    steps: list[rc.StepPoint] = []
    checkpoints: list[rc.CheckpointPoint] = []
    world: int | None = next(
        (t.world_size for t in transitions if t.generation == g and t.world_size), None
    )
    # Every read below is bounded by the interruption's own rows (the work thrown away and
    # redone), not by the window: a 16k-rank generation's window is every rank's step for
    # hours, and a resolved incident is measured every 30 s until its costs are final.
    failed_lo: datetime | None = None
    min_step: int | None = None
    if restart is not None:
        new_first = step_rows.first_step_of(group, restart.generation, since)
        if new_first is not None:
            min_step = new_first - 1
            saved = checkpoint_rows.checkpoints_at_step(group, min_step)
            failed_lo = _minus_skew(_resumed_at(group, g, min_step, since, saved))
            for c in saved:
                cursor = c["data_cursor"]
                checkpoints.append(
                    rc.CheckpointPoint(
                        ts=c["ts"].timestamp(),
                        checkpoint_id=c["checkpoint_id"],
                        step=c["step"],
                        phase=c["phase"],
                        data_cursor=cursor if isinstance(cursor, int) else None,
                    )
                )
        world = world or restart.world_size
    if min_step is None:
        # No redo to compare with yet: the failed generation's newest step is all it costs.
        failed_lo = _minus_skew(step_rows.newest_step_at(group, g, since))
    failed = step_rows.recovery_steps(group, g, since, min_step=min_step, lo=failed_lo)
    steps += _points(failed, g)
    if restart is not None and min_step is not None:
        redone = _redone(group, restart.generation, restart.ts, since, failed)
        steps += _points(redone, restart.generation)
    if world is None:
        world = max((r["ranks"] for r in failed), default=None) or group.world_size
    alerts = {a.kind for a in incident.alerts.all()} | {incident.kind}
    objectives = objectives_of(group)
    return rc.IncidentRecords(
        generation=g,
        first_evidence=first,
        detected=detected,
        steps=steps,
        transitions=transitions,
        checkpoints=checkpoints,
        world_size=world,
        slo_breached=bool(alerts & SERVING_SLO_KINDS) if group.kind == "serving" else None,
        rto_s=objectives["rto_s"],
        rpo_steps=None if objectives["rpo_steps"] is None else int(objectives["rpo_steps"]),
        rpo_s=objectives["rpo_s"],
    )


def _minus_skew(ts: datetime | None) -> datetime | None:
    return None if ts is None else ts - step_rows.STEP_SKEW


def _resumed_at(
    group: ConsistencyGroup,
    generation: int,
    step: int,
    since: datetime,
    saved: list[dict[str, Any]],
) -> datetime | None:
    """When the failed generation finished the step the restart resumed from: looked for
    just before that step's checkpoint first (a few of rank 0's rows), else in the window."""
    if saved:
        first = min(c["ts"] for c in saved)
        lo, hi = first - checkpoint_rows.CHECKPOINT_LAG, first + step_rows.STEP_SKEW
        found = step_rows.step_reached_at(group, generation, step, since, lo=lo, hi=hi)
        if found is not None:
            return found
    return step_rows.step_reached_at(group, generation, step, since)


def _redone(
    group: ConsistencyGroup,
    generation: int,
    launched: float,
    since: datetime,
    failed: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """The restored generation's steps until it caught up with the failed one's last step
    (what the redo costs are made of; steps after it are no longer recovery), all of them
    while it has not; and all of them if none of those was valid (the restore's end is its
    first valid step, wherever that lies)."""
    last = max((r["step"] for r in failed), default=None)
    lo = datetime.fromtimestamp(launched, UTC) - step_rows.STEP_SKEW
    caught_up = (
        None if last is None else step_rows.step_reached_at(group, generation, last, since, lo=lo)
    )
    if caught_up is None:
        return step_rows.recovery_steps(group, generation, since)
    rows = step_rows.recovery_steps(group, generation, since, hi=caught_up + step_rows.STEP_SKEW)
    if any(not r["bad"] for r in rows):
        return rows
    return step_rows.recovery_steps(group, generation, since)


def _points(rows: list[dict[str, Any]], generation: int) -> list[rc.StepPoint]:
    """Per-step aggregates as step points: a step counts when its last rank finished it."""
    return [
        rc.StepPoint(
            ts=r["ts"].timestamp(),
            generation=generation,
            rank=0,
            step=r["step"],
            tokens=int(r["tokens"] or 0),
            data_cursor=r["cursor"],
            valid=not r["bad"],
        )
        for r in rows
    ]


def measure(incident: Incident) -> dict[str, Any] | None:
    """The incident's five costs from its records now (None: a node incident)."""
    records = incident_records(incident)
    if records is None:
        return None
    costs = rc.recovery_costs(rc.marks_from_records(records)).to_dict()
    group = incident.group
    if not costs["restarted"] and group is not None:
        # No restart seen: final only once the job went on in the same generation or ended.
        went_on = group.generation == incident.generation and group.state == "running"
        ended = group.state in TERMINAL_STATES
        costs["complete"] = went_on or ended
    return costs


def costs_of(incident: Incident) -> dict[str, Any] | None:
    """What the page and REST show: the stored costs once final, else measured now."""
    stored = incident.costs or {}
    if stored.get("complete"):
        return stored
    return measure(incident) if incident.group_id else None


def to_measure(group_name: str | None, now: datetime) -> QuerySet[Incident]:
    """Resolved incidents (of the group, or the fleet's) whose costs are not final yet
    (and not too old)."""
    qs = Incident.objects.filter(state=IncidentState.RESOLVED, resolved_at__gte=now - MEASURE_FOR)
    if group_name is not None:
        qs = qs.filter(group__name=group_name)
    return (
        qs.filter(group__isnull=False)
        .exclude(role="symptom")
        .exclude(costs__contains={"complete": True})  # a missing key is NULL: not `=`
        .select_related("group")
        .prefetch_related("alerts")
    )


# -- the fleet's reliability record --------------------------------------------------------


def _place(incident: Incident) -> tuple[str | None, str | None]:
    """The node and GPU a root cause blames (evidence first, then its subject)."""
    ev = (incident.root_cause or {}).get("evidence") or {}
    node = ev.get("node") if isinstance(ev.get("node"), str) else None
    gpu = ev.get("gpu") if isinstance(ev.get("gpu"), str) else None
    kind, _, rest = incident.subject.partition(":")
    if kind == "node" and not node:
        node = rest
    if kind == "gpu" and not gpu:
        gpu = rest
    return node, gpu


def interruption_of(incident: Incident, costs: dict[str, Any]) -> reliability.Interruption:
    ev = (incident.root_cause or {}).get("evidence") or {}
    node, gpu = _place(incident)
    return reliability.Interruption(
        incident=incident.pk,
        group=incident.group.name if incident.group else "",
        generation=incident.generation,
        kind=incident.kind,
        layer=layer_of(incident.kind, ev),
        opened=incident.opened_at.timestamp(),
        restarted=bool(costs.get("restarted")),
        node=node,
        gpu=gpu,
        downtime_s=costs.get("downtime_s"),
        lost_work_s=costs.get("lost_work_s"),
        lost_tokens=costs.get("lost_tokens"),
        total_lost_gpu_hours=costs.get("total_lost_gpu_hours"),
    )


def exposure_of(start: datetime, now: datetime) -> reliability.Exposure:
    """The fleet's observed exposure in the window, in hours (node_evidence.exposure)."""
    seen = node_evidence.exposure(start, now)
    nodes = seen["nodes"]
    return reliability.Exposure(
        observed_hours=seen["minutes"] / 60.0,
        gpu_hours=sum(g for _, g in nodes.values()) / 60.0,
        node_hours=sum(n for n, _ in nodes.values()) / 60.0,
        per_node_hours={name: n / 60.0 for name, (n, _) in nodes.items()},
    )


def fleet_report(*, days: float, now: datetime) -> dict[str, Any]:
    """The reliability record of the last `days` days (console.diagnosis.reliability)."""
    start = now - timedelta(days=days)
    incidents = (
        Incident.objects.filter(group__isnull=False, opened_at__gte=start, opened_at__lt=now)
        .exclude(role="symptom")
        .select_related("group")
        .prefetch_related("alerts")
        .order_by("opened_at")
    )
    interruptions = []
    fresh = now - LIVE_FOR
    for incident in incidents:
        # Stored costs where the pipeline measured them; a recent incident live.
        costs = incident.costs or {}
        if not costs.get("complete") and incident.opened_at >= fresh:
            costs = measure(incident) or costs
        interruptions.append(interruption_of(incident, costs))
    # A group ran from its first transition in the window (or its creation, or its first
    # incident, whichever is earliest) to its last activity (to now while it runs).
    groups = list(
        ConsistencyGroup.objects.filter(
            Q(last_activity__gte=start) | Q(incidents__opened_at__gte=start)
        )
        .annotate(first_incident=Min("incidents__opened_at"))
        .distinct()
    )
    first_seen = lifecycle.groups_first_transition([g.pk for g in groups], start)
    spans = []
    for g in groups:
        began = min(g.created, g.first_incident or g.created, first_seen.get(g.pk, g.created))
        ended = max(g.last_activity or began, began)
        spans.append(
            reliability.GroupSpan(
                name=g.name,
                kind=g.kind,
                gpus=g.world_size or g.ranks.count() or 1,
                start=max(began, start).timestamp(),
                end=min(max(ended, now if g.state == "running" else ended), now).timestamp(),
            )
        )
    node_incidents = Incident.objects.filter(
        group__isnull=True, opened_at__gte=start, opened_at__lt=now
    ).count()
    report = reliability.fleet_report(
        interruptions,
        spans,
        start=start.timestamp(),
        end=now.timestamp(),
        tokens_by_group_day=step_rows.tokens_by_group_day(start, now),
        exposure=exposure_of(start, now),
    )
    report["node_incidents"] = node_incidents
    return report
