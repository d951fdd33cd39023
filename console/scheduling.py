"""Enqueue Celery tasks by their stable names, so no module imports a tasks module.

Owns the names of the tasks the console enqueues, the one call that sends them
(`current_app.send_task`; console.apps binds Faultline's Celery app, broker REDIS_URL)
and the per-group debounce of diagnosis, which keeps established groups ahead of young
ones (created in the last DIAGNOSIS_YOUNG_GROUP_S: a longer debounce and a fleet-wide
budget a second, so a flood of invented groups queues behind real jobs, never in front
of them; docs/security.md). Only Celery's autodiscovery imports
`console.tasks`, `console.notify_tasks` and `ingest.tasks`. It must not decide *what*
to run: callers do, on commit. Scheduling a diagnosis never raises (the sweep catches up).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Final

from celery import current_app
from django.conf import settings
from django.core.cache import cache

log = logging.getLogger(__name__)

DIAGNOSE_GROUP: Final = "console.diagnose_group"
SEND_NOTIFICATION: Final = "console.send_notification"

PENDING_TIMEOUT_S = 5

# Per process: when this process last queued each group's diagnosis. A batch within the
# debounce countdown of that is covered by the queued run (which starts no earlier than the
# countdown, and reads the database then), so it skips even the Redis round trip.
_queued_at: dict[str, float] = {}


def enqueue(name: str, *args: Any, countdown: float | None = None) -> None:
    """Send task `name` with JSON `args`; raises only what the broker raised."""
    current_app.send_task(name, args=list(args), countdown=countdown)


def send_notification(incident_id: int, key: str, channel: str, event: str) -> None:
    enqueue(SEND_NOTIFICATION, incident_id, key, channel, event)


def pending_key(group: str) -> str:
    return f"diag-pending:{group}"


def young_key(group: str) -> str:
    return f"diag-young:{group}"


def mark_young(groups: list[str]) -> None:
    """Ingest created these groups: they wait behind established ones for a while."""
    if not groups or settings.DIAGNOSIS_YOUNG_GROUP_S <= 0:
        return
    try:
        cache.set_many(dict.fromkeys(map(young_key, groups), 1), settings.DIAGNOSIS_YOUNG_GROUP_S)
    except Exception:  # Redis down: they are diagnosed like any group
        log.warning("scheduling: could not mark %d new groups", len(groups), exc_info=True)


def _young_budget_spent() -> bool:
    """Count one young group's diagnosis in this second's fleet-wide budget."""
    key = f"diag-young-budget:{int(time.time())}"
    cache.add(key, 0, timeout=5)
    return int(cache.incr(key)) > settings.DIAGNOSIS_YOUNG_PER_S


def schedule_diagnosis(group: str) -> None:
    """Debounce: at most one pending diagnosis per group per debounce window; a young
    group's waits longer and spends the fleet-wide young budget (over it: left to the
    sweep, which comes back through here)."""
    delay_ms = settings.DIAGNOSIS_DEBOUNCE_MS
    now = time.monotonic()
    if now - _queued_at.get(group, -1e9) < delay_ms / 1000:
        return
    try:
        # The task deletes this key when it starts, so a batch arriving during a run
        # schedules the next one; the timeout only guards against a lost task (a worker
        # killed holding it). Keep it short: the sweep also goes through this key, so a
        # lost task silences the group's diagnosis until the key expires (30 s measured
        # with 30; docs/reliability.md). A too-early expiry only costs one extra run.
        young = cache.get(young_key(group)) is not None
        if young:
            delay_ms = max(delay_ms, settings.DIAGNOSIS_YOUNG_DEBOUNCE_MS)
        if not cache.add(pending_key(group), 1, timeout=PENDING_TIMEOUT_S + delay_ms // 1000):
            return
        if young and _young_budget_spent():
            _queued_at[group] = now
            return  # the pending key holds it off until it expires; then the sweep
        enqueue(DIAGNOSE_GROUP, group, countdown=delay_ms / 1000)
        _queued_at[group] = now
    except Exception:  # broker down: the sweep catches up
        log.warning("scheduling: could not schedule diagnosis of %s", group, exc_info=True)


def forget_recent() -> None:
    """Drop this process's memory of queued diagnoses (tests)."""
    _queued_at.clear()
