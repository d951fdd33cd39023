"""The service's own Prometheus metrics: what each process counts as it works.

Owns the metric objects (ingest, HTTP, Celery tasks, diagnosis, notifications, websockets)
and the small hooks that feed them: a request middleware, a wrapper for the ingest view and
Celery signal handlers. Labels are bounded by construction (route patterns, task names,
fixed outcome words); a rank, request id, GPU UUID or group name never becomes a label here.
Fleet state is not counted here: faultline.scrape reads it from the database per scrape.
Under `faultline up` every process writes to PROMETHEUS_MULTIPROC_DIR (faultline.metrics_dir).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse
from prometheus_client import Counter, Gauge, Histogram

# Seconds; from a cached page (~5 ms) to a slow diagnosis pass.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

INGEST_BATCHES = Counter(
    "faultline_ingest_batches",
    "Ingest batches answered, by outcome (accepted, duplicate, rejected).",
    ["outcome"],
)
INGEST_RECORDS = Counter(
    "faultline_ingest_records", "Records stored from accepted (non-duplicate) ingest batches."
)
INGEST_REJECTIONS = Counter(
    "faultline_ingest_rejections", "Ingest batches refused, by reason.", ["reason"]
)
HTTP_DURATION = Histogram(
    "faultline_http_request_duration_seconds",
    "HTTP request latency by route pattern and method.",
    ["route", "method"],
    buckets=BUCKETS,
)
HTTP_RESPONSES = Counter(
    "faultline_http_responses",
    "HTTP responses by route pattern, method and status class.",
    ["route", "method", "status"],
)
TASK_DURATION = Histogram(
    "faultline_celery_task_duration_seconds",
    "Celery task run time by task name.",
    ["task"],
    buckets=BUCKETS,
)
TASKS = Counter(
    "faultline_celery_tasks",
    "Celery task runs by task name and final state; EXPIRED: dropped unrun, past its expiry.",
    ["task", "state"],
)
DIAGNOSIS_DURATION = Histogram(
    "faultline_diagnosis_duration_seconds",
    "One diagnosis pass over one group: snapshot, engine, write.",
    buckets=BUCKETS,
)
DIAGNOSIS_CHECKS = Counter(
    "faultline_diagnosis_checks",
    "Passes queued for the moment a silent rank crosses its hang threshold, by outcome "
    "(ran; moved: a later pass found the deadline moved, nothing run).",
    ["outcome"],
)
NOTIFICATIONS = Counter(
    "faultline_notifications",
    "Notification deliveries by outcome (sent, refused, retrying, failed).",
    ["outcome"],
)
DB_WRITES_REFUSED = Counter(
    "faultline_db_writes_refused",
    "Writes Postgres refused for want of a resource (disk_full, out_of_memory, "
    "insufficient_resources), each answered 503 with Retry-After.",
    ["reason"],
)
WEBSOCKET_CLIENTS = Gauge(
    "faultline_websocket_clients",
    "Websocket clients connected to the live console.",
    multiprocess_mode="livesum",
)

# Status -> reason for ingest refusals (ingest.views answers each refusal with one status).
REJECTION_REASONS = {
    400: "invalid",
    401: "unauthenticated",
    403: "wrong_node",
    405: "method",
    413: "too_large",
    429: "rate_limited",
    503: "unavailable",
}
NOTIFICATION_OUTCOMES = {"sent", "refused"}
_TASK_STATES = {"SUCCESS", "FAILURE", "RETRY", "REJECTED", "IGNORED"}


def count_ingest(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Wrap the ingest view: one batch outcome per answer, refusals by reason."""

    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        response = view(request, *args, **kwargs)
        status = response.status_code
        if status == 202:
            duplicate = json.loads(response.content).get("duplicate") is True
            INGEST_BATCHES.labels("duplicate" if duplicate else "accepted").inc()
        else:
            INGEST_BATCHES.labels("rejected").inc()
            INGEST_REJECTIONS.labels(REJECTION_REASONS.get(status, "other")).inc()
        return response

    wrapped.__name__ = view.__name__
    wrapped.__doc__ = view.__doc__
    wrapped.csrf_exempt = getattr(view, "csrf_exempt", False)  # type: ignore[attr-defined]  # Django's marker attribute
    return wrapped


class RequestMetricsMiddleware:
    """Times every request; the route label is Django's pattern (bounded), never the path."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        started = time.perf_counter()
        response = self.get_response(request)
        match = getattr(request, "resolver_match", None)
        route = "/" + match.route if match is not None and match.route else "unmatched"
        method = request.method if request.method in _METHODS else "other"
        HTTP_DURATION.labels(route, method).observe(time.perf_counter() - started)
        HTTP_RESPONSES.labels(route, method, f"{response.status_code // 100}xx").inc()
        return response


_METHODS = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}


# -- Celery ---------------------------------------------------------------------------------

_started: dict[str, float] = {}


def _task_name(task: Any) -> str:
    name = getattr(task, "name", "") or ""
    return name if name.startswith(("console.", "ingest.")) else "other"


def _on_prerun(task_id: str | None = None, **_: Any) -> None:
    if task_id:
        _started[task_id] = time.perf_counter()


def _on_postrun(
    task_id: str | None = None,
    task: Any = None,
    retval: Any = None,
    state: str | None = None,
    **_: Any,
) -> None:
    began = _started.pop(task_id, None) if task_id else None
    name = _task_name(task)
    state = state if state in _TASK_STATES else "OTHER"
    TASKS.labels(name, state).inc()
    if began is not None:
        seconds = time.perf_counter() - began
        TASK_DURATION.labels(name).observe(seconds)
        if name == "console.diagnose_group" and state == "SUCCESS":
            DIAGNOSIS_DURATION.observe(seconds)
        elif name == "console.diagnose_groups" and state == "SUCCESS":
            for pass_s in retval if isinstance(retval, list) else ():
                DIAGNOSIS_DURATION.observe(pass_s)  # the sweep's chunk: each pass
        elif name == "console.check_group" and state == "SUCCESS":
            if retval is True:  # a pass ran; a check the deadline moved past is not one
                DIAGNOSIS_DURATION.observe(seconds)
            DIAGNOSIS_CHECKS.labels("ran" if retval is True else "moved").inc()
    if name == "console.send_notification":
        if state == "SUCCESS":
            outcome = retval if retval in NOTIFICATION_OUTCOMES else "other"
        else:
            outcome = "retrying" if state == "RETRY" else "failed"
        NOTIFICATIONS.labels(outcome).inc()


def _on_revoked(sender: Any = None, expired: bool = False, **_: Any) -> None:
    """A task dropped unrun: EXPIRED when it waited past its expiry (beat's sweeps behind
    a busy worker, docs/operations.md), else REVOKED."""
    TASKS.labels(_task_name(sender), "EXPIRED" if expired else "REVOKED").inc()


def connect_celery() -> None:
    """Count every task run (and every one dropped unrun) of this process: the Celery
    worker and its pool children."""
    from celery import signals

    signals.task_prerun.connect(_on_prerun, weak=False, dispatch_uid="faultline-metrics-pre")
    signals.task_postrun.connect(_on_postrun, weak=False, dispatch_uid="faultline-metrics-post")
    signals.task_revoked.connect(_on_revoked, weak=False, dispatch_uid="faultline-metrics-rev")
