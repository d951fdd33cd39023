"""Small robust statistics (median, MAD, percentiles) over plain floats.

Owns the numeric helpers the rules share. Must not know about records or findings.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def median(values: Sequence[float]) -> float:
    """Median of a non-empty sequence."""
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    if n % 2:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2.0


def mad(values: Sequence[float], center: float | None = None) -> float:
    """Median absolute deviation around `center` (the median by default)."""
    c = median(values) if center is None else center
    return median([abs(v - c) for v in values])


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    frac = pos - lo
    return ordered[lo] + (ordered[hi] - ordered[lo]) * frac


def finite(values: Iterable[float | None]) -> list[float]:
    """The finite numbers among `values` (drops None, NaN and infinities)."""
    return [v for v in values if v is not None and math.isfinite(v)]


def is_bad_number(value: float | None) -> bool:
    """True for NaN or infinity; None is 'not reported', not bad."""
    return value is not None and not math.isfinite(value)
