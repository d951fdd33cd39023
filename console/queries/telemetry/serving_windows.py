"""Serving windows: each worker's newest, per-minute SLO series and per-version totals for
console.serving, and which nodes serving workers report from. Must not write.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import Model

from console.models import ConsistencyGroup
from ingest import models as m

# The record kinds whose tables this module reads (each kind has a reader: tests/server/ingest/
# test_record_kinds.py).
READS: dict[str, type[Model]] = {"serving": m.ServingWindow}

# JSON fields of the windows are cast in SQL, so a page costs a few indexed queries however
# many windows a fleet reports.

_SERVING_SERIES = """
SELECT date_trunc('minute', ts) AS minute,
       sum(coalesce(("window"->>'slo_met')::bigint, 0)) AS met,
       sum(coalesce(("window"->>'requests')::bigint, 0)) AS requests,
       sum(coalesce(("window"->>'seconds')::float, 0))
         / greatest(count(DISTINCT worker), 1) AS secs,
       max(("window"->>'ttft_ms_p99')::float) AS ttft_p99,
       max(("window"->>'tpot_ms_p99')::float) AS tpot_p99
FROM ingest_servingwindow
WHERE group_id = %s AND ts >= %s
GROUP BY 1 ORDER BY 1
"""
_SERVING_VERSIONS = """
SELECT coalesce(model_version, '?') AS version,
       sum(coalesce(("window"->>'requests')::bigint, 0)) AS requests,
       sum(coalesce(("window"->>'slo_met')::bigint, 0)) AS met,
       count(DISTINCT worker) AS workers,
       min(ts) AS first_seen, max(ts) AS last_seen
FROM ingest_servingwindow
WHERE group_id = %s AND ts >= %s
GROUP BY 1 ORDER BY min(ts)
"""


def serving_workers(group: ConsistencyGroup) -> list[dict[str, Any]]:
    """Each serving worker's newest window (DISTINCT ON: one row per worker)."""
    return list(
        m.ServingWindow.objects.filter(group=group, stale=False)
        .order_by("worker", "-ts")
        .distinct("worker")
        .values(
            "worker",
            "ts",
            "model_version",
            "adapter_version",
            "kv_schema",
            "ready",
            "draining",
            "window",
        )[:1000]
    )


def serving_minutes(group: ConsistencyGroup, since: datetime) -> list[tuple[Any, ...]]:
    """Per minute since `since`: (minute, slo_met, requests, seconds per worker, worst
    ttft p99, worst tpot p99)."""
    with connection.cursor() as cur:
        cur.execute(_SERVING_SERIES, [group.pk, since])
        return list(cur.fetchall())


def serving_versions(group: ConsistencyGroup, since: datetime) -> list[tuple[Any, ...]]:
    """Per model version since `since`, oldest first: (version, requests, slo_met, workers,
    first seen, last seen)."""
    with connection.cursor() as cur:
        cur.execute(_SERVING_VERSIONS, [group.pk, since])
        return list(cur.fetchall())


def serving_nodes(group_ids: list[int], *, since: datetime) -> set[int]:
    """The nodes a worker of these serving groups reported from since `since`."""
    if not group_ids:
        return set()
    return set(
        m.ServingWindow.objects.filter(group_id__in=group_ids, ts__gte=since)
        .values_list("node_id", flat=True)
        .distinct()
    )
