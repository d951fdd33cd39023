"""Reads for a group's recovery objectives and its checkpoint-interval advice.

Owns where the inputs come from: the pool defaults (settings.FAULTLINE_OBJECTIVES), the
group's pool (the pool most of its ranks' nodes are in), its declared objectives, its
checkpoint and transition history (through console.queries.telemetry) and the hardware
incidents on its nodes. The merging and the arithmetic are console.policy's (pure). Must
not write.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

from django.conf import settings
from django.db.models import Count

from console.models import ConsistencyGroup, Incident, Node
from console.policy import checkpoint_advice as advice
from console.policy import objectives as pure
from console.queries.telemetry import checkpoint_rows, lifecycle, shared

# Failures counted towards the MTBF: fleet-scope (node) incidents of the last 30 days.
MTBF_WINDOW = timedelta(days=30)


def pool_table() -> dict[str, dict[str, Any]]:
    """The validated pool defaults (read per call: tests override settings)."""
    return pure.pool_defaults(getattr(settings, "FAULTLINE_OBJECTIVES", None))


def _nodes(group: ConsistencyGroup) -> list[Node]:
    """The nodes hosting the group's ranks, each with `group_ranks` (one query)."""
    return list(
        Node.objects.filter(rank__group=group).annotate(group_ranks=Count("rank")).order_by("pk")
    )


class _Pooled(Protocol):
    """A node as far as its pool goes: a Node, or a diagnosis pass's lighter row."""

    @property
    def pool(self) -> str: ...


def group_pool(group: ConsistencyGroup, nodes: Sequence[_Pooled] | None = None) -> str:
    pools = Counter(n.pool for n in (nodes if nodes is not None else _nodes(group)) if n.pool)
    return pools.most_common(1)[0][0] if pools else ""


def effective(group: ConsistencyGroup, nodes: Sequence[_Pooled] | None = None) -> dict[str, Any]:
    """The objectives in force, with `sources`. The goodput SLO is the group's SLO key
    (`slo.goodput_target`, shared with the serving SLO): when set there it wins."""
    pool = group_pool(group, nodes)
    out = pure.effective(declared=group.objectives, pools=pool_table(), pool=pool)
    if group.slo.get("goodput_target") is not None:
        out["goodput_target"] = float(group.slo["goodput_target"])
        out["sources"]["goodput_target"] = "slo"
    out["pool"] = pool
    return out


def _recoveries_s(transitions: list[dict[str, Any]]) -> list[float]:
    """Seconds from each transition into `recovering` to the next into `running`."""
    out: list[float] = []
    start: datetime | None = None
    for t in transitions:
        if t["to_state"] == "recovering":
            start = start or t["ts"]
        elif t["to_state"] == "running" and start is not None:
            out.append((t["ts"] - start).total_seconds())
            start = None
    return out


def advice_for(
    group: ConsistencyGroup, *, now: datetime, nodes: list[Node] | None = None
) -> dict[str, Any]:
    """Checkpoint-interval and hot-spare advice, each figure with its basis."""
    nodes = _nodes(group) if nodes is None else nodes
    history = checkpoint_rows.checkpoint_history(group, now=now)
    costs = [r["duration_ms"] / 1000.0 for r in history if r["duration_ms"]]
    commits: dict[str, datetime] = {}
    for r in history:
        if r["phase"] == "committed":
            commits.setdefault(r["checkpoint_id"], r["ts"])
    times = sorted(t.timestamp() for t in commits.values())
    failures = Incident.objects.filter(
        node__in=nodes, group__isnull=True, opened_at__gte=now - MTBF_WINDOW
    ).count()
    window_h = MTBF_WINDOW.total_seconds() / 3600.0
    node_hours = sum(
        min(window_h, max((now - n.first_seen).total_seconds() / 3600.0, 0.0)) for n in nodes
    )
    est = advice.mtbf(failures=failures, node_hours=node_hours, nodes=len(nodes))
    gpus = sum(getattr(n, "group_ranks", 0) for n in nodes) or (group.world_size or 0)
    per_node = max(round(gpus / len(nodes)), 1) if nodes else 1
    interval = advice.interval_advice(
        checkpoint_costs_s=costs, commit_times_s=times, mtbf_estimate=est, gpus=gpus
    )
    spares = advice.spare_advice(
        group_gpus=gpus,
        spare_gpus=per_node,
        mtbf_estimate=est,
        restart_costs_s=_recoveries_s(lifecycle.advice_transitions(group, now=now)),
    )
    return {
        "checkpoint_interval": interval.to_dict(),
        "hot_spares": {**spares.to_dict(), "assumes": "one spare node of the group's size"},
        "window_days": {"checkpoints": shared.ADVICE_WINDOW.days, "failures": MTBF_WINDOW.days},
    }


def objectives_and_advice(group: ConsistencyGroup, *, now: datetime) -> dict[str, Any]:
    """What the group page and GET /groups/<name>/objectives/ show, in five bounded queries
    (nodes, checkpoints, transitions, failures; the group row is the caller's)."""
    nodes = _nodes(group)
    return {
        "objectives": effective(group, nodes),
        "declared": dict(group.objectives or {}),
        "advice": advice_for(group, now=now, nodes=nodes),
    }
