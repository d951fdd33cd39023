"""Celery tasks: thin wrappers that take names/ids, never model instances.

Stable explicit names; idempotent (a redelivered task re-diagnoses and converges on the same
incidents because the database allows one open incident per fingerprint).
"""

from __future__ import annotations

import logging
from datetime import timedelta

from celery import shared_task
from django.core.cache import cache
from django.utils import timezone

from console import live, pipeline
from ingest import step_bins

log = logging.getLogger(__name__)


@shared_task(name="console.diagnose_group", acks_late=True, max_retries=3, default_retry_delay=1)
def diagnose_group(group: str) -> None:
    try:
        cache.delete(live.pending_key(group))
    except Exception:  # a stale debounce key only delays the next run
        log.warning("diagnose_group: could not clear debounce key", exc_info=True)
    pipeline.diagnose(group_name=group, now=timezone.now())


@shared_task(name="console.sweep", acks_late=True, expires=5)
def sweep() -> None:
    """Silence emits no records: find what went quiet and diagnose it."""
    now = timezone.now()
    for name in pipeline.mark_silent_nodes(now=now):
        log.info("sweep: node %s stopped reporting", name)
    # Queue, don't run inline: workers diagnose groups in parallel, and the debounce key
    # keeps at most one pending diagnosis per group however often the sweep fires.
    for name in pipeline.groups_to_sweep(now=now, window=timedelta(minutes=30)):
        live.schedule_diagnosis(name)


@shared_task(name="console.maintain_telemetry", acks_late=True)
def maintain_telemetry() -> None:
    pipeline.maintain_telemetry(now=timezone.now())


@shared_task(name="console.rollup_telemetry", acks_late=True, expires=55)
def rollup_telemetry() -> None:
    """1-minute rollups of the last closed minutes (idempotent: safe to run twice)."""
    from ingest.rollups import rollup

    now = timezone.now()
    rollup(now=now)
    # Backstop for the 5 s step bins: refold the last 2 minutes once a minute, so a row
    # that arrived later than a 5 s pass looks back (an agent's spool) reaches the charts.
    step_bins.rollup(now=now, buckets=step_bins.BACKSTOP_BUCKETS)


@shared_task(name="console.rollup_step_bins", acks_late=True, expires=5)
def rollup_step_bins() -> None:
    """5 s step bins for the group charts (idempotent; skips while another pass runs)."""
    step_bins.rollup(now=timezone.now())
