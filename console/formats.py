"""How the console writes times, numbers and durations for people: one format each.

Owns the rules every page follows (static/console/common.js mirrors them for live
updates, and tests/server/pages/test_formats.py holds both to the same cases):

- a time is relative ("4 min ago", "in 20 min"), its absolute UTC time on hover; the REST
  API keeps ISO 8601;
- a number has at most four significant digits, thousands separators from 1,000 and an SI
  prefix from a million ("22,090 tok/s", "0.1667", "17.69 M");
- a duration is in the largest units that fit ("850 ms", "12.3 s", "4 min 10 s").

Pure: no Django, no clock (the caller passes `now`).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

SIG_DIGITS = 4
_SI = ((1e12, "T"), (1e9, "G"), (1e6, "M"))


def _finite(value: object) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        x = float(value)  # type: ignore[arg-type]  # a str or Decimal from a template
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _sig(x: float, digits: int = SIG_DIGITS) -> float:
    """`x` to `digits` significant digits, halves away from zero (as common.js rounds)."""
    if abs(x) < 1e-12:  # below what any format here shows (and 10**324 overflows)
        return 0.0
    scale = 10.0 ** (digits - 1 - math.floor(math.log10(abs(x))))
    return math.copysign(math.floor(abs(x) * scale + 0.5) / scale, x)


def rounded(x: float) -> float:
    """`x` to four significant digits, as a number (for JSON the page shows as text)."""
    return _sig(x)


def _plain(x: float) -> str:
    """A rounded value without float noise or trailing zeros, separators from 1,000."""
    if abs(x) >= 1000 or x == int(x):
        return f"{round(x):,}"
    text = f"{x:.{SIG_DIGITS + 2}f}".rstrip("0").rstrip(".")
    return text


def number(value: object, unit: str = "") -> str:
    """22090.181 -> "22,090", 0.166667 -> "0.1667", 17690000 -> "17.69 M" (+ " " + unit)."""
    x = _finite(value)
    if x is None:
        return "—"
    x = _sig(x)
    for scale, prefix in _SI:
        if abs(x) >= scale:
            return f"{_plain(_sig(x / scale))} {prefix}" + (f" {unit}" if unit else "")
    text = _plain(x)
    return f"{text} {unit}" if unit else text


def count(value: object) -> str:
    """An exact count or step number, never rounded: 12345 -> "12,345"."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return "—"
    return f"{value:,}" if isinstance(value, int) else number(value)


def percent(fraction: object) -> str:
    """0.8312 -> "83.12 %" (a share as a percentage, four significant digits)."""
    x = _finite(fraction)
    return "—" if x is None else number(x * 100, "%")


def duration(seconds: object) -> str:
    """Seconds in the units a person reads: 0.85 -> "850 ms", 250 -> "4 min 10 s"."""
    s = _finite(seconds)
    if s is None:
        return "—"
    sign, s = ("-" if s < 0 else ""), abs(s)
    if s < 1:
        return f"{sign}{number(s * 1000)} ms"
    if s < 60:
        return f"{sign}{number(s)} s"
    if (t := round(s)) < 3600:
        whole, rest, names = *divmod(t, 60), ("min", "s")
    elif (t := round(s / 60)) < 1440:
        whole, rest, names = *divmod(t, 60), ("h", "min")
    else:
        whole, rest, names = *divmod(round(s / 3600), 24), ("d", "h")
    return f"{sign}{whole:,} {names[0]}" + (f" {rest} {names[1]}" if rest else "")


def relative(ts: datetime, now: datetime) -> str:
    """`ts` from `now`: "just now", "35 s ago", "4 min ago", "3 h ago", "in 20 min"."""
    delta = (now - ts).total_seconds()
    ahead, s = delta < 0, abs(delta)
    if s < 5:
        return "just now"
    if s < 60:
        text = f"{int(s)} s"
    elif s < 3600:
        text = f"{int(s // 60)} min"
    elif s < 86400:
        text = f"{int(s // 3600)} h"
    else:
        text = f"{int(s // 86400):,} d"
    return f"in {text}" if ahead else f"{text} ago"


def absolute(ts: datetime) -> str:
    """The hover text: "2026-12-06 21:25:38 UTC" (seconds; no microseconds)."""
    return ts.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def parse(value: object) -> datetime | None:
    """A datetime, or an ISO 8601 string as the API writes it; None for anything else."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if not isinstance(value, str) or len(value) < 10:
        return None
    try:
        ts = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return ts if ts.tzinfo else ts.replace(tzinfo=UTC)
