"""Telemetry upkeep, run hourly by the Celery task `console.maintain_telemetry` (ingest/tasks.py).

Creates the coming days' partitions, drops whole days older than `keep_days` (O(1), no
dead tuples), deletes 5 s step bins older than a day, trims the DEFAULT partitions,
and refolds the last hour of minute rollups as a backstop for a missed per-minute run.
Event-sized tables are not partitioned and keep their rows (they are the evidence
incidents cite).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from ingest import partitions, rollups, step_bins
from ingest.models import HostSample, NetSample

# An hourly run refolds a little more than an hour, so no minute falls between two runs.
BACKSTOP_MINUTES = 70
STEP_BINS_KEEP = timedelta(days=1)
HOST_SAMPLES_KEEP = timedelta(days=1)


def run(*, now: datetime, keep_days: int) -> dict[str, int]:
    """Returns rows removed per telemetry table."""
    partitions.ensure_partitions(days_ahead=2, now=now)
    cutoff = now - timedelta(days=keep_days)
    removed = partitions.drop_partitions_before(cutoff)
    # The 5 s step bins feed only the group page's 10-minute charts (longer ranges read
    # the minute rollups): keep one day of them, not the raw retention. At 16k ranks that
    # is ~4.4M small rows, removed by an hourly DELETE by bucket.
    removed["ingest_stepbinrollup"] = step_bins.trim(before=max(cutoff, now - STEP_BINS_KEEP))
    # Host and network samples (issue 18) feed only the snapshot's newest row per node and
    # port: a day of them is plenty (their events are kept).
    for model in (HostSample, NetSample):
        deleted, _ = model.objects.filter(ts__lt=now - HOST_SAMPLES_KEEP).delete()
        removed[model._meta.db_table] = deleted
    rollups.rollup(now=now, minutes=BACKSTOP_MINUTES)
    return removed
