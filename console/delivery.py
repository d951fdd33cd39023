"""A node's delivery delay as the console shows it: how late the node's data arrives.

Owns the reading of the two node columns ingest keeps per batch (console_node's
`delivery_delay_s`, the newest batch's, and `delivery_delays`, the newest batches', oldest
first: ingest.store.delivery defines the delay) into what the node page and /metrics show:
the newest, the p95 (nearest rank) and the worst of the kept batches. Pure: it reads the
values it is given and writes nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DeliveryDelay:
    newest_s: float | None
    p95_s: float | None
    max_s: float | None
    batches: int  # how many batches the p95 and the worst are over


def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank percentile (`q` in 0..1): a value that was seen, never a blend."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _numbers(raw: Any) -> list[float]:
    if not isinstance(raw, list):
        return []
    return [float(v) for v in raw if isinstance(v, int | float) and not isinstance(v, bool)]


def of_node(newest: float | None, kept: Any) -> DeliveryDelay:
    """The node's delivery delay from its row's `delivery_delay_s` and `delivery_delays`."""
    values = _numbers(kept)
    return DeliveryDelay(
        newest_s=newest,
        p95_s=percentile(values, 0.95),
        max_s=max(values, default=None),
        batches=len(values),
    )
