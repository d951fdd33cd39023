"""The diagnosis pipeline: database rows -> snapshot -> pure engine -> incidents.

Reads go through console.snapshots, writes through console.actions; this module only
sequences them and decides which groups a sweep should look at. It must not write rows
itself or enqueue tasks by importing them (console.scheduling enqueues by name).
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

from django.core.cache import cache
from django.db.models import F, Min, Q

from console import actions, collector, snapshots
from console.actions.audit import SYSTEM
from console.choices import GroupState, Health, IncidentState
from console.diagnosis import diagnose as run_engine
from console.models import VERDICT_SETTLES_AFTER, ConsistencyGroup, Incident, Node
from console.policy import fleet_health as fh
from console.queries import recovery

NODE_SILENT_AFTER = timedelta(seconds=10)
# A pass slower than this is logged (WARNING) with where its time went: at fleet scale a
# slow pass delays every incident of its group, and a full rebuild is the usual reason.
SLOW_PASS_S = 1.0
# The urgent lane also judges the group's other nodes with an urgent event this recent.
URGENT_SCOPE = timedelta(minutes=1)

log = logging.getLogger(__name__)


def diagnose(*, group_name: str, now: datetime) -> datetime | None:
    """One pass over the group; returns when a verdict may next change with no new record
    (Diagnosis.next_check), for the caller to schedule a pass then, or None."""
    t0 = time.perf_counter()
    # A generation that ended (a restart) before any pass judged its end: judged once, as
    # of its end, before the current one (console.snapshots.unjudged_endings).
    for ending in snapshots.unjudged_endings(group_name=group_name, now=now):
        ended = snapshots.load_ended(group_name=group_name, ending=ending)
        if ended is not None:
            actions.record_ended_generation(
                group_name=group_name,
                diagnosis=run_engine(ended, ending.ended_at),
                now=now,
                judged_key=snapshots.ENDED_JUDGED,
            )
    # The live state is millions of long-lived objects at 16k ranks: no gen-2 walk of
    # them inside a pass (console.collector; a full rebuild releases and collects).
    with collector.paused():
        snapshot = snapshots.load(group_name=group_name, now=now)
        if snapshot is None:
            return None
        t1 = time.perf_counter()
        result = run_engine(snapshot, now, memo=snapshots.memo(group_name))
    t2 = time.perf_counter()
    actions.record_diagnosis(group_name=group_name, diagnosis=result, now=now)
    t3 = time.perf_counter()
    # The remediation policy reads the incidents just recorded (console.actions.proposals).
    # Recovery costs are not measured here: a pass waits for nothing but judging
    # (measure_recovery, its own beat task).
    actions.remediate_group(group_name=group_name, now=now)
    t4 = time.perf_counter()
    due = _next_settle(group_name, now)
    if t4 - t0 > SLOW_PASS_S:
        p = snapshots.last_pass
        parts = ", ".join(f"{k} {v:.2f}" for k, v in snapshots.last_parts.items())
        read = snapshots.last_read
        if read:  # which part of an incremental read, and how many rows it re-checked
            parts += "; read: " + ", ".join(
                f"{k} {v:.2f}" if k.endswith(" s") else f"{k} {v:.0f}" for k, v in read.items()
            )
        log.warning(
            "diagnosis %s: slow pass %.2f s (%s read of %s rows, %s ranks rebuilt; snapshot "
            "%.2f s [%s], engine %.2f s, incidents %.2f s, remediation %.2f s; %d ranks, "
            "%d findings)",
            group_name,
            t4 - t0,
            p.get("mode"),
            p.get("rows"),
            p.get("touched"),
            t1 - t0,
            parts,
            t2 - t1,
            t3 - t2,
            t4 - t3,
            len(snapshot.ranks),
            len(result.findings),
        )
    if due is not None and (result.next_check is None or due < result.next_check):
        return due
    return result.next_check


def _next_settle(group_name: str, now: datetime) -> datetime | None:
    """When the group's youngest provisional verdict settles: a pass then makes its
    proposals (Incident.verdict_settled), instead of the sweep's next tick after it."""
    first = (
        Incident.objects.filter(group__name=group_name)
        .exclude(Incident.settled_at(now))
        .exclude(state=IncidentState.RESOLVED)
        .aggregate(first=Min("opened_at"))["first"]
    )
    return None if first is None else first + VERDICT_SETTLES_AFTER


def diagnose_urgent(*, group_name: str, node: str | None, now: datetime) -> None:
    """The urgent lane's run after a device or host event: the same engine over the nodes
    that reported one (`node`, and any other node of the group with such an event in the
    last URGENT_SCOPE), their GPUs and ranks, and the group's own evidence (checkpoints,
    transitions): the cost of a node, not of the world (a 16k-rank group's full pass is
    seconds, its first on this lane's process a full read). It opens or updates only the
    root causes located on those nodes (console.actions.record_located): the ordinary
    pass, scheduled for the same batch, folds the symptoms, settles the rest, writes the
    restart advice and runs the remediation policy. Without a node to judge: a full pass."""
    snapshot = snapshots.load_located(
        group_name=group_name, nodes={node} if node else set(), since=now - URGENT_SCOPE, now=now
    )
    if snapshot is None:
        diagnose(group_name=group_name, now=now)
        return
    snap, subjects = snapshot
    result = run_engine(snap, now)
    actions.record_located(group_name=group_name, diagnosis=result, subjects=subjects, now=now)


# A resolved incident's costs are measured again at most this often until final: each
# measurement aggregates the steps thrown away and redone (at 1k ranks 0.7 s for 600 lost
# steps: bench/recovery_costs.py).
MEASURE_EVERY = timedelta(seconds=30)
# A run measures until this much time is spent; the rest wait for the next run, the least
# recently measured first. Measured inside each diagnosis pass (before 2026-12-05), 128
# resolved incidents of a 16k-rank group (0.7 s each) held its next pass for 96 s
# (bench/detect.py --ranks 16384); now a beat task of its own measures, and this bounds
# how long it holds a worker process.
MEASURE_BUDGET_S = 2.0
# When each incident was last measured, shared by the worker processes (the beat task runs
# on any of them), and one run at a time: unshared, four processes measured each incident
# four times as often, and a slow run overlapped the next.
MEASURED_KEY = "recovery-costs:measured-at"
RUN_KEY = "recovery-costs:running"
RUN_LOCK_S = 120  # a run that died holds the lock no longer than this


def forget_recent() -> None:
    """Forget when which incident was measured, and any run's lock (tests)."""
    cache.delete_many([MEASURED_KEY, RUN_KEY])


def measure_recovery(*, now: datetime, group_name: str | None = None) -> bool:
    """The seed's recovery costs of resolved incidents (the fleet's, or one group's), until
    they are final (the restored generation has caught up with where the failed one
    stopped), each at most once per MEASURE_EVERY, for at most MEASURE_BUDGET_S a run.
    Beat runs it (console.measure_recovery_costs), apart from diagnosis: no group's next
    pass waits for its accounting. False: another run was under way (nothing done)."""
    if not cache.add(RUN_KEY, 1, timeout=RUN_LOCK_S):
        return False
    try:
        measured: dict[int, datetime] = {
            pk: at
            for pk, at in (cache.get(MEASURED_KEY) or {}).items()
            if timedelta(0) <= now - at <= recovery.MEASURE_FOR
        }
        due = [
            incident
            for incident in recovery.to_measure(group_name, now)
            if (last := measured.get(incident.pk)) is None or now - last >= MEASURE_EVERY
        ]
        never = datetime.min.replace(tzinfo=now.tzinfo)
        due.sort(key=lambda incident: (measured.get(incident.pk, never), incident.pk))
        started = time.perf_counter()
        try:
            for incident in due:
                if time.perf_counter() - started > MEASURE_BUDGET_S:
                    break  # the next run goes on with the least recently measured
                measured[incident.pk] = now
                costs = recovery.measure(incident)
                if costs is not None:
                    actions.record_incident_costs(
                        incident_id=incident.pk, costs=costs, actor=SYSTEM, now=now
                    )
        finally:
            cache.set(MEASURED_KEY, measured, timeout=int(recovery.MEASURE_FOR.total_seconds()))
    finally:
        cache.delete(RUN_KEY)
    return True


def mark_silent_nodes(*, now: datetime) -> list[str]:
    """Mark down the nodes that stopped reporting; many at once (fleet_health.mass_silence)
    are one fleet incident, not one each. Then settle an open fleet silence."""
    cutoff = now - NODE_SILENT_AFTER
    silent = list(
        Node.objects.filter(last_seen__lt=cutoff)
        .exclude(health=Health.DOWN)
        .values_list("name", flat=True)
    )
    reason = f"no report for {NODE_SILENT_AFTER.total_seconds():.0f} s"
    reporting = Node.objects.exclude(health=Health.DOWN).count() if silent else 0
    if silent and fh.mass_silence(len(silent), reporting):
        log.warning("sweep: %d of %d nodes stopped reporting together", len(silent), reporting)
        actions.mark_silent_together(
            names=silent, reporting=reporting, actor=SYSTEM, now=now, reason=reason
        )
    else:
        for name in silent:
            actions.set_node_health(
                name=name, health=Health.DOWN, actor=SYSTEM, now=now, reason=reason
            )
    actions.settle_fleet_silence(actor=SYSTEM, now=now)
    return silent


def groups_to_sweep(*, now: datetime, window: timedelta) -> list[str]:
    """Groups whose silence may mean something, the most recently active first: the
    sweep's young-group budget is spent in this order, and in table order a node's long
    idle jobs spent it every second before its newest job's hang was ever judged."""
    return list(
        ConsistencyGroup.objects.filter(
            Q(last_activity__gte=now - window)
            | Q(incidents__state__in=[IncidentState.OPEN, IncidentState.ACKNOWLEDGED])
        )
        .exclude(state__in=[GroupState.COMPLETED, GroupState.STOPPED])
        .order_by(F("last_activity").desc(nulls_last=True), "name")
        .distinct()
        .values_list("name", flat=True)
    )
