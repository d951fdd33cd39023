"""The Prometheus text exposition format (0.0.4, and OpenMetrics text) read with the stdlib.

Owns parsing a scrape into samples and Prometheus's own histogram arithmetic (the
`histogram_quantile` interpolation, the count at a threshold, increases across a counter
reset), so an exporter's mapping (agents/engines.py, agents/dcgm.py) only names series.
Bounded: the caller caps the bytes it reads, the parser caps the samples it keeps; a line it
cannot read is skipped and counted, never raised. Must not know any exporter's metric names.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

# A scrape larger than this is an exporter gone wrong (vLLM and SGLang serve tens of KB).
MAX_BYTES = 4 * 1024 * 1024
MAX_SAMPLES = 50_000

Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs: hashable, order-free

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*\"")
_QUOTED = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
_QUOTED_LABEL = re.compile(r'\s*"((?:[^"\\\n]|\\.)*)"\s*=\s*"')
_ESCAPE = re.compile(r"\\(.)")
# The common label set (plain names, quoted values, no quoted metric name), read at once.
_PAIR_SRC = r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\\n]|\\.)*)"\s*'
_BLOCK = re.compile(rf"((?:{_PAIR_SRC},)*(?:{_PAIR_SRC})?)\}}")
_PAIR = re.compile(_PAIR_SRC)
_ESCAPES = {"n": "\n", "\\": "\\", '"': '"'}
# Python's float() also takes "1_000" and "infinity"; the format does not.
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|Inf|inf|NaN|nan)")


def _unescape(raw: str) -> str:
    if "\\" not in raw:
        return raw
    return _ESCAPE.sub(lambda m: _ESCAPES.get(m.group(1), m.group(1)), raw)


@dataclass
class Exposition:
    """One scrape: samples by sample name (`x_bucket`, `x_count`, `y_total`...), each label
    set once (the last one read wins), and the families' declared types."""

    samples: dict[str, dict[Labels, float]] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)
    skipped: int = 0  # lines that were not comments and could not be read
    truncated: bool = False  # MAX_SAMPLES reached: later samples were dropped

    def series(
        self, name: str, where: Mapping[str, str] | None = None
    ) -> list[tuple[Labels, float]]:
        """The samples named `name` whose labels include every pair of `where`."""
        found = self.samples.get(name, {})
        if not where:
            return list(found.items())
        want = set(where.items())
        return [(labels, v) for labels, v in found.items() if want <= set(labels)]

    def declared(self, family: str) -> bool:
        """Whether the scrape declared `family` (a `# TYPE` line), with samples or without:
        a labelled counter no request has touched yet is declared and has no samples."""
        return family in self.types


def _labels(line: str, pos: int) -> tuple[Labels, str | None, int]:
    """The label set starting after `{` at `pos`: (labels, quoted metric name, end)."""
    block = _BLOCK.match(line, pos)
    if block is not None:
        found = {k: _unescape(v) for k, v in _PAIR.findall(block.group(1))}
        return tuple(sorted(found.items())), None, block.end()
    pairs: dict[str, str] = {}
    name: str | None = None
    end = len(line)
    while True:
        while pos < end and line[pos] in " \t":
            pos += 1
        if pos < end and line[pos] == "}":
            return tuple(sorted(pairs.items())), name, pos + 1
        if pos < end and line[pos] == '"' and name is None and not pairs:
            # OpenMetrics 2 / Prometheus 3: a UTF-8 metric name quoted inside the braces.
            m = _QUOTED.match(line, pos)
            if m is None:
                raise ValueError("unterminated quoted name")
            name, pos = _unescape(m.group(1)), m.end()
        else:
            m = _LABEL_NAME.match(line, pos)
            if m is None:
                m2 = _QUOTED_LABEL.match(line, pos)
                if m2 is None:
                    raise ValueError("bad label")
                key, pos = _unescape(m2.group(1)), m2.end() - 1
            else:
                key, pos = m.group(1), m.end() - 1
            v = _QUOTED.match(line, pos)
            if v is None:
                raise ValueError("unterminated label value")
            pairs[key] = _unescape(v.group(1))
            pos = v.end()
        while pos < end and line[pos] in " \t":
            pos += 1
        if pos < end and line[pos] == ",":
            pos += 1
        elif pos < end and line[pos] == "}":
            continue
        else:
            raise ValueError("expected , or }")


def parse_value(token: str) -> float:
    """A sample value: a float, `+Inf`/`-Inf`/`NaN` included; ValueError otherwise."""
    if _NUMBER.fullmatch(token) is None:
        raise ValueError(f"not a sample value: {token!r}")
    return float(token)


def parse(
    text: str, *, max_samples: int = MAX_SAMPLES, keep: Callable[[str], bool] | None = None
) -> Exposition:
    """Parse an exposition. Comments, `# HELP`, exemplars (` # {...} v`) and timestamps are
    read past; `# EOF` ends it; a malformed line is counted in `skipped` and left out. With
    `keep`, only samples whose name it accepts are read (a scrape's other families are
    skipped before their labels are parsed)."""
    out = Exposition()
    kept = 0
    # Only "\n" ends a line: a label value may hold \r, \x85 or \u2028 (str.splitlines
    # would split there), and prometheus_client writes them raw.
    for raw in text.split("\n"):
        line = raw.rstrip("\r").strip(" \t")
        if not line:
            continue
        if line[0] == "#":
            parts = line.split(None, 3)
            if len(parts) >= 2 and parts[1] == "EOF":
                break
            if len(parts) == 4 and parts[1] == "TYPE":
                out.types[parts[2].strip('"')] = parts[3].strip().lower()
            continue
        try:
            m = _NAME.match(line)
            labels: Labels = ()
            if m is not None:
                name, pos = m.group(0), m.end()
                if keep is not None and not keep(name):
                    continue
                if pos < len(line) and line[pos] == "{":
                    labels, _, pos = _labels(line, pos + 1)
            elif line[0] == "{":
                labels, quoted, pos = _labels(line, 1)
                if quoted is None:
                    raise ValueError("no metric name")
                name = quoted
                if keep is not None and not keep(name):
                    continue
            else:
                raise ValueError("no metric name")
            rest = line[pos:].split()
            if not rest or (pos < len(line) and line[pos] not in " \t"):
                raise ValueError("no value")
            value = parse_value(rest[0])
        except ValueError:
            out.skipped += 1
            continue
        if kept >= max_samples:
            out.truncated = True
            break
        family = out.samples.setdefault(name, {})
        if labels not in family:
            kept += 1
        family[labels] = value
    return out


# -- histograms ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Histogram:
    """A histogram's cumulative buckets `(le, count)` in ascending `le`, `+Inf` last, and its
    `_count` (the `+Inf` bucket where `_count` is missing)."""

    buckets: tuple[tuple[float, float], ...]
    count: float

    def bounds(self) -> tuple[float, ...]:
        return tuple(le for le, _ in self.buckets)


def histogram(
    expo: Exposition, family: str, where: Mapping[str, str] | None = None
) -> Histogram | None:
    """The histogram `family`, summed over every series matching `where` (engines, ranks):
    None when the scrape has no bucket of it."""
    per_le: dict[float, float] = {}
    for labels, value in expo.series(f"{family}_bucket", where):
        le = dict(labels).get("le")
        if le is None or math.isnan(value):
            continue
        try:
            bound = parse_value(le)
        except ValueError:
            continue
        per_le[bound] = per_le.get(bound, 0.0) + value
    if not per_le:
        return None
    count = sum(v for _, v in expo.series(f"{family}_count", where) if not math.isnan(v))
    buckets = sorted(per_le.items())
    if buckets[-1][0] != math.inf:
        buckets.append((math.inf, max(count, buckets[-1][1])))
    # Buckets scraped while observations land can read non-monotonic; Prometheus's
    # histogram_quantile takes the running maximum, and so does this.
    fixed: list[tuple[float, float]] = []
    top = 0.0
    for upper, cum in buckets:
        top = max(top, cum)
        fixed.append((upper, top))
    return Histogram(tuple(fixed), fixed[-1][1] if not count else max(count, fixed[-1][1]))


def increase(before: Histogram | None, after: Histogram) -> Histogram:
    """`after - before` bucket by bucket; what `after` holds alone when there is no `before`,
    when the layout changed, or when any bucket went down (the exporter restarted: like
    Prometheus's increase(), everything counted since the restart is the increase)."""
    if before is None or before.bounds() != after.bounds():
        return after
    diff = [(le, a - b) for (le, a), (_, b) in zip(after.buckets, before.buckets, strict=True)]
    if any(d < 0 for _, d in diff) or after.count < before.count:
        return after
    return Histogram(tuple(diff), after.count - before.count)


def quantile(q: float, h: Histogram) -> float | None:
    """Prometheus's histogram_quantile on one histogram (promql/quantile.go, the same
    arithmetic in the same order): linear interpolation inside the bucket the rank falls in
    (from 0 for the first bucket when its bound is positive); the highest finite bound when
    the rank falls in `+Inf`. None without observations."""
    if len(h.buckets) < 2 or h.buckets[-1][1] <= 0:
        return None
    rank = q * h.buckets[-1][1]
    b = next((i for i, (_, cum) in enumerate(h.buckets[:-1]) if cum >= rank), len(h.buckets) - 1)
    if b == len(h.buckets) - 1:
        return h.buckets[-2][0]
    if b == 0 and h.buckets[0][0] <= 0:
        return h.buckets[0][0]
    start, (end, count) = 0.0, h.buckets[b]
    if b > 0:
        start = h.buckets[b - 1][0]
        count -= h.buckets[b - 1][1]
        rank -= h.buckets[b - 1][1]
    if count <= 0:  # only for q = 0 on an empty first bucket (Prometheus: NaN)
        return start
    return start + (end - start) * (rank / count)


def at_most(h: Histogram, threshold: float) -> tuple[float, float | None]:
    """Observations certainly ≤ `threshold`: the cumulative count of the largest bucket bound
    ≤ threshold (0 when every bound is above it), and that bound (None: none). A lower bound,
    exact when `threshold` is itself a bucket bound."""
    best: tuple[float, float | None] = (0.0, None)
    for le, cum in h.buckets:
        if le <= threshold:
            best = (cum, le)
    return best


def total(expo: Exposition, name: str, where: Mapping[str, str] | None = None) -> float | None:
    """The sum of `name`'s samples matching `where` (NaN left out); None when it has none."""
    values = [v for _, v in expo.series(name, where) if not math.isnan(v)]
    return sum(values) if values else None


def largest(expo: Exposition, names: Iterable[str]) -> float | None:
    """The largest finite sample of the first of `names` the scrape has."""
    for name in names:
        values = [v for _, v in expo.series(name) if math.isfinite(v)]
        if values:
            return max(values)
    return None
