"""Telemetry retention: delete rows older than the configured number of days."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction

from ingest import models as m

TELEMETRY = [m.DeviceSample, m.StepRecord, m.CollectiveWindow, m.ServingWindow]


def run(*, now: datetime, keep_days: int) -> dict[str, int]:
    cutoff = now - timedelta(days=keep_days)
    removed: dict[str, int] = {}
    for model in TELEMETRY:
        with transaction.atomic():
            removed[model._meta.db_table], _ = model.objects.filter(ts__lt=cutoff).delete()
    return removed
