"""A stand-in vLLM engine for the demo and the tests: `/metrics` and `/health` over HTTP.

Owns exposing what a vLLM V1 API server exposes — its metric names, labels and histogram
buckets (vllm/v1/metrics/loggers.py), written by prometheus_client as vLLM's are — for
requests the caller says it served, so a real agent's `[[serving]]` scrape reads it like
the real engine. Also plays a restart (every counter back to zero) and an engine that
answers /health before its KV cache is allocated. Must not decide what to serve or when.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
TPOT_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
REQUEST_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
FINISH_REASONS = ("stop", "length", "abort")


class _Metrics:
    """One engine process's metrics: a restart builds a new set (counters start at 0)."""

    def __init__(self, model: str) -> None:
        r = self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        self.values = [model, "0"]

        def hist(name: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, name, labels, buckets=buckets, registry=r)

        self.running = Gauge("vllm:num_requests_running", "running", labels, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "waiting", labels, registry=r)
        self.kv = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage", labels, registry=r)
        self.queries = Counter("vllm:prefix_cache_queries", "queries", labels, registry=r)
        self.hits = Counter("vllm:prefix_cache_hits", "hits", labels, registry=r)
        self.preemptions = Counter("vllm:num_preemptions", "preemptions", labels, registry=r)
        self.success = Counter(
            "vllm:request_success", "finished", [*labels, "finished_reason"], registry=r
        )
        for reason in FINISH_REASONS:
            self.success.labels(model, "0", reason)
        self.ttft = hist("vllm:time_to_first_token_seconds", TTFT_BUCKETS)
        self.itl = hist("vllm:inter_token_latency_seconds", TPOT_BUCKETS)
        self.tpot = hist("vllm:request_time_per_output_token_seconds", TPOT_BUCKETS)
        self.e2e = hist("vllm:e2e_request_latency_seconds", REQUEST_BUCKETS)
        self.queue = hist("vllm:request_queue_time_seconds", REQUEST_BUCKETS)
        self.prefill = hist("vllm:request_prefill_time_seconds", REQUEST_BUCKETS)
        self.decode = hist("vllm:request_decode_time_seconds", REQUEST_BUCKETS)
        self.cache_info = Gauge(
            "vllm:cache_config_info",
            "Information of the CacheConfig",
            ["block_size", "cache_dtype", "engine"],
            registry=r,
        )


class FakeVllm:
    """A vLLM-shaped engine on 127.0.0.1:`port` (0: any free port)."""

    def __init__(self, model: str = "demo-llm", *, port: int = 0) -> None:
        self.model = model
        self.lock = threading.Lock()
        self.metrics = _Metrics(model)
        self.healthy = True
        self.allocate_kv_cache()
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/metrics":
                    with engine.lock:
                        body = generate_latest(engine.metrics.registry)
                    self._answer(200, body, "text/plain; version=0.0.4; charset=utf-8")
                elif self.path == "/health":
                    self._answer(200 if engine.healthy else 503, b"", "text/plain")
                else:
                    self._answer(404, b"not found", "text/plain")

            def _answer(self, status: int, body: bytes, kind: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass  # the scrape every few seconds is not news

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(
            target=self.server.serve_forever, daemon=True, name=f"fake-vllm-{self.port}"
        )

    def start(self) -> FakeVllm:
        self._thread.start()
        return self

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def allocate_kv_cache(self) -> None:
        """What vLLM does once its KV cache exists: publish cache_config_info."""
        with self.lock:
            self.metrics.cache_info.labels("16", "auto", "0").set(1)

    def restart(self, *, kv_cache: bool = True) -> None:
        """A new engine process: every counter and histogram from zero; without `kv_cache`,
        answering /health before its KV cache is allocated (no cache_config_info yet)."""
        with self.lock:
            self.metrics = _Metrics(self.model)
        if kv_cache:
            self.allocate_kv_cache()

    def serve(
        self,
        *,
        ttft: float,
        tpot: float,
        tokens: int = 64,
        queue: float = 0.01,
        reason: str = "stop",
        cached: int = 0,
        prompt: int = 128,
    ) -> None:
        """One finished request, observed as vLLM observes it."""
        m, labels = self.metrics, self.metrics.values
        decode = tpot * max(tokens - 1, 0)
        with self.lock:
            m.success.labels(*labels, reason).inc()
            m.ttft.labels(*labels).observe(ttft)
            for _ in range(max(tokens - 1, 0)):
                m.itl.labels(*labels).observe(tpot)
            m.tpot.labels(*labels).observe(tpot)
            m.e2e.labels(*labels).observe(ttft + decode)
            m.queue.labels(*labels).observe(queue)
            m.prefill.labels(*labels).observe(max(ttft - queue, 0.0))
            m.decode.labels(*labels).observe(decode)
            m.queries.labels(*labels).inc(prompt)
            m.hits.labels(*labels).inc(cached)

    def load(self, *, running: int, waiting: int, kv_used: float, preempted: int = 0) -> None:
        """The scheduler's gauges now (kv_used: 0..1), and preemptions since the last call."""
        m, labels = self.metrics, self.metrics.values
        with self.lock:
            m.running.labels(*labels).set(running)
            m.waiting.labels(*labels).set(waiting)
            m.kv.labels(*labels).set(kv_used)
            m.preemptions.labels(*labels).inc(preempted)
