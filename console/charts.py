"""Shape server-side aggregates into what the console's charts draw.

Owns the binning rules (at most MAX_RANK_BINS x MAX_TIME_BINS heatmap cells, whatever
the group's size), the state-machine segments, the checkpoint table and badput bars.
Pure functions over plain rows: the SQL that produces the rows lives in console.queries.telemetry,
and nothing here touches the database, the clock or a request. Must not loop over raw
telemetry rows — callers hand in rows Postgres has already aggregated.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from agents import gpu_health
from console import formats
from console.diagnosis.config import DiagnosisConfig

MAX_RANK_BINS = 256
MAX_TIME_BINS = 120
MIN_BIN_S = 1.0

VALID_PHASES = ("committed", "verified")
BADPUT_CAUSES = ("stall", "restart", "checkpoint", "recompute", "invalid")
PHASES = ("compute", "collective", "input", "checkpoint", "optimizer")


@dataclass(frozen=True, slots=True)
class TimeGrid:
    """`bins` equal time bins of `width_s` seconds starting at `start` (epoch seconds)."""

    start: float
    width_s: float
    bins: int

    def label(self, index: int) -> str:
        return datetime.fromtimestamp(self.start + index * self.width_s, UTC).isoformat()

    def labels(self) -> list[str]:
        return [self.label(i) for i in range(self.bins)]


def time_grid(
    first: datetime, last: datetime, *, max_bins: int = MAX_TIME_BINS, step_s: float = MIN_BIN_S
) -> TimeGrid:
    """At most `max_bins` bins over [first, last], each a whole number of `step_s` steps.

    Bin edges are multiples of `step_s` since the epoch and the last bin holds `last`, so
    the chart can add up rollup buckets of `step_s` seconds without splitting one.
    """
    lo = math.floor(first.timestamp() / step_s)
    hi = math.floor(last.timestamp() / step_s)
    steps = max(hi - lo + 1, 1)
    per_bin = -(-steps // max_bins)  # ceil
    bins = -(-steps // per_bin)
    width = per_bin * step_s
    return TimeGrid(start=(hi + 1) * step_s - bins * width, width_s=width, bins=bins)


def rank_block(world: int, *, max_bins: int = MAX_RANK_BINS) -> int:
    """Ranks per heatmap row: the smallest power of two that fits `world` in `max_bins` rows.

    A power of two, so a row is always whole rollup blocks (ingest.step_bins uses this
    rule for its blocks): one rank per row up to `max_bins` ranks, 64 at 16,384.
    """
    block = 1
    while block * max_bins < world:
        block *= 2
    return block


def rank_bins(world: int, *, max_bins: int = MAX_RANK_BINS) -> int:
    """How many heatmap rows `world` ranks take: whole blocks of rank_block(world) ranks."""
    block = rank_block(world, max_bins=max_bins)
    return max(1, -(-world // block))


def rank_bin_labels(world: int, bins: int) -> list[str]:
    """'r12' for a one-rank bin, 'r0-63' for a bin of many (same edges as the SQL)."""
    block = rank_block(world)
    labels = []
    for b in range(bins):
        lo = b * block
        hi = min(lo + block, max(world, lo + 1)) - 1
        labels.append(f"r{lo}" if lo >= hi else f"r{lo}-{hi}")
    return labels


def _round(value: float | None, digits: int = 1) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(value, digits)


def heatmap(
    cells: Iterable[Sequence[Any]], *, world: int, bins: int, grid: TimeGrid
) -> dict[str, Any]:
    """Rows (rank_bin, time_bin, slowest_ms) -> a z matrix of rank bins x time bins.

    A cell holds the slowest step in it: a straggler must not be averaged away by the
    63 healthy ranks that share its bin. Empty cells stay None (no data is not "fast").
    """
    z: list[list[float | None]] = [[None] * grid.bins for _ in range(bins)]
    for rb, tb, value, *_ in cells:
        if 0 <= rb < bins and 0 <= tb < grid.bins:
            z[rb][tb] = _round(value)
    return {
        "x": grid.labels(),
        "y": rank_bin_labels(world, bins),
        "z": z,
        "ranks_per_bin": rank_block(world),
        "bin_s": grid.width_s,
    }


# The step-time scale's colours: faster than the median, the median (healthy), the
# group's straggler limit, and beyond it.
SCALE_COLOURS = ("#1f6f4c", "#2f9e6b", "#d9a400", "#e5484d")
# The diagnosis' default straggler ratio, for a group not diagnosed yet.
STRAGGLER_RATIO = float(DiagnosisConfig.__dataclass_fields__["straggler_ratio"].default)  # type: ignore[arg-type]  # a field with a plain default


def step_scale(
    values: Iterable[float | None], diagnosed: Mapping[str, Any] | None = None
) -> dict[str, Any] | None:
    """The heatmap's colour scale and the percentile chart's axis, anchored to the group.

    The median and the straggler limit are the ones the group's diagnosis used
    (`diagnosed`: the summary's `step_scale_ms`, rules/stragglers.py); before a diagnosis,
    the median of `values` and the default straggler ratio. The span from the median is at
    least the limit's distance from it, so ranks a percent apart are one colour and a rank
    past the limit is red, whatever the data's own min and max. None without data.
    """
    data = sorted(v for v in values if v is not None and math.isfinite(v))
    if not data:
        return None
    source = "diagnosis"
    median = _positive((diagnosed or {}).get("median"))
    limit = _positive((diagnosed or {}).get("limit"))
    if median is None or limit is None or limit <= median:
        source = "chart"
        mid = len(data) // 2
        median = data[mid] if len(data) % 2 else (data[mid - 1] + data[mid]) / 2
        if median <= 0:
            return None
        limit = median * STRAGGLER_RATIO
    # Rounded once here, so the figures the page shows keep the span rule exactly; the range
    # is widened outward to the tenth so it still holds every value.
    median, limit = round(median, 1), round(limit, 1)
    if limit <= median:
        return None
    span = limit - median
    zmin = math.floor(min(median - span, data[0]) * 10) / 10
    zmax = math.ceil(max(limit + span, data[-1]) * 10) / 10

    def at(v: float) -> float:
        return round((v - zmin) / (zmax - zmin), 4)

    colours = [
        [0.0, SCALE_COLOURS[0]],
        [at(median), SCALE_COLOURS[1]],
        [at(limit), SCALE_COLOURS[2]],
        [1.0, SCALE_COLOURS[3]],
    ]
    return {
        "median_ms": median,
        "limit_ms": limit,
        "zmin": zmin,
        "zmax": zmax,
        "colorscale": colours,
        "rho_max": round(max(limit / median, 1.0) + span / median, 3),
        "source": source,
    }


def _positive(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return None


def percentile_series(rows: Iterable[Sequence[Any]], *, grid: TimeGrid) -> dict[str, Any]:
    """Rows (time_bin, p50, p90, p99, ranks) -> aligned series plus the tail ratio p99 / p50."""
    out: dict[str, list[Any]] = {"t": [], "p50": [], "p90": [], "p99": [], "rho": [], "n": []}
    for tb, p50, p90, p99, n in sorted(rows, key=lambda r: r[0]):
        if not 0 <= tb < grid.bins:
            continue
        out["t"].append(grid.label(tb))
        out["p50"].append(_round(p50))
        out["p90"].append(_round(p90))
        out["p99"].append(_round(p99))
        rho = p99 / p50 if p50 and p99 is not None else None
        out["rho"].append(_round(rho, 3))
        out["n"].append(n)
    return out


def histogram_percentiles(
    rows: Iterable[Sequence[Any]],
    *,
    resolution: int,
    quantiles: Sequence[float] = (0.5, 0.9, 0.99),
) -> list[tuple[Any, ...]]:
    """Rows (time_bin, log_bucket, count) -> (time_bin, *percentiles, count) per time bin.

    Bucket b holds durations in [e^(b/res), e^((b+1)/res)); a percentile is the geometric
    middle of the bucket where the cumulative count reaches it (error <= half a bucket).
    """
    by_bin: dict[int, list[tuple[int, int]]] = {}
    for tb, hb, n in rows:
        by_bin.setdefault(tb, []).append((hb, n))
    out = []
    for tb in sorted(by_bin):
        buckets = sorted(by_bin[tb])
        total = sum(n for _, n in buckets)
        values = []
        for q in quantiles:
            need, seen = q * total, 0
            for hb, n in buckets:
                seen += n
                if seen >= need:
                    values.append(math.exp((hb + 0.5) / resolution))
                    break
        out.append((tb, *values, total))
    return out


def slowest_bins(cells: Iterable[Sequence[Any]], *, count: int) -> list[int]:
    """Rank bins whose slowest step is highest on average over time: where stragglers live.

    A rank that is slow for the whole window lifts its bin's maximum in every time bin,
    so it ranks its bin first even when 63 healthy ranks share it.
    """
    sums: dict[int, list[float]] = {}
    for rb, _tb, slowest, *_ in cells:
        if slowest is not None:
            acc = sums.setdefault(rb, [0.0, 0])
            acc[0] += slowest
            acc[1] += 1
    ranked = sorted(sums, key=lambda rb: sums[rb][0] / sums[rb][1], reverse=True)
    return sorted(ranked[:count])


def ranks_in_bins(bins_: Iterable[int], *, world: int) -> list[int]:
    """Every rank r < world with r // rank_block(world) in `bins_` (the SQL's binning)."""
    block = rank_block(world)
    out: list[int] = []
    for b in bins_:
        out.extend(range(b * block, min((b + 1) * block, world)))
    return out


def slowest_phases(
    rows: Iterable[Sequence[Any]], medians: Mapping[str, float] | None = None
) -> dict[str, Any]:
    """Rows (rank, mean_ms, *phase means) -> stacked bars, with the group median first."""
    ranks: list[str] = []
    totals: list[float | None] = []
    series: dict[str, list[float | None]] = {p: [] for p in PHASES}
    if medians:
        ranks.append("median")
        totals.append(None)
        for p in PHASES:
            series[p].append(_round(medians.get(p)))
    for rank, mean_ms, *phases in rows:
        ranks.append(f"r{rank}")
        totals.append(_round(mean_ms))
        for p, v in zip(PHASES, phases, strict=False):
            series[p].append(_round(v))
    return {"ranks": ranks, "total_ms": totals, "phases": series}


def badput(goodput: Mapping[str, Any] | None) -> dict[str, Any]:
    """Wall time split into productive seconds and badput seconds by cause."""
    if not goodput:
        return {"causes": [], "seconds": [], "productive_s": None, "wall_s": None}
    bad = goodput.get("badput_s") or {}
    causes = [c for c in BADPUT_CAUSES if c in bad] + sorted(set(bad) - set(BADPUT_CAUSES))
    wall = goodput.get("wall_s")
    frac = goodput.get("productive_fraction")
    return {
        "causes": causes,
        "seconds": [_round(float(bad[c]), 2) for c in causes],
        "productive_s": _round(wall * frac, 2) if wall is not None and frac is not None else None,
        "wall_s": wall,
    }


def state_segments(transitions: Iterable[Mapping[str, Any]], now: datetime) -> list[dict]:
    """Transition rows (oldest first) -> one segment per state with its start and end.

    The last segment is open-ended (`end` None, `duration_s` up to `now`); a segment in
    a new generation marks a restart.
    """
    rows = list(transitions)
    out = []
    for i, t in enumerate(rows):
        end = rows[i + 1]["ts"] if i + 1 < len(rows) else None
        stop = end or now
        out.append(
            {
                "state": t["to_state"],
                "from_state": t.get("from_state"),
                "start": t["ts"].isoformat(),
                "end": end.isoformat() if end else None,
                "duration_s": round(max((stop - t["ts"]).total_seconds(), 0.0), 1),
                "generation": t["generation"],
                "restart_count": t.get("restart_count"),
                "reason": t.get("reason"),
                "new_generation": i > 0 and t["generation"] != rows[i - 1]["generation"],
            }
        )
    return out


def checkpoint_table(
    records: Iterable[Mapping[str, Any]], newest_valid: str | None
) -> list[dict[str, Any]]:
    """Checkpoint phase rows -> one row per checkpoint (newest first) with its validity.

    `valid` is True only for the checkpoint diagnosis named the newest valid one, False
    for one whose latest phase is `corrupt`, and None ("not proven") otherwise: a
    committed checkpoint the engine did not pick has not been shown restorable.
    """
    by_id: dict[str, dict[str, Any]] = {}
    for r in sorted(records, key=lambda r: r["ts"]):
        row = by_id.setdefault(
            r["checkpoint_id"],
            {"id": r["checkpoint_id"], "phases": [], "first_ts": r["ts"].isoformat()},
        )
        row["phase"] = r["phase"]
        row["step"] = r.get("step") if r.get("step") is not None else row.get("step")
        row["generation"] = r.get("generation")
        row["ts"] = r["ts"].isoformat()
        if r["phase"] not in row["phases"]:
            row["phases"].append(r["phase"])
        if r.get("detail"):
            row["detail"] = r["detail"]
    rows = sorted(by_id.values(), key=lambda r: r["ts"], reverse=True)
    for row in rows:
        row["newest_valid"] = row["id"] == newest_valid
        if row["newest_valid"]:
            row["valid"] = True
        elif "corrupt" in row["phases"]:
            row["valid"] = False
        else:
            row["valid"] = None
    return rows


def worst_health(node: Mapping[str, Any]) -> str:
    """The worst of a node's own health and its GPUs': the colour of its grid cell."""
    healths = [node.get("health") or "unknown"]
    healths += [d.get("health") or "unknown" for d in node.get("devices", [])]
    return gpu_health.worst_health(healths)


def symptom_groups(
    symptoms: Iterable[Mapping[str, Any]], *, root_kind: str, root_subject: str
) -> list[dict[str, Any]]:
    """Symptoms -> one fold per kind (most first) with a count and why it is suppressed."""
    folds: dict[str, dict[str, Any]] = {}
    for s in symptoms:
        fold = folds.setdefault(
            s["kind"],
            {
                "kind": s["kind"],
                "count": 0,
                "active": 0,
                "reason": f"explained by root cause {root_kind} on {root_subject}",
                "items": [],
            },
        )
        fold["count"] += 1
        fold["active"] += 1 if s.get("active", True) else 0
        fold["items"].append(s)
    return sorted(folds.values(), key=lambda f: (-f["count"], f["kind"]))


def timeline(
    marks: Mapping[str, Any], comments: Iterable[Mapping[str, Any]] = ()
) -> list[dict[str, Any]]:
    """Incident timeline marks and comments, merged oldest first."""
    order = ("first_evidence", "detected", "acknowledged", "quiesce", "reopened", "resolved")
    out: list[dict[str, Any]] = []
    for key in sorted(marks, key=lambda k: (order.index(k) if k in order else len(order), k)):
        if marks[key]:
            out.append({"kind": "mark", "label": key.replace("_", " "), "at": str(marks[key])})
    for c in comments:
        out.append({"kind": "comment", "label": c["author"], "at": c["at"], "body": c["body"]})
    return sorted(out, key=lambda e: _sort_key(e["at"]))


def _sort_key(at: str) -> datetime:
    try:
        ts = datetime.fromisoformat(at.replace("Z", "+00:00"))
    except ValueError:
        return datetime.max.replace(tzinfo=UTC)
    return ts if ts.tzinfo else ts.replace(tzinfo=UTC)


def evidence_rows(evidence: Mapping[str, Any], *, max_items: int = 20) -> list[dict[str, str]]:
    """Evidence as label/value rows: lists capped with a count, mappings as compact JSON,
    numbers in the console's format; a timestamp comes as `at` (the page shows it relative)."""
    rows = []
    for key, value in evidence.items():
        row = {"key": str(key).replace("_", " ")}
        if isinstance(value, str) and _is_time(value):
            row["at"] = value
        if isinstance(value, list | tuple) and not value:
            text = "—"
        elif isinstance(value, list | tuple):
            shown = ", ".join(_text(v) for v in value[:max_items])
            more = len(value) - max_items
            text = f"{shown} … ({more} more)" if more > 0 else shown
        else:
            text = _text(value)
        rows.append({**row, "value": text})
    return rows


def _is_time(value: str) -> bool:
    return (
        len(value) >= 19
        and value[4] == "-"
        and value[10] == "T"
        and formats.parse(value) is not None
    )


def _tidy(value: Any) -> Any:
    """Nested evidence for JSON display: floats to four significant digits, timestamps as
    the absolute UTC time the pages show on hover (relative text would go stale in JSON)."""
    if isinstance(value, dict):
        return {k: _tidy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_tidy(v) for v in value]
    if isinstance(value, float):
        return formats.rounded(value) if math.isfinite(value) else str(value)
    if isinstance(value, str) and _is_time(value):
        ts = formats.parse(value)
        return formats.absolute(ts) if ts else value
    return value


def _text(value: Any) -> str:
    if isinstance(value, dict | list):
        return json.dumps(_tidy(value), sort_keys=True, default=str)[:2000]
    if isinstance(value, float):  # a NaN loss is the evidence: shown as such, never "—"
        return formats.number(value) if math.isfinite(value) else str(value)
    if isinstance(value, str) and _is_time(value):
        ts = formats.parse(value)
        return formats.absolute(ts) if ts else value
    return "—" if value is None else str(value)


def si(value: float | None, unit: str = "") -> str:
    """1.1e7 -> '11 M' + unit: figures an on-call engineer reads at a glance
    (console.formats.number: four significant digits, separators, SI from a million)."""
    return formats.number(value, unit)
