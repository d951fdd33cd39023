"""How evenly a fleet came back after an outage: the busiest second of a recovery against
the recovery's mean rate.

Owns the one definition the backoff property test and the lossy-link system test share:
arrivals are counted per whole second from the moment the link came back, over the
recovery: the backoff cap (by then every agent has tried again), or longer if the first
RECOVERED share of the fleet took longer. A fleet that all came back in one second is a
herd, not an even recovery of one second; the last few agents behind a lossy link are
their own TCP's retransmission timers (a SYN lost three times waits 7 s), not the
schedule, and would stretch the mean over seconds nobody arrived in. Pure: no I/O.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable

RECOVERED = 0.95


def per_second(offsets: Iterable[float], window_s: float = 0.0) -> list[int]:
    """Arrivals in each second of the recovery (offsets: seconds after the link came back;
    a negative one counts in the first), over `window_s` or to the last arrival's second."""
    seconds = [max(0, math.floor(x)) for x in offsets]
    if not seconds:
        return []
    counts = Counter(seconds)
    span = max(max(seconds) + 1, math.ceil(window_s))
    return [counts.get(s, 0) for s in range(span)]


def recovered(offsets: Iterable[float], share: float = RECOVERED) -> list[float]:
    """The first `share` of the fleet's arrivals (at least one), in order."""
    ordered = sorted(offsets)
    return ordered[: max(1, math.ceil(share * len(ordered)))] if ordered else []


def peak_to_mean(offsets: Iterable[float], window_s: float = 0.0) -> float:
    """The busiest second's arrivals over the recovery's mean arrivals per second, over the
    first RECOVERED of the fleet: 1.0 is a perfectly even recovery; every agent in the same
    second of a 30 s window is 30."""
    bins = per_second(recovered(offsets), window_s)
    if not bins:
        return 0.0
    return max(bins) / (sum(bins) / len(bins))
