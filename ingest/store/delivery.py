"""A batch's delivery delay: how long its oldest sample took from the node to the database.

Owns the definition (the oldest periodic sample of the batch — heartbeat, device, host or
network sample, the kinds an agent stamps when it takes them — against the time the batch
is stored, on the service's clock: a node clock the batch's skew shifted is shifted back)
and the node row's SQL that keeps the newest value and the newest DELAYS_KEPT. A batch of
events alone (an Xid, a step) has no delay: an event's time is when it happened, which may
be long before the agent saw it (a kernel log read at start). Must not read or write
anything else.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from agents import protocol as p
from agents.spool import SAMPLE_KINDS

# The node keeps this many batches' delays: a minute of batches at the default send
# interval, enough for a p95 that outlives one slow batch.
DELAYS_KEPT = 60

# Appended to the node's update in the batch's last round trip (ingest.store.live_state);
# a batch without samples leaves both columns as they were.
NODE_DELAY_SET = f"""
    delivery_delay_s = coalesce(%(delivery_delay_s)s::float8, delivery_delay_s),
    delivery_delays = CASE WHEN %(delivery_delay_s)s::float8 IS NULL THEN delivery_delays
        WHEN jsonb_array_length(delivery_delays) >= {DELAYS_KEPT}
        THEN (delivery_delays - 0) || to_jsonb(%(delivery_delay_s)s::float8)
        ELSE delivery_delays || to_jsonb(%(delivery_delay_s)s::float8) END"""


def _sample(rec: p.Record) -> bool:
    return rec.__struct_config__.tag in SAMPLE_KINDS


def batch_delay_s(batch: p.Batch, now: datetime, shift: timedelta) -> float | None:
    """Seconds from the batch's oldest sample to `now` (when it is stored), at least 0;
    None without a sample. `shift` is the batch's clock correction (ingest.store.batch)."""
    oldest = min((rec.ts for rec in batch.records if _sample(rec)), default=None)
    if oldest is None:
        return None
    return round(max(0.0, (now - (oldest - shift)).total_seconds()), 3)
