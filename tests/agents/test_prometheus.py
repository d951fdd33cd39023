"""The stdlib Prometheus text parser and histogram arithmetic (agents/prometheus.py).

Checked against prometheus_client, the library vLLM and SGLang expose their metrics with:
whatever it writes, this parser reads back to the same samples; and against the definition
of histogram_quantile and of a bucket's count on random observations.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from agents import prometheus as prom

TRICKY = """\
# HELP vllm:request_success_total Count of "successfully" processed requests.\\n
# TYPE vllm:request_success_total counter
vllm:request_success_total{finished_reason="stop",model_name="a\\"b,c}d\\\\e\\nf"} 12.0
vllm:request_success_total{ model_name = "m" , finished_reason="abort", } 3 1700000000000
# a comment that is not HELP or TYPE
vllm:kv_cache_usage_perc{model_name="m"} NaN
up -Inf
h_bucket{le="0.5"} 1
h_bucket{le="+Inf"} 4 # {trace_id="abc"} 0.7 1700000000.1
h_count 4
{"my.dotted.metric", a="1"} 7
this line is not a sample
broken{le="1"
nameonly
x{a="1"}oops
# EOF
after_eof 1
"""


def test_it_reads_escapes_exemplars_timestamps_and_special_values() -> None:
    expo = prom.parse(TRICKY)
    success = expo.samples["vllm:request_success_total"]
    assert success[(("finished_reason", "stop"), ("model_name", 'a"b,c}d\\e\nf'))] == 12.0
    assert success[(("finished_reason", "abort"), ("model_name", "m"))] == 3.0
    assert math.isnan(expo.samples["vllm:kv_cache_usage_perc"][(("model_name", "m"),)])
    assert expo.samples["up"][()] == -math.inf
    assert expo.samples["h_bucket"][(("le", "+Inf"),)] == 4.0  # the exemplar is not the value
    assert expo.samples["my.dotted.metric"][(("a", "1"),)] == 7.0
    assert expo.types == {"vllm:request_success_total": "counter"}
    assert "after_eof" not in expo.samples
    assert expo.skipped == 4  # the prose line, the unclosed brace, no value, a bad value


def test_it_keeps_the_last_value_of_a_repeated_series_and_counts_it_once() -> None:
    expo = prom.parse('a{x="1"} 1\na{x="1"} 2\na{x="2"} 3\n', max_samples=2)
    assert expo.samples["a"] == {(("x", "1"),): 2.0, (("x", "2"),): 3.0}
    assert not expo.truncated


def test_it_stops_at_the_sample_limit_and_says_so() -> None:
    text = "".join(f'a{{i="{i}"}} {i}\n' for i in range(100))
    expo = prom.parse(text, max_samples=10)
    assert len(expo.samples["a"]) == 10 and expo.truncated


def test_it_parses_a_large_scrape_in_linear_time() -> None:
    line = 'vllm:e2e_request_latency_seconds_bucket{engine="0",le="%s",model_name="m"} %d\n'
    text = "".join(line % (i, i) for i in range(40_000))  # ~3.3 MB, over any real engine's
    started = time.perf_counter()
    expo = prom.parse(text)
    assert len(expo.samples["vllm:e2e_request_latency_seconds_bucket"]) == 40_000
    assert time.perf_counter() - started < 15.0  # quadratic would take minutes


@given(st.text(max_size=400))
def test_it_never_raises_on_arbitrary_text(text: str) -> None:
    prom.parse(text)


LABEL_VALUES = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.tuples(LABEL_VALUES, st.floats(allow_nan=False)), min_size=1,
                    max_size=6, unique_by=lambda t: t[0]),
    counts=st.lists(st.integers(0, 5), min_size=1, max_size=8),
)  # fmt: skip
def test_it_reads_what_prometheus_client_writes_as_prometheus_client_reads_it(
    values: list[tuple[str, float]], counts: list[int]
) -> None:
    registry = _registry(values, counts)
    text = generate_latest(registry).decode()
    expected = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    expo = prom.parse(text)
    got = {(name, labels): v for name, fam in expo.samples.items() for labels, v in fam.items()}
    assert expo.skipped == 0 and not expo.truncated
    assert got == expected


@settings(max_examples=30, deadline=None)
@given(
    values=st.lists(st.tuples(LABEL_VALUES, st.floats(allow_nan=False)), min_size=1,
                    max_size=6, unique_by=lambda t: t[0]),
)  # fmt: skip
def test_it_reads_every_line_of_the_openmetrics_text_prometheus_client_writes(
    values: list[tuple[str, float]],
) -> None:
    text = generate_openmetrics(_registry(values, [1, 2])).decode()
    expo = prom.parse(text)
    assert expo.skipped == 0
    # prometheus_client's OpenMetrics writer escapes the colon of a legacy name.
    gauge = expo.samples["vllm_num_requests_running"]
    assert {dict(labels)["model_name"]: v for labels, v in gauge.items()} == dict(values)


def _registry(values: list[tuple[str, float]], counts: list[int]) -> CollectorRegistry:
    registry = CollectorRegistry()
    gauge = Gauge("vllm:num_requests_running", "running", ["model_name"], registry=registry)
    counter = Counter("vllm:prompt_tokens", "prompt", ["model_name"], registry=registry)
    hist = Histogram("vllm:e2e_request_latency_seconds", "e2e", ["model_name"],
                     buckets=(0.5, 1.0, 2.5), registry=registry)  # fmt: skip
    for label, value in values:
        gauge.labels(label).set(value)
        counter.labels(label).inc(abs(value) if math.isfinite(value) else 1)
        for i, n in enumerate(counts):
            for _ in range(n):
                hist.labels(label).observe(i * 0.4)
    return registry


def _observed(values: list[float], bounds: list[float]) -> prom.Histogram:
    buckets = tuple((b, float(sum(1 for v in values if v <= b))) for b in [*bounds, math.inf])
    return prom.Histogram(buckets, float(len(values)))


BOUNDS = st.lists(st.floats(0.001, 100.0), min_size=1, max_size=12, unique=True).map(sorted)
OBSERVATIONS = st.lists(st.floats(0.0, 150.0), min_size=1, max_size=200)


@given(values=OBSERVATIONS, bounds=BOUNDS, threshold=st.floats(0.0, 150.0))
def test_it_never_counts_more_under_a_threshold_than_were_under_it(
    values: list[float], bounds: list[float], threshold: float
) -> None:
    h = _observed(values, bounds)
    under, bound = prom.at_most(h, threshold)
    assert under <= sum(1 for v in values if v <= threshold)
    if bound is not None:
        assert bound <= threshold and under == sum(1 for v in values if v <= bound)


@given(values=OBSERVATIONS, bounds=BOUNDS, pick=st.integers(0, 11))
def test_it_counts_exactly_at_a_threshold_that_is_a_bucket_bound(
    values: list[float], bounds: list[float], pick: int
) -> None:
    threshold = bounds[pick % len(bounds)]
    under, _ = prom.at_most(_observed(values, bounds), threshold)
    assert under == sum(1 for v in values if v <= threshold)


@given(values=OBSERVATIONS, bounds=BOUNDS, q=st.sampled_from([0.5, 0.9, 0.99]))
@example(values=[2.0, 35.0], bounds=[1.932576878191579, 34.05245125854059], q=0.5)  # 1 ulp over
def test_it_places_a_quantile_inside_the_bucket_that_holds_it(
    values: list[float], bounds: list[float], q: float
) -> None:
    h = _observed(values, bounds)
    got = prom.quantile(q, h)
    assert got is not None
    rank = q * len(values)
    holds = next(i for i, (_, cum) in enumerate(h.buckets) if cum >= rank)
    upper = h.buckets[holds][0]
    lower = h.buckets[holds - 1][0] if holds else 0.0
    if upper == math.inf:
        assert got == h.buckets[-2][0]  # histogram_quantile: the highest finite bound
    else:
        # In histogram_quantile's own arithmetic order (lower + (upper - lower) * fraction)
        # a quantile at the bucket's top rounds to within an ulp or two of it, either side.
        assert lower <= got <= upper or math.isclose(
            got, upper if got > upper else lower, rel_tol=1e-12
        )


def test_it_interpolates_like_histogram_quantile() -> None:
    # The vLLM docs' TTFT example: 140 requests, cumulative 0,0,0,13,97,123,138,140,140.
    bounds = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1]
    cums = [0, 0, 0, 13, 97, 123, 138, 140]
    h = prom.Histogram(tuple(zip([*bounds, math.inf], [*map(float, cums), 140.0],
                                 strict=True)), 140.0)  # fmt: skip
    # rank 70 falls in (0.02, 0.04]: 0.02 + 0.02 * (70 - 13) / 84
    assert prom.quantile(0.5, h) == pytest.approx(0.02 + 0.02 * 57 / 84)
    # rank 138.6 falls in (0.08, 0.1]: 0.08 + 0.02 * 0.6 / 2
    assert prom.quantile(0.99, h) == pytest.approx(0.086)
    assert prom.quantile(0.5, prom.Histogram(((1.0, 0.0), (math.inf, 0.0)), 0.0)) is None


def test_it_takes_the_running_maximum_of_buckets_scraped_mid_update() -> None:
    text = 'h_bucket{le="1"} 5\nh_bucket{le="2"} 4\nh_bucket{le="+Inf"} 6\nh_count 6\n'
    h = prom.histogram(prom.parse(text), "h")
    assert h is not None and [c for _, c in h.buckets] == [5.0, 5.0, 6.0]


def test_it_sums_a_histogram_over_engines_and_fills_a_missing_inf_bucket() -> None:
    text = (
        "".join(
            f'h_bucket{{engine="{e}",le="{le}"}} {n}\n'
            for e, rows in (("0", ((1, 2), (2, 3))), ("1", ((1, 1), (2, 4))))
            for le, n in rows
        )
        + 'h_count{engine="0"} 3\nh_count{engine="1"} 5\n'
    )
    h = prom.histogram(prom.parse(text), "h")
    assert h == prom.Histogram(((1.0, 3.0), (2.0, 7.0), (math.inf, 8.0)), 8.0)


def test_it_takes_the_increase_since_a_restart_when_a_bucket_went_down() -> None:
    before = _observed([0.1] * 50, [1.0])
    after = _observed([0.1, 5.0], [1.0])  # a new process: two observations since it began
    assert prom.increase(before, after) == after
    grown = _observed([0.1] * 50 + [5.0] * 3, [1.0])
    assert prom.increase(before, grown) == prom.Histogram(((1.0, 0.0), (math.inf, 3.0)), 3.0)
    relaid = _observed([0.1] * 60, [0.5, 1.0])  # another bucket layout: not comparable
    assert prom.increase(before, relaid) == relaid


def test_it_agrees_with_the_values_it_was_given_in_any_series_order() -> None:
    lines = [f'vllm:request_success_total{{finished_reason="{r}"}} {n}' for r, n in
             (("stop", 5), ("length", 2), ("abort", 1))]  # fmt: skip
    for _ in range(5):
        random.shuffle(lines)
        expo = prom.parse("\n".join(lines))
        assert prom.total(expo, "vllm:request_success_total") == 8.0
        assert prom.total(expo, "vllm:request_success_total", {"finished_reason": "abort"}) == 1


PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian prometheus) is not installed")
def test_its_quantiles_are_what_prometheus_histogram_quantile_computes(tmp_path: Path) -> None:
    """Prometheus itself (promtool's rule-test engine) evaluates histogram_quantile on the
    same buckets: a test file whose expected values are ours passes only if they agree."""
    rng = random.Random(45)
    tests, cases = [], 0
    for case in range(25):
        bounds = sorted(rng.sample([0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0],
                                   rng.randint(2, 8)))  # fmt: skip
        values = [
            rng.expovariate(1 / rng.choice((0.02, 0.3, 3.0))) for _ in range(rng.randint(1, 60))
        ]
        h = _observed(values, bounds)
        series = [
            {"series": f'h{case}_bucket{{le="{"+Inf" if le == math.inf else le}"}}',
             "values": f"{int(cum)}"}
            for le, cum in h.buckets
        ]  # fmt: skip
        checks = []
        for q in (0.5, 0.9, 0.99):
            ours = prom.quantile(q, h)
            assert ours is not None
            checks.append({"expr": f"histogram_quantile({q}, h{case}_bucket)", "eval_time": "0m",
                           "exp_samples": [{"labels": "{}", "value": ours}]})  # fmt: skip
            cases += 1
        tests.append({"interval": "1m", "input_series": series, "promql_expr_test": checks})
    path = tmp_path / "quantiles.yml"
    path.write_text(json.dumps({"tests": tests}))  # YAML is a superset of JSON
    done = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert cases == 75
