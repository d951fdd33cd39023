"""Load one group's recent telemetry from Postgres as contract-shaped dicts for diagnosis.

The engine is pure; this is its only database adapter. Each query is bounded by time and,
where a table grows per rank, by taking just the newest row per rank (DISTINCT ON), so a
16k-rank group costs a handful of indexed queries, not one per rank.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from console.diagnosis import GroupSnapshot, build_snapshot
from console.models import ConsistencyGroup, Device, Node
from ingest import models as m

STEP_WINDOW = timedelta(minutes=10)
EVENT_WINDOW = timedelta(minutes=30)
HISTORY_WINDOW = timedelta(hours=24)
MAX_STEP_ROWS = 200_000
MAX_PROBE_ROWS = 20_000


def _rows(qs: Any, kind: str, fields: list[str], node_names: dict[int, str]) -> list[dict]:
    out = []
    for row in qs.values("ts", "node_id", *fields):
        row["kind"] = kind
        row["node"] = node_names.get(row.pop("node_id"))
        out.append(row)
    return out


def load(*, group_name: str, now: datetime) -> GroupSnapshot | None:
    group = ConsistencyGroup.objects.filter(name=group_name).first()
    if group is None:
        return None
    gen = group.generation
    node_ids = set(group.ranks.values_list("node_id", flat=True)) - {None}
    nodes = {n.pk: n for n in Node.objects.filter(pk__in=node_ids)}
    names = {pk: n.name for pk, n in nodes.items()}
    records: list[dict[str, Any]] = []

    step_fields = ["generation", "rank", "step", "tokens", "data_cursor", "duration_ms",
                   "phases", "loss", "grad_norm", "loss_scale", "overflow"]  # fmt: skip
    current = m.StepRecord.objects.filter(group=group, generation=gen, stale=False)
    steps = _rows(
        current.filter(ts__gte=now - STEP_WINDOW).order_by("-ts")[:MAX_STEP_ROWS],
        "step",
        step_fields,
        names,
    )
    # A rank hung for longer than the step window must stay in the snapshot with its last
    # step, or the hang would vanish from diagnosis and its incident resolve by itself.
    quiet = set(group.ranks.filter(generation=gen).values_list("rank", flat=True)) - {
        row["rank"] for row in steps
    }
    if quiet:
        steps += _rows(
            current.filter(rank__in=quiet, ts__gte=now - HISTORY_WINDOW)
            .order_by("rank", "-ts")
            .distinct("rank"),
            "step",
            step_fields,
            names,
        )
    records += steps
    windows = (
        m.CollectiveWindow.objects.filter(
            group=group, generation=gen, stale=False, ts__gte=now - HISTORY_WINDOW
        )
        .order_by("rank", "-ts")
        .distinct("rank")
    )
    collectives = _rows(windows, "collective", ["generation", "rank", "entries"], names)
    for row in collectives:
        for entry in row["entries"]:
            if entry.get("started_ts"):
                entry["started_ts"] = datetime.fromisoformat(entry["started_ts"])
    records += collectives
    # Exits and device events explain stops for as long as the stop lasts: keep a day.
    procs = m.ProcessRecord.objects.filter(group=group, ts__gte=now - HISTORY_WINDOW, stale=False)
    records += _rows(
        procs,
        "process",
        ["generation", "rank", "event", "pid", "gpu", "exit_code", "signal", "reason",
         "error_type"],
        names,
    )  # fmt: skip
    ckpts = m.CheckpointRecord.objects.filter(group=group, ts__gte=now - HISTORY_WINDOW)
    records += _rows(
        ckpts,
        "checkpoint",
        ["generation", "checkpoint_id", "step", "phase", "manifest", "duration_ms", "detail"],
        names,
    )
    transitions = m.TransitionRecord.objects.filter(
        group=group, ts__gte=now - HISTORY_WINDOW, stale=False
    )
    records += _rows(
        transitions,
        "transition",
        ["generation", "from_state", "to_state", "reason", "restart_count", "world_size",
         "data_cursor", "model_version"],
        names,
    )  # fmt: skip
    serving = (
        m.ServingWindow.objects.filter(group=group, ts__gte=now - EVENT_WINDOW)
        .order_by("worker", "-ts")
        .distinct("worker")
    )
    records += _rows(
        serving,
        "serving",
        ["generation", "worker", "model_version", "adapter_version", "kv_schema", "ready",
         "draining", "window"],
        names,
    )  # fmt: skip
    # Correctness probes: compared across ranks at one step and over time (issue 23).
    probes = m.ProbeRecord.objects.filter(
        group=group, generation=gen, stale=False, ts__gte=now - EVENT_WINDOW
    ).order_by("-ts")[:MAX_PROBE_ROWS]
    records += _rows(
        probes,
        "probe",
        ["generation", "probe", "rank", "worker", "step", "value", "checksum", "model_version"],
        names,
    )
    records += _device_records(node_ids, names, now)
    contract = [
        {"kind": c.kind, "subject": c.subject, "evidence": c.evidence, "ts": c.ts}
        for c in m.ContractViolation.objects.filter(
            group=group, ts__gte=now - EVENT_WINDOW
        ).order_by("ts")
    ]
    return build_snapshot(
        group=group.name,
        generation=gen,
        state=group.state,
        records=records,
        nodes={n.name: n.last_seen for n in nodes.values()},
        contract_findings=contract,
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
    events = m.DeviceEvent.objects.filter(node_id__in=node_ids, ts__gte=now - HISTORY_WINDOW)
    out += _rows(events, "device_event", ["gpu", "event", "code", "detail"], names)
    return out
