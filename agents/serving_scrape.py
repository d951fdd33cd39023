"""The agent's scrape of serving engines on its node (`[[serving]]` in agent.toml).

Owns the `[[serving]]` settings, fetching an engine's `/metrics` and `/health` (and SGLang's
`/get_model_info` and `/get_server_info`) bounded in bytes and time, keeping each engine's
previous scrape, and handing one `serving` record per window to the agent. Never raises
into the agent. An engine whose metrics cannot be read gets no window: its silence is what
the service judges (docs/serving.md). Which series become which field is agents/engines.py.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agents import engines, prometheus
from agents.wire import Record, record

log = logging.getLogger("faultline.agent.serving")

DEFAULT_INTERVAL_S = 10.0
DEFAULT_TIMEOUT_S = 2.0
MAX_INFO_BYTES = 1024 * 1024
# The contract's window is at most an hour: a longer gap (the agent was stopped) starts over.
MAX_WINDOW_S = 3600.0
SLO_KEYS = ("ttft_ms_p99", "tpot_ms_p99", "e2e_ms_p99")  # the group SLO's own key names
_BAD_NAME = re.compile(r"[^A-Za-z0-9_.:@/\-]")

# status, body; raises OSError (unreachable, timeout) or ScrapeError (too large)
Fetch = Callable[[str, float, int], tuple[int, bytes]]


class ScrapeError(OSError):
    """An engine answered something the agent will not read (too large, too slow)."""


@dataclass(frozen=True)
class EngineConfig:
    """One `[[serving]]` entry: an engine on this node and the worker it reports as."""

    url: str  # base URL: /metrics and /health are below it
    engine: str  # a key of agents.engines.ENGINES
    group: str
    worker: str
    interval: float = DEFAULT_INTERVAL_S
    timeout: float = DEFAULT_TIMEOUT_S
    model_version: str | None = None  # overrides what the engine says
    kv_schema: str | None = None
    slo: engines.Slo = field(default_factory=engines.Slo)


_KEYS = {
    "url",
    "engine",
    "group",
    "worker",
    "interval",
    "timeout",
    "model_version",
    "kv_schema",
    "slo",
}


def wire_name(value: object) -> str | None:
    """A name the contract accepts (`[A-Za-z0-9_.:@/-]`, 128 characters): other characters
    become `_`, a longer one keeps its end (a model path's distinguishing part)."""
    if not isinstance(value, str) or not value.strip():
        return None
    return _BAD_NAME.sub("_", value.strip())[-128:]


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def parse_config(items: object, node: str) -> list[EngineConfig]:
    """`[[serving]]` entries as EngineConfigs; ValueError naming the entry, key and fix."""
    if items is None:
        return []
    if not isinstance(items, list):
        raise ValueError("serving must be a list of tables: [[serving]] url = ..., engine = ...")
    out: list[EngineConfig] = []
    for n, item in enumerate(items, 1):
        where = f"[[serving]] entry {n}"
        if not isinstance(item, dict):
            raise ValueError(f"{where} must be a table with url, engine and group")
        unknown = sorted(set(item) - _KEYS)
        if unknown:
            known = ", ".join(sorted(_KEYS))
            raise ValueError(f"{where}: unknown key {unknown[0]!r} (known: {known})")
        url = item.get("url")
        parts = urllib.parse.urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{where}: url {url!r} must be the engine's http(s):// base URL")
        base = str(url).rstrip("/").removesuffix("/metrics")
        engine = item.get("engine")
        if engine not in engines.ENGINES:
            names = ", ".join(engines.ENGINES)
            raise ValueError(f"{where}: engine {engine!r} must be one of {names}")
        group = item.get("group")
        if not isinstance(group, str) or wire_name(group) != group:
            raise ValueError(f"{where}: group {group!r} must be a name ([A-Za-z0-9_.:@/-])")
        worker = item.get("worker", f"{node}:{parts.port or parts.scheme}")
        if not isinstance(worker, str) or wire_name(worker) != worker:
            raise ValueError(f"{where}: worker {worker!r} must be a name ([A-Za-z0-9_.:@/-])")
        numbers = {}
        for key, default, top in (
            ("interval", DEFAULT_INTERVAL_S, MAX_WINDOW_S),
            ("timeout", DEFAULT_TIMEOUT_S, 60.0),
        ):
            value = item.get(key, default)
            if not _number(value) or not 0 < value <= top:
                raise ValueError(f"{where}: {key} {value!r} must be seconds in (0, {top:g}]")
            numbers[key] = float(value)
        slo = item.get("slo", {})
        if not isinstance(slo, dict) or set(slo) - set(SLO_KEYS):
            raise ValueError(f"{where}: slo {slo!r} takes {', '.join(SLO_KEYS)} (milliseconds)")
        limits = {}
        for key, value in slo.items():
            if not _number(value) or value <= 0:
                raise ValueError(f"{where}: slo {key} {value!r} must be milliseconds > 0")
            limits[key.removesuffix("_p99")] = float(value)
        for key in ("model_version", "kv_schema"):
            value = item.get(key)
            if value is not None and wire_name(value) != value:
                raise ValueError(f"{where}: {key} {value!r} must be a name ([A-Za-z0-9_.:@/-])")
        out.append(
            EngineConfig(
                url=base,
                engine=str(engine),
                group=str(group),
                worker=str(worker),
                interval=numbers["interval"],
                timeout=numbers["timeout"],
                model_version=item.get("model_version"),
                kv_schema=item.get("kv_schema"),
                slo=engines.Slo(**limits),
            )
        )
    workers = [(c.group, c.worker) for c in out]
    if len(set(workers)) != len(workers):
        raise ValueError("[[serving]]: two entries report as the same group and worker")
    return out


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """The configured engine answers itself; a redirect is not followed elsewhere."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def http_get(url: str, timeout: float, max_bytes: int) -> tuple[int, bytes]:
    """GET `url`: (status, body). At most `max_bytes` of body and about `timeout` seconds
    in all (each socket operation and the whole read); loopback ignores *_proxy."""
    handlers: list[urllib.request.BaseHandler] = [_NoRedirect()]
    if (urllib.parse.urlsplit(url).hostname or "") in ("127.0.0.1", "localhost", "::1"):
        handlers.append(urllib.request.ProxyHandler({}))
    opener = urllib.request.build_opener(*handlers)
    deadline = time.monotonic() + timeout
    # The scheme is checked by parse_config: only the configured engine's http(s) URL.
    request = urllib.request.Request(url, headers={"Accept": "text/plain"})  # noqa: S310
    try:
        with opener.open(request, timeout=timeout) as response:
            chunks, size = [], 0
            # read1: what has arrived, so a trickling answer meets the deadline check.
            while chunk := response.read1(65536):
                size += len(chunk)
                if size > max_bytes:
                    raise ScrapeError(f"{url}: answer over {max_bytes} bytes")
                if time.monotonic() > deadline:
                    raise ScrapeError(f"{url}: answer took over {timeout:g} s")
                chunks.append(chunk)
            return int(response.status), b"".join(chunks)
    except urllib.error.HTTPError as exc:
        return exc.code, b""


class EngineScraper:
    """One engine: each poll scrapes it; from the second poll on, a window per poll."""

    def __init__(self, cfg: EngineConfig, *, fetch: Fetch = http_get) -> None:
        self.cfg, self.fetch = cfg, fetch
        self.spec = engines.ENGINES[cfg.engine]
        self.wanted = engines.wanted(self.spec)
        self.prev: engines.Reading | None = None
        self.prev_at = 0.0
        self.server_kv: str | None = None  # SGLang's, from /get_server_info, per process
        self.problem: str | None = None  # the last failure, logged once per change
        self.warned_bounds: set[tuple[str, float]] = set()

    def _say(self, problem: str | None) -> None:
        if problem != self.problem:
            if problem:
                log.warning("serving %s (%s): %s", self.cfg.worker, self.cfg.url, problem)
            elif self.problem:
                log.info("serving %s (%s): readable again", self.cfg.worker, self.cfg.url)
            self.problem = problem

    def _warn_bounds(self, reading: engines.Reading) -> None:
        """Say once per threshold when it is not a bucket bound: slo_met is then counted at
        the largest bound under it (a lower bound; docs/serving.md)."""
        for term, key, bound, ms in engines.slo_bounds(self.spec, reading, self.cfg.slo):
            if (key, ms) in self.warned_bounds or bound == ms / 1000.0:
                continue
            self.warned_bounds.add((key, ms))
            at = "no bucket" if bound is None else f"{bound * 1000:g} ms"
            log.warning(
                "serving %s: the %s threshold %g ms is not a bucket bound of %s; requests are "
                "counted as meeting it only up to %s (slo_met is a lower bound)",
                self.cfg.worker,
                term,
                ms,
                key,
                at,
            )

    def _json(self, path: str) -> Mapping[str, Any]:
        try:
            status, body = self.fetch(self.cfg.url + path, self.cfg.timeout, MAX_INFO_BYTES)
            data = json.loads(body) if status == 200 else None
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _healthy(self) -> bool:
        try:
            status, _ = self.fetch(self.cfg.url + "/health", self.cfg.timeout, MAX_INFO_BYTES)
        except OSError:
            return False
        return status == 200

    def _identity(self, reading: engines.Reading, restarted: bool) -> tuple[str | None, str | None]:
        """(model_version, kv_schema): configured, else what the engine says."""
        model, kv = reading.model, reading.kv_schema
        if self.spec is engines.SGLANG:
            info = self._json("/get_model_info")
            model = model or info.get("model_path")
            weights = info.get("weight_version")
            if model and isinstance(weights, str) and weights not in ("", "default"):
                model = f"{model}@{weights}"
            if self.server_kv is None or restarted:
                server = self._json("/get_server_info")
                if server.get("page_size") is not None:
                    dtype = server.get("kv_cache_dtype") or "auto"
                    self.server_kv = f"{dtype}-p{server['page_size']}"
            kv = self.server_kv
        return (self.cfg.model_version or wire_name(model), self.cfg.kv_schema or wire_name(kv))

    def poll(self, now: float) -> Record | None:
        """Scrape once at monotonic `now`; the window since the previous scrape, if any."""
        try:
            status, body = self.fetch(
                self.cfg.url + "/metrics", self.cfg.timeout, prometheus.MAX_BYTES
            )
            if status != 200:
                raise ScrapeError(f"/metrics answered HTTP {status}")
            expo = prometheus.parse(body.decode("utf-8", "replace"), keep=self.wanted.__contains__)
        except OSError as exc:
            self._say(f"metrics unreadable: {exc}")
            return None
        reading = engines.read(self.spec, expo)
        if not reading.counters and not reading.histograms:
            self._say(f"no {self.spec.name} metrics at /metrics (is this a {self.spec.name}?)")
            return None
        self._say(None)
        prev, prev_at = self.prev, self.prev_at
        self.prev, self.prev_at = reading, now
        if prev is None:
            if self.spec is engines.SGLANG:
                self._identity(reading, restarted=True)  # learn the KV schema once
            return None
        seconds = now - prev_at
        if not 0 < seconds <= MAX_WINDOW_S:
            return None
        self._warn_bounds(reading)
        restarted = engines.restarted(prev, reading)
        if restarted:
            log.info("serving %s: the engine restarted (counters reset)", self.cfg.worker)
        window = engines.window(self.spec, prev, reading, seconds, self.cfg.slo)
        model_version, kv_schema = self._identity(reading, restarted)
        return record(
            "serving",
            group=self.cfg.group,
            worker=self.cfg.worker,
            window=window,
            model_version=model_version,
            kv_schema=kv_schema,
            ready=self._healthy() and reading.gauges.get("awake", 1.0) > 0,
            draining=False,
        )


class ServingScraper:
    """Scrapes every configured engine on its own interval, on one daemon thread."""

    def __init__(
        self,
        configs: list[EngineConfig],
        sink: Callable[[Record], None],
        *,
        fetch: Fetch = http_get,
    ) -> None:
        self.scrapers = [EngineScraper(c, fetch=fetch) for c in configs]
        self.sink = sink
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.scrapers:
            self._thread = threading.Thread(target=self._run, name="faultline-serving", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(s.cfg.timeout for s in self.scrapers) * 4 + 1)

    def _run(self) -> None:
        due = [time.monotonic()] * len(self.scrapers)
        while not self._stop.is_set():
            now = time.monotonic()
            for i, scraper in enumerate(self.scrapers):
                if now < due[i]:
                    continue
                # Keep the cadence: a slow scrape does not push every later window back.
                due[i] = max(due[i] + scraper.cfg.interval, now)
                try:
                    rec = scraper.poll(time.monotonic())
                    if rec is not None:
                        self.sink(rec)
                except Exception:  # evidence never stops the agent
                    log.exception("serving %s: scrape failed", scraper.cfg.worker)
            self._stop.wait(max(0.0, min(due) - time.monotonic()))
