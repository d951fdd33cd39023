"""Ingest's periodic tasks: step bins, minute rollups, partitions, statistics, retention.

Thin Celery wrappers (stable names, idempotent, scheduled by name in the beat schedule of
faultline/celery.py). The work is ingest.step_bins', ingest.rollups' and
ingest.retention's; nothing here may touch console state.
"""

from __future__ import annotations

from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from ingest import partitions, retention, rollups, step_bins

# Names kept from when these ran as console tasks: a beat schedule or a queued message
# from before the move still finds them.
ROLLUP_STEP_BINS = "console.rollup_step_bins"
ROLLUP_TELEMETRY = "console.rollup_telemetry"
MAINTAIN_TELEMETRY = "console.maintain_telemetry"
ANALYZE_PARTITIONS = "ingest.analyze_partitions"


@shared_task(name=ROLLUP_STEP_BINS, acks_late=True, expires=5)
def rollup_step_bins() -> None:
    """5 s step bins for the group charts (idempotent; skips while another pass runs)."""
    step_bins.rollup(now=timezone.now())


@shared_task(name=ROLLUP_TELEMETRY, acks_late=True, expires=55)
def rollup_telemetry() -> None:
    """1-minute rollups of the last closed minutes (idempotent: safe to run twice)."""
    now = timezone.now()
    rollups.rollup(now=now)
    # Backstop for the 5 s step bins: refold the last 2 minutes once a minute, so a row
    # that arrived later than a 5 s pass looks back (an agent's spool) reaches the charts.
    step_bins.rollup(now=now, buckets=step_bins.BACKSTOP_BUCKETS)


@shared_task(name=MAINTAIN_TELEMETRY, acks_late=True)
def maintain_telemetry() -> None:
    """Hourly: create tomorrow's partitions, drop and delete what is past retention."""
    policy = retention.Policy(
        keep_days=settings.TELEMETRY_RETENTION_DAYS,
        receipts=timedelta(hours=settings.RECEIPT_RETENTION_HOURS),
        rollup_days=settings.ROLLUP_RETENTION_DAYS,
        event_days=settings.EVENT_RETENTION_DAYS,
    )
    retention.run(now=timezone.now(), keep_days=policy.keep_days, policy=policy)


@shared_task(name=ANALYZE_PARTITIONS, acks_late=True, expires=5)
def analyze_partitions() -> None:
    """Every 5 s: first statistics for a telemetry partition filling faster than autovacuum
    looks (one catalog read when there is nothing to do)."""
    partitions.analyze_young()
