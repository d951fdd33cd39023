"""Serving engines' Prometheus metrics as Faultline serving windows (vLLM, SGLang).

Owns which series of each engine feed which window field — every name an engine version
used, newest first (vLLM's V0 and V1 names, SGLang's older and newer ones) — and turning
two scrapes into one window: counter and histogram increases (an engine restart resets its
counters: what it counted since is the increase, as Prometheus's increase() does),
percentiles interpolated inside buckets as histogram_quantile does, and SLO met as a lower
bound at the group's thresholds. Pure: no I/O and no clock (agents/serving_scrape.py
fetches and schedules). A field whose series an engine does not export stays absent, never 0.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agents.prometheus import Exposition, Histogram, at_most, histogram, increase, quantile

Where = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Series:
    """One counter or gauge, summed over its label sets that include `where`."""

    name: str
    where: Where = ()


@dataclass(frozen=True)
class EngineSpec:
    """An engine's series per window quantity, each a tuple of candidates (newest name
    first): the first one the scrape has is read."""

    name: str
    prefix: str
    counters: Mapping[str, tuple[Series, ...]]
    gauges: Mapping[str, tuple[Series, ...]]
    histograms: Mapping[str, tuple[str, ...]]
    # Gauges read as the largest series (a usage: the fullest engine of a DP group matters)
    # rather than the sum (requests waiting or running add up).
    peak_gauges: frozenset[str] = frozenset({"kv_used", "prefix_hit_rate", "awake"})


# Sources read from the vLLM tree (vllm/v1/metrics/loggers.py, vllm/engine/metrics.py for
# V0; docs/design/metrics.md lists the renames): the KV gauge was gpu_cache_usage_perc
# until 0.9 (then kv_cache_usage_perc), prefix caching a V0 hit-rate gauge, then
# gpu_prefix_cache_{queries,hits}, then prefix_cache_{queries,hits}; TPOT was the per-token
# time_per_output_token_seconds, now inter_token_latency_seconds, and newer releases add
# the per-request request_time_per_output_token_seconds that an SLO is counted against.
VLLM = EngineSpec(
    name="vllm",
    prefix="vllm:",
    counters={
        "requests": (Series("vllm:request_success_total"),),
        "cancelled": (Series("vllm:request_success_total", (("finished_reason", "abort"),)),),
        "failed": (Series("vllm:request_success_total", (("finished_reason", "error"),)),),
        "preempted": (Series("vllm:num_preemptions_total"),),
        "prefix_queries": (
            Series("vllm:prefix_cache_queries_total"),
            Series("vllm:gpu_prefix_cache_queries_total"),
        ),
        "prefix_hits": (
            Series("vllm:prefix_cache_hits_total"),
            Series("vllm:gpu_prefix_cache_hits_total"),
        ),
    },
    gauges={
        "queued": (Series("vllm:num_requests_waiting"),),
        "active": (Series("vllm:num_requests_running"),),
        "kv_used": (Series("vllm:kv_cache_usage_perc"), Series("vllm:gpu_cache_usage_perc")),
        "prefix_hit_rate": (Series("vllm:gpu_prefix_cache_hit_rate"),),
        # Sleep mode (weights offloaded): the engine answers /health but serves nothing.
        "awake": (Series("vllm:engine_sleep_state", (("sleep_state", "awake"),)),),
    },
    histograms={
        "ttft": ("vllm:time_to_first_token_seconds",),
        "tpot_request": ("vllm:request_time_per_output_token_seconds",),
        "tpot_token": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
        "e2e": ("vllm:e2e_request_latency_seconds",),
        "queue": ("vllm:request_queue_time_seconds",),
        "prefill": ("vllm:request_prefill_time_seconds",),
        "decode": ("vllm:request_decode_time_seconds",),
    },
)

# Sources read from the SGLang tree (python/sglang/srt/metrics/collector.py,
# docs/references/production_metrics.md): TPOT was time_per_output_token_seconds, now
# inter_token_latency_seconds, both per token; retractions (SGLang's preemption) a gauge,
# now also the counter num_retracted_requests_total; CUDA-graph use the counter
# cuda_graph_passes_total{mode="decode_cuda_graph"|"decode_none"}.
SGLANG = EngineSpec(
    name="sglang",
    prefix="sglang:",
    counters={
        "requests": (Series("sglang:num_requests_total"),),
        "cancelled": (Series("sglang:num_aborted_requests_total"),),
        "preempted": (Series("sglang:num_retracted_requests_total"),),
        "prefix_queries": (Series("sglang:prompt_tokens_total"),),
        "prefix_hits": (Series("sglang:cached_tokens_total"),),
        "graph_passes": (Series("sglang:cuda_graph_passes_total"),),
        "graph_misses": (Series("sglang:cuda_graph_passes_total", (("mode", "decode_none"),)),),
    },
    gauges={
        "queued": (Series("sglang:num_queue_reqs"),),
        "active": (Series("sglang:num_running_reqs"),),
        "kv_used": (Series("sglang:token_usage"),),
        "prefix_hit_rate": (Series("sglang:cache_hit_rate"),),
    },
    histograms={
        "ttft": ("sglang:time_to_first_token_seconds",),
        "tpot_token": (
            "sglang:inter_token_latency_seconds",
            "sglang:time_per_output_token_seconds",
        ),
        "e2e": ("sglang:e2e_request_latency_seconds",),
        "queue": ("sglang:queue_time_seconds",),
    },
)

ENGINES: dict[str, EngineSpec] = {spec.name: spec for spec in (VLLM, SGLANG)}

# Window counts no engine metric measures (retries and duplicates are the router's, OOMs
# and timeouts the process's); evictions: vLLM samples block lifetimes only, SGLang counts
# tokens moved to host memory, neither a count of evicted requests. Sent as `unmeasured`.
COUNTS = ("queued", "active", "preempted", "cancelled")
NEVER_MEASURED = ("evictions", "oom", "timeouts", "retries", "duplicate_tokens")


@dataclass(frozen=True)
class Slo:
    """The thresholds one request must meet (ms): the group's SLO ceilings."""

    ttft_ms: float = 2000.0
    tpot_ms: float = 150.0
    e2e_ms: float = 60000.0


@dataclass(frozen=True)
class Reading:
    """What the mapping reads of one scrape."""

    counters: dict[str, float] = field(default_factory=dict)
    gauges: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, Histogram] = field(default_factory=dict)
    families: dict[str, str] = field(default_factory=dict)  # histogram key -> family read
    model: str | None = None  # the engine's `model_name` label
    kv_schema: str | None = None  # vLLM's cache_config_info: cache dtype and block size
    started: float | None = None  # process_start_time_seconds, where exported


def wanted(spec: EngineSpec) -> frozenset[str]:
    """The sample names `read` looks at: a scrape's other families need not be parsed."""
    names = {s.name for group in (spec.counters, spec.gauges) for c in group.values() for s in c}
    for families in spec.histograms.values():
        names |= {f"{f}_{suffix}" for f in families for suffix in ("bucket", "count")}
    return frozenset(names | {"vllm:cache_config_info", "process_start_time_seconds"})


def _declared(expo: Exposition, name: str) -> bool:
    # prometheus_client's 0.0.4 text names a counter's family with `_total`, OpenMetrics
    # without it.
    return expo.declared(name) or expo.declared(name.removesuffix("_total"))


def _counter(expo: Exposition, candidates: tuple[Series, ...]) -> float | None:
    for s in candidates:
        values = [v for _, v in expo.series(s.name, dict(s.where)) if math.isfinite(v)]
        if values:
            return sum(values)
        if expo.series(s.name) or _declared(expo, s.name):
            return 0.0  # declared, or other label sets only: nothing counted for this one
    return None


def _gauge(expo: Exposition, candidates: tuple[Series, ...], peak: bool) -> float | None:
    for s in candidates:
        values = [v for _, v in expo.series(s.name, dict(s.where)) if math.isfinite(v)]
        if values:
            return max(values) if peak else sum(values)
    return None


def _model(expo: Exposition, prefix: str) -> str | None:
    names: Counter[str] = Counter()
    for name, family in expo.samples.items():
        if name.startswith(prefix):
            for labels in family:
                value = dict(labels).get("model_name")
                if value:
                    names[value] += 1
    return sorted(names.items(), key=lambda kv: (-kv[1], kv[0]))[0][0] if names else None


def _vllm_kv_schema(expo: Exposition) -> str | None:
    """vLLM sets cache_config_info once its KV cache is allocated (log_engine_initialized)."""
    for labels, _ in expo.series("vllm:cache_config_info"):
        info = dict(labels)
        if info.get("block_size"):
            return f"{info.get('cache_dtype') or 'auto'}-b{info['block_size']}"
    return None


def read(spec: EngineSpec, expo: Exposition) -> Reading:
    """The counters, gauges, histograms and identity of `spec` in one scrape."""
    counters = {k: v for k, c in spec.counters.items() if (v := _counter(expo, c)) is not None}
    gauges = {
        k: v
        for k, c in spec.gauges.items()
        if (v := _gauge(expo, c, k in spec.peak_gauges)) is not None
    }
    hists, names = {}, {}
    for key, families in spec.histograms.items():
        for family in families:
            h = histogram(expo, family)
            if h is not None:
                hists[key], names[key] = h, family
                break
    starts = [v for _, v in expo.series("process_start_time_seconds") if math.isfinite(v)]
    return Reading(
        counters=counters,
        gauges=gauges,
        histograms=hists,
        families=names,
        model=_model(expo, spec.prefix),
        kv_schema=_vllm_kv_schema(expo) if spec is VLLM else None,
        started=max(starts) if starts else None,
    )


def restarted(before: Reading, after: Reading) -> bool:
    """The engine restarted between the two scrapes: a new process start time, or a counter
    or histogram count that went down (counters only grow within one process)."""
    if None not in (before.started, after.started) and after.started != before.started:
        return True
    if any(after.counters.get(k, math.inf) < v for k, v in before.counters.items()):
        return True
    return any(
        (h := after.histograms.get(k)) is not None and h.count < b.count
        for k, b in before.histograms.items()
    )


SLO_TERMS = (("ttft", "ttft"), ("tpot", "tpot_request"), ("e2e", "e2e"))


def slo_bounds(
    spec: EngineSpec, reading: Reading, slo: Slo
) -> list[tuple[str, str, float | None, float]]:
    """(term, histogram family, bound used, threshold ms) for each SLO term the engine has a
    per-request histogram of: the bound is the largest bucket bound ≤ the threshold."""
    out = []
    for term, key in SLO_TERMS:
        h = reading.histograms.get(key)
        if h is None:
            continue
        ms = getattr(slo, f"{term}_ms")
        _, bound = at_most(h, ms / 1000.0)
        out.append((term, reading.families.get(key, key), bound, ms))
    return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


def _pct(value: float) -> float:
    return round(min(100.0, max(0.0, value)), 2)


def window(
    spec: EngineSpec, before: Reading, after: Reading, seconds: float, slo: Slo
) -> dict[str, Any]:
    """The serving window between two scrapes `seconds` apart (contract v1 ServingWindowStats).

    slo_met is a lower bound: a request counts as missing a term when its histogram cannot
    place it at or under the threshold (values between the largest bucket bound ≤ the
    threshold and the threshold itself count as misses), the misses of the terms are added
    as if no request missed two (so a request missing both is subtracted twice), and
    cancelled or failed requests never count as met. Exact when every threshold is a bucket
    bound and at most one term has misses. TPOT counts only from a per-request histogram
    (`slo_checked` lists the terms counted).
    """
    reset = restarted(before, after)

    def grew(key: str) -> float | None:
        now = after.counters.get(key)
        if now is None:
            return None
        was = before.counters.get(key)
        return now if reset or was is None else max(0.0, now - was)

    def delta(key: str) -> Histogram | None:
        now = after.histograms.get(key)
        if now is None:
            return None
        return increase(None if reset else before.histograms.get(key), now)

    win: dict[str, Any] = {"seconds": round(seconds, 3)}
    hists = {k: h for k in spec.histograms if (h := delta(k)) is not None}
    requests = grew("requests")
    if requests is None and "e2e" in hists:
        requests = hists["e2e"].buckets[-1][1]
    win["requests"] = round(requests or 0)
    cancelled = grew("cancelled")
    if cancelled is not None:
        win["cancelled"] = round(cancelled)

    tpot = hists.get("tpot_request") or hists.get("tpot_token")
    for name, h in (("ttft", hists.get("ttft")), ("tpot", tpot)):
        if h is not None:
            win[f"{name}_ms_p50"] = _ms(quantile(0.5, h))
            win[f"{name}_ms_p99"] = _ms(quantile(0.99, h))
    for name in ("e2e", "queue", "prefill", "decode"):
        h = hists.get(name)
        if h is None:
            continue
        if name != "e2e":
            win[f"{name}_ms_p50"] = _ms(quantile(0.5, h))
        win[f"{name}_ms_p99"] = _ms(quantile(0.99, h))

    misses, checked = 0.0, []
    for term, key in SLO_TERMS:
        h = hists.get(key)
        if h is None:
            continue
        under, _ = at_most(h, getattr(slo, f"{term}_ms") / 1000.0)
        misses += max(0.0, h.buckets[-1][1] - under)
        checked.append(term)
    met = win["requests"] - win.get("cancelled", 0) - (grew("failed") or 0.0) - misses
    win["slo_met"] = int(min(win["requests"], max(0.0, math.floor(met + 1e-9))))
    win["slo_checked"] = checked

    for key in ("queued", "active"):
        if key in after.gauges:
            win[key] = round(max(0.0, after.gauges[key]))
    preempted = grew("preempted")
    if preempted is not None:
        win["preempted"] = round(preempted)
    if "kv_used" in after.gauges:
        win["kv_used_pct"] = _pct(100.0 * after.gauges["kv_used"])
    queries, hits = grew("prefix_queries"), grew("prefix_hits")
    if queries is not None and hits is not None:
        if queries > 0:
            win["prefix_hit_pct"] = _pct(100.0 * hits / queries)
    elif "prefix_hit_rate" in after.gauges:
        win["prefix_hit_pct"] = _pct(100.0 * after.gauges["prefix_hit_rate"])
    passes, graph_misses = grew("graph_passes"), grew("graph_misses")
    if passes and graph_misses is not None:
        win["graph_miss_pct"] = _pct(100.0 * graph_misses / passes)

    unmeasured = [k for k in COUNTS if k not in win]
    win["unmeasured"] = [*unmeasured, *NEVER_MEASURED]
    return {k: v for k, v in win.items() if v is not None}
