"""The diagnosis pipeline: database rows -> snapshot -> pure engine -> incidents.

Reads go through console.snapshots, writes through console.actions; this module only
sequences them and decides which groups a sweep should look at. It must not write rows
itself or enqueue tasks by importing them (console.scheduling enqueues by name).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import F, Q

from console import actions, collector, snapshots
from console.actions.audit import SYSTEM
from console.choices import GroupState, Health, IncidentState
from console.diagnosis import diagnose as run_engine
from console.models import ConsistencyGroup, Node
from console.queries import recovery

NODE_SILENT_AFTER = timedelta(seconds=10)


def diagnose(*, group_name: str, now: datetime) -> None:
    # The live state is millions of long-lived objects at 16k ranks: no gen-2 walk of
    # them inside a pass (console.collector; a full rebuild releases and collects).
    with collector.paused():
        snapshot = snapshots.load(group_name=group_name, now=now)
        if snapshot is None:
            return
        result = run_engine(snapshot, now, memo=snapshots.memo(group_name))
    actions.record_diagnosis(group_name=group_name, diagnosis=result, now=now)
    measure_recovery(group_name=group_name, now=now)
    # The remediation policy reads the incidents just recorded (console.actions.proposals).
    actions.remediate_group(group_name=group_name, now=now)


def measure_recovery(*, group_name: str, now: datetime) -> None:
    """The seed's recovery costs of the group's resolved incidents, until they are final
    (the restored generation has caught up with where the failed one stopped)."""
    for incident in recovery.to_measure(group_name, now):
        costs = recovery.measure(incident)
        if costs is not None:
            actions.record_incident_costs(
                incident_id=incident.pk, costs=costs, actor=SYSTEM, now=now
            )


def mark_silent_nodes(*, now: datetime) -> list[str]:
    cutoff = now - NODE_SILENT_AFTER
    silent = list(
        Node.objects.filter(last_seen__lt=cutoff)
        .exclude(health=Health.DOWN)
        .values_list("name", flat=True)
    )
    for name in silent:
        actions.set_node_health(
            name=name, health=Health.DOWN, actor=SYSTEM, now=now,
            reason=f"no report for {NODE_SILENT_AFTER.total_seconds():.0f} s",
        )  # fmt: skip
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
