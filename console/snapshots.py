"""Load one group's recent state as contract-shaped dicts and build its diagnosis snapshot.

The engine is pure; this is its only database adapter. Telemetry (steps, collectives,
exits, checkpoints, transitions, serving windows, device events, contract violations) is
read through `console.queries.telemetry`, bounded by time and newest-per-rank; the live
GPU samples and node liveness come from the console's own tables. Must not write.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from console.diagnosis import GroupSnapshot, build_snapshot
from console.models import ConsistencyGroup, Device, Node
from console.queries import telemetry


def load(*, group_name: str, now: datetime) -> GroupSnapshot | None:
    group = ConsistencyGroup.objects.filter(name=group_name).first()
    if group is None:
        return None
    node_ids = set(group.ranks.values_list("node_id", flat=True)) - {None}
    nodes = {n.pk: n for n in Node.objects.filter(pk__in=node_ids)}
    names = {pk: n.name for pk, n in nodes.items()}
    records = telemetry.group_records(group, node_names=names, now=now)
    records += _device_records(node_ids, names, now)
    return build_snapshot(
        group=group.name,
        generation=group.generation,
        state=group.state,
        records=records,
        nodes={n.name: n.last_seen for n in nodes.values()},
        contract_findings=telemetry.contract_violations(group, now),
        now=now,
        slo=group.slo,
    )


def _device_records(node_ids: set[int], names: dict[int, str], now: datetime) -> list[dict]:
    """Newest sample per GPU comes from Device.last_sample (kept live by ingest)."""
    out: list[dict[str, Any]] = []
    for dev in Device.objects.filter(node_id__in=node_ids):
        if not dev.last_sample:
            continue
        sample = {k: v for k, v in dev.last_sample.items() if k != "ts"}
        sample.update(
            kind="device_sample",
            ts=dev.last_seen or now,
            node=names.get(dev.node_id),
            gpu=dev.uuid,
        )
        out.append(sample)
    out += telemetry.device_events(node_ids, node_names=names, now=now)
    out += telemetry.host_records(node_ids, node_names=names, now=now)
    return out
