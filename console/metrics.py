"""Fleet state for /metrics, read from the database at scrape time (bounded reads).

Owns the fleet's Prometheus series: per group (state, generation, goodput, tail ratio, MFU,
HFU and the lowest rank's MFU, diagnosis lag, open incidents by severity), per pool node
counts by state and the nodes' delivery delay (the worst and the p95 of their newest
batches'), open incidents and actions by state. Every read is an aggregate or capped
at METRICS_MAX_GROUPS rows, so a scrape costs the same whatever the telemetry volume.
Labels are group, pool and fixed vocabulary words only: never a rank, a GPU UUID, a node
name or a request id. It writes nothing and holds no state between scrapes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Count
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from prometheus_client.core import GaugeMetricFamily, Metric

from agents.vocab import HEALTH_DOWN
from console.choices import GroupState, Health, IncidentState, Severity
from console.models import Action, ConsistencyGroup, Incident, Node
from console.policy.lifecycle import ActionState

# A node's state for the pool counts: what takes it out of service first, else its health.
NODE_STATES = ("quarantined", "cordoned", *Health.values)


@dataclass(frozen=True)
class GroupRow:
    name: str
    kind: str
    state: str
    generation: int
    goodput_tokens_per_s: float | None
    goodput_requests_per_s: float | None
    productive_fraction: float | None
    tail_ratio: float | None
    diagnosis_lag_s: float | None
    mfu: float | None = None
    hfu: float | None = None
    lowest_rank_mfu: float | None = None


@dataclass
class Fleet:
    groups: list[GroupRow] = field(default_factory=list)
    groups_omitted: int = 0
    incidents: dict[tuple[str | None, str], int] = field(default_factory=dict)  # (group, sev)
    pools: dict[tuple[str, str], int] = field(default_factory=dict)
    actions: dict[str, int] = field(default_factory=dict)
    delivery: dict[str, tuple[float, float]] = field(default_factory=dict)  # pool: max, p95


# Per pool, over the nodes still reporting (a silent node's delay is unknown, not its last):
# the worst newest-batch delivery delay, and the nearest-rank p95 of them (console.delivery).
_DELIVERY = f"""
SELECT coalesce(nullif(pool, ''), 'none'), max(delivery_delay_s),
    percentile_disc(0.95) WITHIN GROUP (ORDER BY delivery_delay_s)
FROM console_node WHERE delivery_delay_s IS NOT NULL AND health <> '{HEALTH_DOWN}'
GROUP BY 1
"""  # noqa: S608 - a constant vocabulary word


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _lag(summary: dict[str, Any], last_activity: datetime | None) -> float | None:
    """How far the newest diagnosis trails the group's newest record (0 when caught up)."""
    raw = summary.get("diagnosed_at")
    diagnosed = parse_datetime(raw) if isinstance(raw, str) else None
    if last_activity is None:
        return None
    if diagnosed is None:
        return max(0.0, (timezone.now() - last_activity).total_seconds())
    return max(0.0, (last_activity - diagnosed).total_seconds())


def _node_state(health: str, cordoned: bool, quarantined: bool) -> str:
    return "quarantined" if quarantined else "cordoned" if cordoned else health


def read_fleet(*, limit: int | None = None) -> Fleet:
    """Four aggregate reads and one capped one: the most recently active groups first."""
    limit = limit or settings.METRICS_MAX_GROUPS
    fleet = Fleet()
    rows = list(
        ConsistencyGroup.objects.order_by("-last_activity", "name").values(
            "pk", "name", "kind", "state", "generation", "summary", "last_activity"
        )[: limit + 1]
    )
    if len(rows) > limit:
        fleet.groups_omitted = ConsistencyGroup.objects.count() - limit
        rows = rows[:limit]
    names = {row["pk"]: row["name"] for row in rows}
    for row in rows:
        summary: dict[str, Any] = row["summary"] if isinstance(row["summary"], dict) else {}
        raw_goodput = summary.get("goodput")
        goodput: dict[str, Any] = raw_goodput if isinstance(raw_goodput, dict) else {}
        raw_use = summary.get("utilisation")
        use: dict[str, Any] = raw_use if isinstance(raw_use, dict) else {}
        fleet.groups.append(
            GroupRow(
                name=row["name"],
                kind=row["kind"],
                state=row["state"],
                generation=row["generation"],
                goodput_tokens_per_s=_number(goodput.get("g_train_tokens_per_s")),
                goodput_requests_per_s=_number(goodput.get("g_serve_requests_per_s")),
                productive_fraction=_number(goodput.get("productive_fraction")),
                tail_ratio=_number(summary.get("tail_ratio")),
                diagnosis_lag_s=_lag(summary, row["last_activity"]),
                mfu=_number(use.get("mfu")),
                hfu=_number(use.get("hfu")),
                lowest_rank_mfu=_number(use.get("lowest_rank_mfu")),
            )
        )
    open_incidents = (
        Incident.objects.exclude(state=IncidentState.RESOLVED)
        .values("group_id", "severity")
        .annotate(n=Count("id"))
    )
    for row in open_incidents:
        # Groups past the cap still count in the fleet total (group None).
        key: tuple[str | None, str] = (names.get(row["group_id"]), row["severity"])
        fleet.incidents[key] = fleet.incidents.get(key, 0) + row["n"]
    nodes = Node.objects.values("pool", "health", "cordoned", "quarantined").annotate(n=Count("id"))
    for row in nodes:
        state = _node_state(row["health"], row["cordoned"], row["quarantined"])
        pool_state = (row["pool"] or "none", state)
        fleet.pools[pool_state] = fleet.pools.get(pool_state, 0) + row["n"]
    for row in Action.objects.values("state").annotate(n=Count("id")):
        fleet.actions[row["state"]] = row["n"]
    with connection.cursor() as cur:
        cur.execute(_DELIVERY)
        fleet.delivery = {pool: (worst, p95) for pool, worst, p95 in cur.fetchall()}
    return fleet


def families(fleet: Fleet) -> Iterator[Metric]:
    """The fleet as metric families (every state word present, so absent means unknown)."""
    info = GaugeMetricFamily(
        "faultline_group_info", "One per group: its kind.", labels=["group", "kind"]
    )
    state = GaugeMetricFamily(
        "faultline_group_state",
        "1 for the group's current state, 0 for every other state.",
        labels=["group", "state"],
    )
    generation = GaugeMetricFamily(
        "faultline_group_generation", "The group's active generation.", labels=["group"]
    )
    tokens = GaugeMetricFamily(
        "faultline_group_goodput_tokens_per_second",
        "Training goodput: tokens that passed numeric and data checks per wall second.",
        labels=["group"],
    )
    requests = GaugeMetricFamily(
        "faultline_group_goodput_requests_per_second",
        "Serving goodput: completed requests meeting every SLO per wall second.",
        labels=["group"],
    )
    productive = GaugeMetricFamily(
        "faultline_group_productive_fraction",
        "Share of wall time that made valid progress (0..1).",
        labels=["group"],
    )
    tail = GaugeMetricFamily(
        "faultline_group_tail_ratio",
        "Straggler tail ratio: p99 rank step time over the median rank's.",
        labels=["group"],
    )
    lag = GaugeMetricFamily(
        "faultline_group_diagnosis_lag_seconds",
        "How far the group's newest diagnosis trails its newest record.",
        labels=["group"],
    )
    mfu = GaugeMetricFamily(
        "faultline_group_mfu_ratio",
        "Model FLOPs utilisation (0..1): the model's FLOP/s over the ranks' GPUs' peak dense "
        "BF16 FLOP/s, newest steps. Absent without a known GPU peak (a CPU run): never 0.",
        labels=["group"],
    )
    hfu = GaugeMetricFamily(
        "faultline_group_hfu_ratio",
        "Hardware FLOPs utilisation (0..1): as MFU, counting recomputed activations.",
        labels=["group"],
    )
    lowest_mfu = GaugeMetricFamily(
        "faultline_group_lowest_rank_mfu_ratio",
        "The lowest MFU of any rank of the group (0..1); which rank is on the group page.",
        labels=["group"],
    )
    group_incidents = GaugeMetricFamily(
        "faultline_group_open_incidents",
        "Open (unresolved) incidents of the group by severity.",
        labels=["group", "severity"],
    )
    for g in fleet.groups:
        info.add_metric([g.name, g.kind], 1)
        for word in GroupState.values:
            state.add_metric([g.name, word], int(g.state == word))
        generation.add_metric([g.name], g.generation)
        for family, value in (
            (tokens, g.goodput_tokens_per_s),
            (requests, g.goodput_requests_per_s),
            (productive, g.productive_fraction),
            (tail, g.tail_ratio),
            (lag, g.diagnosis_lag_s),
            (mfu, g.mfu),
            (hfu, g.hfu),
            (lowest_mfu, g.lowest_rank_mfu),
        ):
            if value is not None:
                family.add_metric([g.name], value)
        for severity in Severity.values:
            count = fleet.incidents.get((g.name, severity), 0)
            group_incidents.add_metric([g.name, severity], count)
    yield from (info, state, generation, tokens, requests, productive, tail, lag)
    yield from (mfu, hfu, lowest_mfu, group_incidents)

    omitted = GaugeMetricFamily(
        "faultline_metrics_groups_omitted",
        "Groups left out of the per-group series (beyond FAULTLINE_METRICS_MAX_GROUPS).",
    )
    omitted.add_metric([], fleet.groups_omitted)
    yield omitted

    total = GaugeMetricFamily(
        "faultline_open_incidents",
        "Open incidents in the whole fleet (group and fleet scope) by severity.",
        labels=["severity"],
    )
    for severity in Severity.values:
        total.add_metric(
            [severity], sum(n for (_, s), n in fleet.incidents.items() if s == severity)
        )
    yield total

    pools = GaugeMetricFamily(
        "faultline_pool_nodes",
        "Nodes per pool by state (quarantined, cordoned, else health).",
        labels=["pool", "state"],
    )
    for pool in sorted({p for p, _ in fleet.pools}):
        for node_state in NODE_STATES:
            pools.add_metric([pool, node_state], fleet.pools.get((pool, node_state), 0))
    yield pools

    delivery = GaugeMetricFamily(
        "faultline_pool_delivery_delay_seconds",
        "How late the pool's reporting nodes' data arrives: from a batch's oldest sample "
        "being taken to the batch being stored, newest batch per node; the worst node "
        "(stat=max) and the nodes' p95.",
        labels=["pool", "stat"],
    )
    for pool, (worst, p95) in sorted(fleet.delivery.items()):
        delivery.add_metric([pool, "max"], worst)
        delivery.add_metric([pool, "p95"], p95)
    yield delivery

    actions = GaugeMetricFamily(
        "faultline_actions", "Remediation actions by lifecycle state.", labels=["state"]
    )
    for action_state in ActionState:
        actions.add_metric([action_state.value], fleet.actions.get(action_state.value, 0))
    yield actions


class FleetCollector:
    """A prometheus_client collector that reads the fleet once per scrape."""

    def describe(self) -> list[Metric]:
        return []  # nothing at registration: only a scrape may touch the database

    def collect(self) -> Iterator[Metric]:
        yield from families(read_fleet())
