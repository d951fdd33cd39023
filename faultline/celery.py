"""Celery app: the worker runs diagnosis and notifications, beat runs the sweeps.

Tasks are found by autodiscovery (console.tasks, console.notify_tasks, ingest.tasks) and
scheduled here by their stable names; nothing else imports a tasks module.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

from console.scheduling import (
    HOUSEKEEPING_QUEUE,
    LATCH_ALERT_FAULTS,
    NOTIFY_QUEUE,
    SEND_NOTIFICATION,
    URGENT_QUEUE,
)
from faultline import metrics

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "faultline.settings")

app = Celery("faultline")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["console"])
app.autodiscover_tasks(["console"], related_name="notify_tasks")
app.autodiscover_tasks(["ingest"])
metrics.connect_celery()  # task runs, diagnosis passes, notification outcomes
# Module-level so a bench can read the periods without loading Django's settings.
# The sweeps go to the housekeeping worker (console.scheduling.HOUSEKEEPING_QUEUE): on the
# default queue they waited behind diagnosis passes past their expiry. So does a new
# partition's first ANALYZE: it keeps the passes fast in a new day's first minute. What
# may run long (recovery costs: up to 2 s; the minute rollup; hourly maintenance) stays
# there, late but never dropped, so it never holds a sweep.
_SWEEP = {"queue": HOUSEKEEPING_QUEUE}
BEAT_SCHEDULE: dict[str, dict[str, Any]] = {
    "sweep": {"task": "console.sweep", "schedule": 1.0, "options": _SWEEP},
    "sweep-nodes": {"task": "console.sweep_nodes", "schedule": 1.0, "options": _SWEEP},
    "escalation-sweep": {"task": "console.escalation_sweep", "schedule": 10.0, "options": _SWEEP},
    "step-bins": {"task": "console.rollup_step_bins", "schedule": 5.0, "options": _SWEEP},
    "analyze-partitions": {
        "task": "ingest.analyze_partitions",
        "schedule": 5.0,
        "options": _SWEEP,
    },
    # Xid alerts a large Alertmanager delivery left to latch, if their own messages were
    # lost (broker away at commit): on the urgent lane, with the rest of the GPU faults.
    "alert-latches": {
        "task": LATCH_ALERT_FAULTS,
        "schedule": 5.0,
        "options": {"queue": URGENT_QUEUE, "expires": 5},
    },
    "recovery-costs": {"task": "console.measure_recovery_costs", "schedule": 10.0},
    "rollup": {"task": "console.rollup_telemetry", "schedule": 60.0},
    "maintain-telemetry": {"task": "console.maintain_telemetry", "schedule": 3600.0},
}
app.conf.beat_schedule = BEAT_SCHEDULE
# A retried send (a 503, a timeout) is published again by Celery itself: routed here, it
# stays on the notify queue (console.scheduling.NOTIFY_QUEUE) like the first try.
app.conf.task_routes = {SEND_NOTIFICATION: {"queue": NOTIFY_QUEUE}}
