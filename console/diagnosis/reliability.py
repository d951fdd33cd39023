"""The fleet's reliability record over a window: what failed, how often, and what it cost.

Owns the report's figures from plain data (one `Interruption` per group incident, one
`GroupSpan` per group that ran in the window, valid tokens per group and day):
interruptions by root-cause kind, layer and category with counts and their share of lost
GPU-hours (the table large-scale training reports publish), MTBF over the exposure the
fleet actually reported (`Exposure`: fleet-wide and per layer over the hours it reported,
per GPU over GPU-hours, per node over each node's node-hours; "not enough exposure" below
MIN_MTBF_EXPOSURE_H), MTTR, the effective training time ratio (ETTR) and
goodput per group and per day, and repeat-offender nodes and GPUs. An interruption is a
group incident after which the group restarted (a new generation): the job was stopped,
not merely slowed; one per restart (the generation's first root cause that is not a risk:
an `rpo_exceeded` or `rto_exceeded` incident is counted with the other incidents). Layers come from
console.diagnosis.layers (the one mapping). Pure: no ORM, no clock; times are epoch
seconds, the window is the caller's.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from console import formats
from console.diagnosis.findings import RISK_KINDS
from console.diagnosis.layers import LAYER_LABELS, LAYERS, category_of

DAY_S = 86400.0
REPEAT_OFFENDER_MIN = 2  # interruptions in the window that make a node or GPU a repeat offender
# An MTBF is a rate extrapolated from the exposure observed: below a day of the fleet's
# (or the node's) own hours it says more about when the window started than about the
# hardware (docs/console.md, "Reliability record", says why a day).
MIN_MTBF_EXPOSURE_H = 24.0
# An ETTR rests on the hours its group ran: below an hour one restart's fixed cost is
# most of the figure.
MIN_ETTR_EXPOSURE_H = 1.0
NOT_ENOUGH = "not enough exposure"


@dataclass(frozen=True, slots=True)
class Exposure:
    """What actually reported in the window: hours in which any GPU sampled
    (`observed_hours`), GPU-hours and node-hours summed over those, and each node's
    node-hours (a node-minute is one in which the node sent a GPU sample)."""

    observed_hours: float = 0.0
    gpu_hours: float = 0.0
    node_hours: float = 0.0
    per_node_hours: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Interruption:
    incident: int
    group: str
    generation: int
    kind: str
    layer: str
    opened: float
    restarted: bool
    node: str | None = None
    gpu: str | None = None
    downtime_s: float | None = None  # first evidence -> first valid step of the new generation
    lost_work_s: float | None = None  # wall time of the work thrown away
    lost_tokens: int | None = None
    total_lost_gpu_hours: float | None = None


@dataclass(frozen=True, slots=True)
class GroupSpan:
    name: str
    kind: str
    gpus: int
    start: float
    end: float


def _day(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).date().isoformat()


def _overlap(a: float, b: float, x: float, y: float) -> float:
    return max(0.0, min(b, y) - max(a, x))


def _days(start: float, end: float) -> list[tuple[str, float, float]]:
    """UTC days covering [start, end): (date, day start, day end) clipped to the window."""
    out = []
    first = datetime.fromtimestamp(start, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    t = first.timestamp()
    while t < end:
        out.append((_day(t), max(t, start), min(t + DAY_S, end)))
        t += DAY_S
    return out


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


def _mtbf_h(hours: float, count: int) -> float | None:
    """Exposure hours per interruption, once the exposure is enough to call it a rate."""
    return round(hours / count, 3) if count and hours >= MIN_MTBF_EXPOSURE_H else None


def _mtbf_note(hours: float, count: int) -> str | None:
    """Why an MTBF is not shown: too little exposure, or nothing failed in it."""
    if hours < MIN_MTBF_EXPOSURE_H:
        return NOT_ENOUGH
    return None if count else "no interruption"


def fleet_report(
    interruptions: Sequence[Interruption],
    groups: Sequence[GroupSpan],
    *,
    start: float,
    end: float,
    tokens_by_group_day: Mapping[tuple[str, str], int] | None = None,
    other_incidents: int = 0,
    exposure: Exposure | None = None,
) -> dict[str, Any]:
    """The reliability record of [start, end) as a JSON-safe dict."""
    hours = max(0.0, end - start) / 3600.0
    exp = exposure or Exposure()
    observed = exp.observed_hours
    inside = sorted((i for i in interruptions if start <= i.opened < end), key=lambda i: i.opened)
    # One restart is one interruption, blamed on the generation's first root cause; later
    # root causes of the same generation are counted with the other incidents.
    stops: list[Interruption] = []
    seen: set[tuple[str, int]] = set()
    for i in inside:
        # A risk (RPO/RTO, findings.RISK_KINDS) stopped nothing: it is never the
        # interruption, even when it opened before the generation's real root cause.
        if i.restarted and i.kind not in RISK_KINDS and (i.group, i.generation) not in seen:
            seen.add((i.group, i.generation))
            stops.append(i)
    lost_total = sum(i.total_lost_gpu_hours or 0.0 for i in stops)

    def share(part: float) -> float | None:
        return round(part / lost_total, 4) if lost_total else None

    def table(key: Any, rows: Iterable[Interruption]) -> dict[str, dict[str, Any]]:
        acc: dict[str, dict[str, Any]] = {}
        for i in rows:
            row = acc.setdefault(key(i), {"count": 0, "lost_gpu_hours": 0.0})
            row["count"] += 1
            row["lost_gpu_hours"] += i.total_lost_gpu_hours or 0.0
        return acc

    by_layer = table(lambda i: i.layer, stops)
    layers = [
        {
            "layer": layer,
            "label": LAYER_LABELS[layer],
            "category": category_of(layer),
            "count": by_layer[layer]["count"],
            "share": round(by_layer[layer]["count"] / len(stops), 4),
            "lost_gpu_hours": round(by_layer[layer]["lost_gpu_hours"], 4),
            "share_lost_gpu_hours": share(by_layer[layer]["lost_gpu_hours"]),
            "mtbf_hours": _mtbf_h(observed, by_layer[layer]["count"]),
            "mtbf_note": _mtbf_note(observed, by_layer[layer]["count"]),
        }
        for layer in LAYERS
        if layer in by_layer
    ]
    causes = table(lambda i: i.kind, stops)
    kind_layer = {i.kind: i.layer for i in stops}
    by_cause = sorted(
        (
            {
                "kind": kind,
                "layer": kind_layer[kind],
                "category": category_of(kind_layer[kind]),
                "count": row["count"],
                "share": round(row["count"] / len(stops), 4),
                "lost_gpu_hours": round(row["lost_gpu_hours"], 4),
                "share_lost_gpu_hours": share(row["lost_gpu_hours"]),
            }
            for kind, row in causes.items()
        ),
        key=lambda r: (-r["count"], r["kind"]),
    )
    cats = table(lambda i: category_of(i.layer), stops)
    categories = [
        {
            "category": c,
            "count": row["count"],
            "share": round(row["count"] / len(stops), 4),
            "lost_gpu_hours": round(row["lost_gpu_hours"], 4),
            "share_lost_gpu_hours": share(row["lost_gpu_hours"]),
        }
        for c, row in sorted(cats.items(), key=lambda kv: -kv[1]["count"])
    ]
    node_counts = Counter(i.node for i in stops if i.node)
    gpu_counts = Counter((i.node, i.gpu) for i in stops if i.gpu)
    per_node: list[dict[str, Any]] = [
        {
            "node": n,
            "interruptions": c,
            "node_hours": round(exp.per_node_hours.get(n, 0.0), 3),
            "mtbf_hours": _mtbf_h(exp.per_node_hours.get(n, 0.0), c),
            "mtbf_note": _mtbf_note(exp.per_node_hours.get(n, 0.0), c),
        }
        for n, c in sorted(node_counts.items(), key=lambda kv: (-kv[1], kv[0]))
    ]
    downs = [i.downtime_s for i in stops if i.downtime_s is not None]
    # ETTR per group: the share of its time in the window that became kept progress.
    lost_s: dict[str, float] = defaultdict(float)
    lost_tokens: dict[tuple[str, str], int] = defaultdict(int)
    for i in stops:
        lost_s[i.group] += (i.downtime_s or 0.0) + (i.lost_work_s or 0.0)
        lost_tokens[(i.group, _day(i.opened))] += i.lost_tokens or 0
    tokens = tokens_by_group_day or {}
    per_group = []
    for g in sorted(groups, key=lambda g: g.name):
        span = _overlap(g.start, g.end, start, end)
        mine = [i for i in stops if i.group == g.name]
        days = [d for d, _, _ in _days(start, end)]
        kept = sum(tokens.get((g.name, d), 0) - lost_tokens[(g.name, d)] for d in days)
        enough = span / 3600.0 >= MIN_ETTR_EXPOSURE_H
        per_group.append(
            {
                "group": g.name,
                "kind": g.kind,
                "gpus": g.gpus,
                "hours": round(span / 3600.0, 3),
                "gpu_hours": round(g.gpus * span / 3600.0, 3),
                "interruptions": len(mine),
                "lost_hours": round(lost_s[g.name] / 3600.0, 4),
                "ettr": _r(max(0.0, 1.0 - lost_s[g.name] / span), 4) if enough else None,
                "ettr_note": None if enough else NOT_ENOUGH,
                "goodput_tokens_per_s": _r(max(0, kept) / span, 3) if span and tokens else None,
            }
        )
    per_day = []
    for d, a, b in _days(start, end):
        sched = sum(g.gpus * _overlap(g.start, g.end, a, b) for g in groups) / 3600.0
        today = [i for i in stops if a <= i.opened < b]
        lost_h = sum(i.total_lost_gpu_hours or 0.0 for i in today)
        toks = sum(v for (_, day), v in tokens.items() if day == d)
        toks -= sum(v for (_, day), v in lost_tokens.items() if day == d)
        busy = sum(_overlap(g.start, g.end, a, b) for g in groups if g.kind != "serving")
        # A day's ETTR rests on the hours groups ran that day (sched / GPUs, summed).
        ran_h = sum(_overlap(g.start, g.end, a, b) for g in groups) / 3600.0
        per_day.append(
            {
                "day": d,
                "interruptions": len(today),
                "gpu_hours": round(sched, 3),
                "observed": bool(sched),
                "lost_gpu_hours": round(lost_h, 4),
                "ettr": _r(max(0.0, 1.0 - lost_h / sched), 4)
                if sched and ran_h >= MIN_ETTR_EXPOSURE_H
                else None,
                "goodput_tokens_per_s": _r(max(0, toks) / busy, 3) if busy and tokens else None,
            }
        )
    gpu_hours = sum(g.gpus * _overlap(g.start, g.end, start, end) for g in groups) / 3600.0
    job_hours = sum(_overlap(g.start, g.end, start, end) for g in groups) / 3600.0
    ettr_ok = job_hours >= MIN_ETTR_EXPOSURE_H
    hardware = next((c["share"] for c in categories if c["category"] == "hardware"), 0.0)
    count = len(stops)
    return {
        "window": {
            "start": datetime.fromtimestamp(start, UTC).isoformat(),
            "end": datetime.fromtimestamp(end, UTC).isoformat(),
            "days": round(hours / 24.0, 3),
        },
        "interruptions": count,
        "other_incidents": other_incidents + (len(inside) - len(stops)),
        "hardware_share": hardware if stops else None,
        "lost_gpu_hours": round(lost_total, 4),
        "gpu_hours": round(gpu_hours, 3),
        "ettr": _r(max(0.0, 1.0 - lost_total / gpu_hours), 4) if gpu_hours and ettr_ok else None,
        "ettr_note": None if ettr_ok else NOT_ENOUGH,
        "job_hours": round(job_hours, 3),
        "exposure": {
            "observed_hours": round(observed, 3),
            "gpu_hours": round(exp.gpu_hours, 3),
            "node_hours": round(exp.node_hours, 3),
            "min_mtbf_hours": MIN_MTBF_EXPOSURE_H,
            "min_ettr_hours": MIN_ETTR_EXPOSURE_H,
        },
        # Fleet-wide: the hours the fleet reported per interruption; per GPU over
        # GPU-hours and per node over node-hours (Llama 3; Meta's reliability study).
        "mtbf_hours": _mtbf_h(observed, count),
        "mtbf_gpu_hours": round(exp.gpu_hours / count, 3)
        if count and observed >= MIN_MTBF_EXPOSURE_H
        else None,
        "mtbf_node_hours": round(exp.node_hours / count, 3)
        if count and observed >= MIN_MTBF_EXPOSURE_H
        else None,
        "mtbf_note": _mtbf_note(observed, count),
        "mttr_s": _r(sum(downs) / len(downs), 2) if downs else None,
        "mttr_backed_by": len(downs),
        "by_layer": layers,
        "by_category": categories,
        "by_cause": by_cause,
        "per_node": per_node,
        "per_group": per_group,
        "per_day": per_day,
        "repeat_offenders": {
            "nodes": [r for r in per_node if int(r["interruptions"]) >= REPEAT_OFFENDER_MIN],
            "gpus": [
                {"node": n, "gpu": g, "interruptions": c}
                for (n, g), c in sorted(gpu_counts.items(), key=lambda kv: (-kv[1], kv[0][1]))
                if c >= REPEAT_OFFENDER_MIN
            ],
        },
        "incidents": [
            {
                "incident": i.incident,
                "group": i.group,
                "kind": i.kind,
                "layer": i.layer,
                "opened": datetime.fromtimestamp(i.opened, UTC).isoformat(),
                "node": i.node,
                "gpu": i.gpu,
                "downtime_s": i.downtime_s,
                "total_lost_gpu_hours": i.total_lost_gpu_hours,
            }
            for i in stops
        ],
    }


def markdown(report: Mapping[str, Any]) -> str:
    """The report as Markdown: the headline with the exposure each figure rests on, the
    table by layer, by cause, per group, the offenders."""
    w = report["window"]
    ex = report["exposure"]
    lines = [
        f"# Reliability record, {w['start'][:10]} to {w['end'][:10]} ({_n(w['days'])} days)",
        "",
        f"- exposure: {_n(ex['observed_hours'])} h observed, {_n(ex['gpu_hours'])} GPU-hours, "
        f"{_n(ex['node_hours'])} node-hours (MTBF needs {_n(ex['min_mtbf_hours'])} h)",
        f"- interruptions: **{report['interruptions']}** "
        f"(other incidents without a restart: {report['other_incidents']})",
        f"- hardware share: {_pct(report['hardware_share'])}",
        f"- lost GPU-hours: {_n(report['lost_gpu_hours'])} of {_n(report['gpu_hours'])} "
        f"scheduled; ETTR {_or(report['ettr'], report.get('ettr_note'))} "
        f"(over {_n(report['job_hours'])} job-hours)",
        f"- MTBF fleet-wide: {_or(report['mtbf_hours'], report['mtbf_note'], ' h')} "
        f"(over {_n(ex['observed_hours'])} h); per GPU: "
        f"{_or(report['mtbf_gpu_hours'], report['mtbf_note'], ' GPU-h')} "
        f"(over {_n(ex['gpu_hours'])} GPU-h); per node: "
        f"{_or(report['mtbf_node_hours'], report['mtbf_note'], ' node-h')} "
        f"(over {_n(ex['node_hours'])} node-h)",
        f"- MTTR: {_or(report['mttr_s'], None, ' s')} "
        f"(from {report['mttr_backed_by']} measured recoveries)",
        "",
        "## Interruptions by layer",
        "",
        "| layer | category | count | share | lost GPU-h | share of lost GPU-h | MTBF h |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in report["by_layer"]:
        lines.append(
            f"| {r['label']} | {r['category']} | {r['count']} | {_pct(r['share'])} | "
            f"{_n(r['lost_gpu_hours'])} | {_pct(r['share_lost_gpu_hours'])} | "
            f"{_or(r['mtbf_hours'], r.get('mtbf_note'))} |"
        )
    lines += ["", "## By root cause", "", "| kind | layer | count | share | lost GPU-h |"]
    lines.append("| --- | --- | --- | --- | --- |")
    for r in report["by_cause"]:
        lines.append(
            f"| `{r['kind']}` | {r['layer']} | {r['count']} | {_pct(r['share'])} | "
            f"{_n(r['lost_gpu_hours'])} |"
        )
    lines += ["", "## Per group", ""]
    lines.append("| group | GPUs | hours | GPU-hours | interruptions | ETTR | goodput tok/s |")
    lines.append("| --- | --- | --- | --- | --- | --- | --- |")
    for r in report["per_group"]:
        lines.append(
            f"| {r['group']} | {r['gpus']} | {_n(r['hours'])} | {_n(r['gpu_hours'])} | "
            f"{r['interruptions']} | {_or(r['ettr'], r.get('ettr_note'))} | "
            f"{_n(r['goodput_tokens_per_s'])} |"
        )
    lines += ["", "## Per node", "", "| node | interruptions | node-hours | MTBF h |"]
    lines.append("| --- | --- | --- | --- |")
    for r in report["per_node"]:
        lines.append(
            f"| {r['node']} | {r['interruptions']} | {_n(r['node_hours'])} | "
            f"{_or(r['mtbf_hours'], r.get('mtbf_note'))} |"
        )
    offenders = report["repeat_offenders"]
    lines += ["", "## Repeat offenders", ""]
    lines += [
        f"- node `{r['node']}`: {r['interruptions']} interruptions" for r in offenders["nodes"]
    ]
    lines += [
        f"- GPU `{r['gpu']}` on `{r['node']}`: {r['interruptions']} interruptions"
        for r in offenders["gpus"]
    ]
    if not offenders["nodes"] and not offenders["gpus"]:
        lines.append("none")
    return "\n".join(lines) + "\n"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.1f} %"


def _n(x: Any) -> str:
    if isinstance(x, int) and not isinstance(x, bool):
        return f"{x:,}"
    return "-" if x is None else formats.number(x)


def _or(x: Any, note: str | None, unit: str = "") -> str:
    """A figure with its unit, or why there is none ("not enough exposure")."""
    if x is None:
        return note or "-"
    return f"{_n(x)}{unit}"
