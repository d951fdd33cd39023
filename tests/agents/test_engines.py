"""vLLM and SGLang metrics as serving windows (agents/engines.py), against the engines' own
scrapes: one captured from a real vLLM server, one from SGLang's docs, and scrapes built from
each version's metric definitions for requests whose SLO outcome is known
(tests/agents/fixtures/serving/README.md)."""

from __future__ import annotations

import importlib.util
import json
import math
import random
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents import engines, prometheus, protocol

FIXTURES = Path(__file__).parent / "fixtures" / "serving"
_spec = importlib.util.spec_from_file_location("construct", FIXTURES / "construct.py")
assert _spec is not None and _spec.loader is not None
construct = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(construct)

PAIRS = {"vllm-0.32.0": "vllm", "vllm-0.8": "vllm", "vllm-v0": "vllm",
         "sglang-docs": "sglang", "sglang-0.5": "sglang"}  # fmt: skip
NEVER = ["evictions", "oom", "timeouts", "retries", "duplicate_tokens"]
CONSTRUCTED = ("vllm-0.8", "vllm-v0", "sglang-0.5")


def _text(name: str, side: str) -> str:
    return (FIXTURES / f"{name}.{side}.prom").read_text()


def _reading(name: str, side: str, text: str | None = None) -> engines.Reading:
    spec = engines.ENGINES[PAIRS[name]]
    return engines.read(spec, prometheus.parse(text if text is not None else _text(name, side)))


def _window(name: str, slo: engines.Slo | None = None, seconds: float = 10.0) -> dict[str, Any]:
    spec = engines.ENGINES[PAIRS[name]]
    before, after = _reading(name, "a"), _reading(name, "b")
    return engines.window(spec, before, after, seconds, slo or engines.Slo())


# What each pair's window is, worked out by hand from its requests (construct.py WINDOW) and
# each version's buckets; the captured vLLM pair from the traffic that produced it.
EXPECTED: dict[str, dict[str, Any]] = {
    "vllm-0.32.0": {
        # 24 completions; the two streams the client closed are counted by no vLLM series.
        "requests": 24, "cancelled": 0, "slo_met": 24, "slo_checked": ["ttft", "tpot", "e2e"],
        "queued": 0, "active": 0, "preempted": 0, "kv_used_pct": 0.0,
        "prefix_hit_pct": 64.67,  # 3200 cached of 4948 queried prompt tokens
    },
    "vllm-0.8": {
        # TTFT misses counted at vLLM's 1.0 s bound (1.5, 2.2, 3.0 s), E2E at 60 s (72.4,
        # 77.7 s): 11 - 1 cancelled - 3 - 2. No per-request TPOT histogram before 0.9.
        "requests": 11, "cancelled": 1, "slo_met": 5, "slo_checked": ["ttft", "e2e"],
        "queued": 1, "active": 5, "preempted": 2, "kv_used_pct": 76.0,
        "prefix_hit_pct": 27.27,  # 6 x 256 of 11 x 512
    },
    "vllm-v0": {
        "requests": 11, "cancelled": 1, "slo_met": 5, "slo_checked": ["ttft", "e2e"],
        "queued": 0, "active": 0, "preempted": 2, "kv_used_pct": 60.0, "prefix_hit_pct": 35.0,
    },
    "sglang-docs": {
        # No request counter: the E2E histogram's 10; TTFT misses at 1.0 s (its 2.5 s is over
        # 2 s) are 8, E2E misses at 60 s 2.
        "requests": 10, "slo_met": 0, "slo_checked": ["ttft", "e2e"], "queued": 2826,
        "active": 162, "kv_used_pct": 28.0, "prefix_hit_pct": 0.75,
    },
    "sglang-0.5": {
        # SGLang's TTFT buckets hold 2 s: misses 2.2 and 3.0 s; E2E 72.4 and 77.7 s.
        "requests": 11, "cancelled": 1, "slo_met": 6, "slo_checked": ["ttft", "e2e"],
        "queued": 0, "active": 3, "preempted": 2, "kv_used_pct": 75.0,
        "prefix_hit_pct": 21.82, "graph_miss_pct": 0.58,
    },
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_it_reads_each_engine_versions_scrapes_as_the_window_they_describe(name: str) -> None:
    window = _window(name)
    assert {k: window.get(k) for k in EXPECTED[name]} == EXPECTED[name], window
    stats = msgspec.convert(window, protocol.ServingWindowStats)  # the contract takes it
    assert stats.requests == EXPECTED[name]["requests"]


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_it_leaves_out_what_the_engine_does_not_export_and_says_so(name: str) -> None:
    window = _window(name)
    unmeasured = window["unmeasured"]
    assert unmeasured[-len(NEVER) :] == NEVER
    for key in unmeasured:
        assert key not in window  # absent, never 0
    phases = {"queue_ms_p99", "prefill_ms_p99", "decode_ms_p99"}
    has_phases = {"vllm-0.32.0": phases, "vllm-0.8": phases, "sglang-0.5": {"queue_ms_p99"}}
    assert phases & set(window) == has_phases.get(name, set())
    assert ("graph_miss_pct" in window) == (name == "sglang-0.5")
    assert ("cancelled" in unmeasured) == (name == "sglang-docs")


def test_it_takes_model_and_kv_schema_from_the_engines_info() -> None:
    assert _reading("vllm-0.32.0", "b").model == "tiny-llama"
    assert _reading("vllm-0.32.0", "b").kv_schema == "auto-b128"
    assert _reading("vllm-0.8", "b").kv_schema == "fp8-b16"
    assert _reading("vllm-v0", "b").kv_schema == "auto-b16"  # V0's Info metric
    assert _reading("sglang-0.5", "b").model == "meta-llama/Llama-3.1-8B-Instruct"
    assert _reading("sglang-0.5", "b").kv_schema is None  # SGLang's is /get_server_info's


def _names(spec: engines.EngineSpec) -> set[str]:
    names = {s.name for group in (spec.counters, spec.gauges) for c in group.values() for s in c}
    return names | {f for families in spec.histograms.values() for f in families}


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_its_fixtures_hold_every_series_name_the_mapping_reads(engine: str) -> None:
    text = "".join(_text(n, side) for n, e in PAIRS.items() if e == engine for side in "ab")
    present = {m.group(1) for m in re.finditer(r"^([a-z0-9_:]+?)(?:_bucket)?[{ ]", text, re.M)}
    assert _names(engines.ENGINES[engine]) <= present, _names(engines.ENGINES[engine]) - present


def _true_met(slo: engines.Slo, terms: list[str]) -> int:
    limits = {"ttft": slo.ttft_ms / 1000, "tpot": slo.tpot_ms / 1000, "e2e": slo.e2e_ms / 1000}
    met = 0
    for r in construct.WINDOW:
        if r[4] == "abort":
            continue
        values = {"ttft": r[0], "tpot": r[1], "e2e": construct._e2e(r)}
        met += all(values[t] <= limits[t] for t in terms)
    return met


def test_its_truth_file_is_what_construct_counts() -> None:
    assert json.loads((FIXTURES / "truth.json").read_text()) == construct.truth()
    assert _true_met(engines.Slo(), ["ttft", "tpot", "e2e"]) == construct.truth()["met_all"]


SLOS = st.builds(
    engines.Slo,
    ttft_ms=st.floats(50, 5000),
    tpot_ms=st.floats(10, 400),
    e2e_ms=st.floats(1000, 120_000),
)


@settings(max_examples=60, deadline=None)
@given(slo=SLOS, name=st.sampled_from(CONSTRUCTED))
def test_it_never_counts_more_requests_as_met_than_met_the_terms_it_checked(
    slo: engines.Slo, name: str
) -> None:
    window = _window(name, slo)
    assert window["slo_met"] <= _true_met(slo, window["slo_checked"])


def test_it_counts_slo_met_exactly_at_bucket_bounds_when_one_term_has_misses() -> None:
    # SGLang's buckets hold 2 s TTFT and 80 s E2E: with those thresholds only the 2.2 s and
    # 3.0 s TTFT requests miss anything, and nothing misses E2E.
    slo = engines.Slo(ttft_ms=2000, e2e_ms=80_000)
    window = _window("sglang-0.5", slo)
    assert window["slo_met"] == _true_met(slo, window["slo_checked"]) == 8


def test_it_counts_tpot_only_from_a_per_request_histogram() -> None:
    # 5 ms is under vLLM's lowest TPOT bound (10 ms): no request can be shown to meet it.
    strict = engines.Slo(tpot_ms=5)
    assert _window("vllm-0.32.0", strict)["slo_met"] == 0  # per-request TPOT: counted
    per_token = _window("vllm-0.8", strict)  # per-token only: not counted, and says so
    assert per_token["slo_checked"] == ["ttft", "e2e"] and per_token["slo_met"] == 5


def test_it_never_counts_a_failed_request_as_met() -> None:
    series = (
        'vllm:request_success_total{engine="0",finished_reason="error",model_name="tiny-llama"}'
    )
    before = _text("vllm-0.32.0", "b")
    after = before.replace(f"{series} 0.0", f"{series} 3.0")
    assert after != before
    spec = engines.VLLM
    later = engines.read(spec, prometheus.parse(after))
    window = engines.window(spec, _reading("vllm-0.32.0", "b"), later, 5.0, engines.Slo())
    assert window["requests"] == 3 and window["slo_met"] == 0


def test_it_counts_from_zero_after_the_engine_restarted() -> None:
    # The restarted engine's scrape is the .a of a pair (fewer requests than .b had).
    for name in CONSTRUCTED:
        spec = engines.ENGINES[PAIRS[name]]
        before, after = _reading(name, "b"), _reading(name, "a")
        assert engines.restarted(before, after)
        window = engines.window(spec, before, after, 10.0, engines.Slo())
        assert window["requests"] == len(construct.BEFORE)
        assert window["slo_met"] <= window["requests"]


def test_it_sees_a_restart_by_the_process_start_time_even_when_counts_grew() -> None:
    text = _text("vllm-0.32.0", "b")
    later = text.replace("process_start_time_seconds 1.79661220759e+09",
                         "process_start_time_seconds 1.79661230000e+09")  # fmt: skip
    assert later != text
    before, after = _reading("vllm-0.32.0", "a"), _reading("vllm-0.32.0", "b", later)
    assert engines.restarted(before, after)
    window = engines.window(engines.VLLM, before, after, 10.0, engines.Slo())
    assert window["requests"] == 25  # everything the new process counted


def test_it_reads_the_same_window_whatever_the_order_of_series_and_lines() -> None:
    for name in PAIRS:
        spec = engines.ENGINES[PAIRS[name]]
        texts = []
        for side in "ab":
            lines = _text(name, side).splitlines()
            random.Random(side + name).shuffle(lines)
            texts.append("\n".join(lines))
        before, after = (engines.read(spec, prometheus.parse(t)) for t in texts)
        shuffled = engines.window(spec, before, after, 10.0, engines.Slo())
        assert shuffled == _window(name), name


def test_it_reads_a_quiet_window_as_quiet() -> None:
    for name in PAIRS:
        spec = engines.ENGINES[PAIRS[name]]
        same = _reading(name, "b")
        window = engines.window(spec, same, same, 10.0, engines.Slo())
        assert window["requests"] == 0 and window["slo_met"] == 0
        assert not {k for k in window if re.fullmatch(r"\w+_ms_p\d+", k)}  # no latencies
        assert "prefix_hit_pct" not in window or name in ("vllm-v0", "sglang-docs")  # gauges


def test_it_reads_an_engine_asleep() -> None:
    asleep = _text("vllm-0.32.0", "b").replace(
        'sleep_state="awake"} 1.0', 'sleep_state="awake"} 0.0'
    )
    assert _reading("vllm-0.32.0", "b", asleep).gauges["awake"] == 0.0
    assert _reading("vllm-0.32.0", "b").gauges["awake"] == 1.0


def test_it_reports_slo_bounds_that_make_slo_met_approximate() -> None:
    reading = _reading("vllm-0.32.0", "b")
    bounds = {t: (f, b) for t, f, b, _ in engines.slo_bounds(engines.VLLM, reading, engines.Slo())}
    assert bounds["ttft"] == ("vllm:time_to_first_token_seconds", 1.0)  # 2000 ms: not a bound
    assert bounds["tpot"] == ("vllm:request_time_per_output_token_seconds", 0.15)
    assert bounds["e2e"] == ("vllm:e2e_request_latency_seconds", 60.0)


def test_it_keeps_kv_and_hit_rates_within_percent_whatever_the_gauges_say() -> None:
    text = _text("sglang-docs", "b")
    for raw in ("1.7", "-0.2", "NaN", "+Inf"):
        bad = re.sub(r"(sglang:token_usage\{[^}]*\}) \S+", rf"\1 {raw}", text)
        window = engines.window(engines.SGLANG, _reading("sglang-docs", "a"),
                                _reading("sglang-docs", "b", bad), 10.0, engines.Slo())  # fmt: skip
        kv = window.get("kv_used_pct")
        assert kv is None or 0.0 <= kv <= 100.0
        assert kv is not None or not math.isfinite(float(raw))


# -- the contract's engine fields ---------------------------------------------------------
GOLDEN = Path(__file__).parent / "fixtures" / "contract" / "serving_engine_windows.json"


def test_it_accepts_the_golden_engine_windows_forever() -> None:
    batch = protocol.decode_batch(GOLDEN.read_bytes())
    vllm, sglang = (r.window for r in batch.records if isinstance(r, protocol.Serving))
    assert vllm.slo_checked == ["ttft", "tpot", "e2e"] and vllm.prefill_ms_p99 == 297.0
    assert sglang.graph_miss_pct == 0.58 and sglang.slo_checked == ["ttft", "e2e"]
    assert sglang.unmeasured == NEVER


@pytest.mark.parametrize(
    ("field", "value"),
    [("graph_miss_pct", 101.0), ("queue_ms_p99", -1.0), ("slo_checked", ["ttft", "speed"]),
     ("slo_checked", ["ttft"] * 4), ("unmeasured", ["oom prone"]), ("decode_ms_p50", "fast")],
)  # fmt: skip
def test_it_refuses_an_engine_field_out_of_its_range_naming_it(field: str, value: Any) -> None:
    body = json.loads(GOLDEN.read_text())
    body["records"][0]["window"][field] = value
    with pytest.raises(protocol.ContractError, match=f"window.{field}"):
        protocol.decode_batch(json.dumps(body).encode())


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_it_reads_the_same_window_from_the_families_it_parses_alone(name: str) -> None:
    spec = engines.ENGINES[PAIRS[name]]
    keep = engines.wanted(spec).__contains__
    before, after = (engines.read(spec, prometheus.parse(_text(name, s), keep=keep)) for s in "ab")
    assert engines.window(spec, before, after, 10.0, engines.Slo()) == _window(name)
    assert after.kv_schema == _reading(name, "b").kv_schema
    assert after.model == _reading(name, "b").model
