"""GET /metrics: the Prometheus text format, for a scraper that holds the token or the network.

Owns who may scrape (FAULTLINE_METRICS_TOKEN as a Bearer token, or a client address inside
FAULTLINE_METRICS_ALLOW_CIDRS; anyone else is refused) and assembling one scrape: the
samples every process wrote (multiprocess mode under `faultline up`, else this process's),
the dependencies' health and the Celery queue depth asked now, and the fleet read from the
database (console.metrics). The client address is faultline.client's: REMOTE_ADDR, never
a client's X-Forwarded-For, unless FAULTLINE_TRUSTED_PROXIES names the proxy.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from django.conf import settings
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from console.scheduling import HOUSEKEEPING_QUEUE, NOTIFY_QUEUE, URGENT_QUEUE
from faultline.client import client_address
from faultline.metrics_dir import ENV

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Celery's Redis transport keeps one list per priority step of a queue. Housekeeping's
# depth is one to alert on: its sweeps (pages, silent nodes) wait only when its worker is
# down or behind (docs/operations.md).
CELERY_QUEUES = {
    queue: [queue, *(f"{queue}\x06\x16{p}" for p in (3, 6, 9))]
    for queue in ("celery", HOUSEKEEPING_QUEUE, URGENT_QUEUE, NOTIFY_QUEUE)
}


def allowed(request: HttpRequest) -> tuple[bool, int, str]:
    """(may scrape, refusal status, refusal message)."""
    token = settings.METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    if token and header.startswith("Bearer "):
        if hmac.compare_digest(header.removeprefix("Bearer ").strip().encode(), token.encode()):
            return True, 200, ""
        return False, 401, "metrics: wrong scrape token"
    try:
        address = ipaddress.ip_address(client_address(request))
    except ValueError:
        address = None
    if address is not None and any(address in net for net in settings.METRICS_ALLOW_CIDRS):
        return True, 200, ""
    if not token and not settings.METRICS_ALLOW_CIDRS:
        return (
            False,
            403,
            (
                "metrics: scraping is off; set FAULTLINE_METRICS_TOKEN (sent as "
                "'Authorization: Bearer <token>') or FAULTLINE_METRICS_ALLOW_CIDRS "
                "(see docs/operations.md)"
            ),
        )
    if token:
        return False, 401, "metrics: send 'Authorization: Bearer <FAULTLINE_METRICS_TOKEN>'"
    return False, 403, f"metrics: {address} is not in FAULTLINE_METRICS_ALLOW_CIDRS"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def forget_dead_processes(folder: Path) -> None:
    """Drop live-gauge files of processes that exited (a restarted uvicorn's websocket
    count would otherwise be summed forever); counters and histograms of dead processes
    stay, so totals never go backwards."""
    for path in folder.glob("gauge_live*_*.db"):
        pid = path.stem.rsplit("_", 1)[-1]
        if pid.isdigit() and not _pid_alive(int(pid)):
            mark_process_dead(int(pid), str(folder))


class _ThisProcess:
    """This process's own samples (no multiprocess folder: `runserver`, tests)."""

    def collect(self) -> Iterable[Metric]:
        return REGISTRY.collect()


class DependencyCollector:
    """Postgres and Valkey reachable now, and how many Celery messages wait."""

    def collect(self) -> Iterator[Metric]:
        from faultline.health import _database_reachable

        up = GaugeMetricFamily(
            "faultline_dependency_up",
            "1 when the dependency answers now (embedded or external).",
            labels=["dependency"],
        )
        database = _database_reachable()
        up.add_metric(["postgres"], int(database))
        depth = GaugeMetricFamily(
            "faultline_celery_queue_depth",
            "Celery messages waiting in the broker, by queue.",
            labels=["queue"],
        )
        try:
            client = cache._cache.get_client(write=False)
            client.ping()
            for queue, keys in CELERY_QUEUES.items():
                depth.add_metric([queue], sum(client.llen(key) for key in keys))
            up.add_metric(["valkey"], 1)
        except Exception:  # noqa: BLE001 - any broker failure is "down", never a 500
            up.add_metric(["valkey"], 0)
        yield up
        if depth.samples:
            yield depth
        self.database_up = database


class _Fleet:
    def __init__(self, dependencies: DependencyCollector) -> None:
        self.dependencies = dependencies

    def collect(self) -> Iterator[Metric]:
        from console.metrics import families, read_fleet

        if not getattr(self.dependencies, "database_up", False):
            return  # the pool would wait 10 s for a database that is down
        try:
            yield from families(read_fleet())
        except Exception:
            log.warning("metrics: fleet read failed", exc_info=True)


def registry() -> CollectorRegistry:
    """What one scrape renders (collectors run in registration order)."""
    out = CollectorRegistry(auto_describe=False)
    folder = os.environ.get(ENV)
    if folder:
        forget_dead_processes(Path(folder))
        MultiProcessCollector(out, path=folder)
    else:
        out.register(_ThisProcess())
    dependencies = DependencyCollector()
    out.register(dependencies)
    out.register(_Fleet(dependencies))
    return out


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    ok, status, message = allowed(request)
    if not ok:
        response = HttpResponse(message + "\n", status=status, content_type="text/plain")
        if status == 401:
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(generate_latest(registry()), content_type=CONTENT_TYPE)
