"""The agent's `[[serving]]` scrape (agents/serving_scrape.py): its settings, its bounded HTTP
reads, and windows from a vLLM-shaped engine (faultline.demo.fake_engine, written by
prometheus_client as vLLM's metrics are) and from an SGLang stub serving SGLang's scrapes."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from agents import serving_scrape as ss
from agents.agent import Agent, Config
from agents.cli import ConfigError, _parser, build_config
from faultline.demo.fake_engine import FakeVllm

from .conftest import StubIngest, validate

FIXTURES = Path(__file__).parent / "fixtures" / "serving"


def _config(url: str, **extra: Any) -> ss.EngineConfig:
    return ss.parse_config([{"url": url, "engine": "vllm", "group": "chat", **extra}], "n1")[0]


@pytest.fixture
def engine() -> Iterator[FakeVllm]:
    fake = FakeVllm("llama-3.1-8b").start()
    yield fake
    fake.close()


def _serve(fake: FakeVllm, n: int = 20) -> None:
    for i in range(n):
        fake.serve(ttft=0.05 + 0.01 * i, tpot=0.02, tokens=16, cached=64 if i % 2 else 0)
    fake.load(running=3, waiting=1, kv_used=0.4)


# -- settings ---------------------------------------------------------------------------


def test_it_reads_a_serving_entry_with_its_defaults() -> None:
    cfg = _config("http://127.0.0.1:8000/metrics/")
    assert (cfg.url, cfg.worker, cfg.interval, cfg.timeout) == (
        "http://127.0.0.1:8000", "n1:8000", 10.0, 2.0,
    )  # fmt: skip
    assert cfg.slo == ss.engines.Slo() and cfg.model_version is None


def test_it_takes_the_groups_slo_in_the_groups_own_keys() -> None:
    cfg = _config("http://h:1", slo={"ttft_ms_p99": 500, "e2e_ms_p99": 9000.5}, worker="w-1")
    assert cfg.slo == ss.engines.Slo(ttft_ms=500, tpot_ms=150, e2e_ms=9000.5)


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ({"url": "ftp://h/x"}, "url 'ftp://h/x' must be the engine's http(s)"),
        ({"url": None}, "url None must be"),
        ({"engine": "tgi"}, "engine 'tgi' must be one of vllm, sglang"),
        ({"group": "chat prod"}, "group 'chat prod' must be a name"),
        ({"worker": ""}, "worker '' must be a name"),
        ({"interval": 0}, "interval 0 must be seconds in (0, 3600]"),
        ({"interval": True}, "interval True must be seconds"),
        ({"timeout": "2"}, "timeout '2' must be seconds in (0, 60]"),
        ({"slo": {"ttft": 5}}, "takes ttft_ms_p99, tpot_ms_p99, e2e_ms_p99"),
        ({"slo": {"ttft_ms_p99": -1}}, "slo ttft_ms_p99 -1 must be milliseconds > 0"),
        ({"model_version": "a b"}, "model_version 'a b' must be a name"),
        ({"port": 8000}, "unknown key 'port'"),
    ],
)
def test_it_refuses_a_bad_entry_naming_the_key_and_value(entry: dict, says: str) -> None:
    base = {"url": "http://127.0.0.1:8000", "engine": "vllm", "group": "chat"}
    with pytest.raises(ValueError, match="entry 1") as caught:
        ss.parse_config([{**base, **entry}], "n1")
    assert says in str(caught.value)


def test_it_refuses_two_entries_reporting_as_one_worker() -> None:
    entry = {"url": "http://127.0.0.1:8000", "engine": "vllm", "group": "chat", "worker": "w"}
    with pytest.raises(ValueError, match="same group and worker"):
        ss.parse_config([entry, {**entry, "url": "http://127.0.0.1:8001"}], "n1")


def test_the_agent_command_line_reads_serving_tables_and_names_a_bad_one(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text('[[serving]]\nurl = "http://127.0.0.1:8000"\nengine = "sglang"\n'
                    'group = "chat"\n[[serving]]\nurl = "http://127.0.0.1:8001"\n'
                    'engine = "vllm"\ngroup = "chat"\n')  # fmt: skip
    cfg = build_config(_parser().parse_args(["run", "--config", str(good), "--dry-run"]))
    assert [(c.engine, c.worker) for c in cfg.serving] == [
        ("sglang", f"{cfg.node}:8000"), ("vllm", f"{cfg.node}:8001"),
    ]  # fmt: skip
    bad = tmp_path / "bad.toml"
    bad.write_text('[[serving]]\nurl = "http://127.0.0.1:8000"\nengine = "vllm"\n')
    with pytest.raises(ConfigError, match=r"\[\[serving\]\] entry 1: group None"):
        build_config(_parser().parse_args(["run", "--config", str(bad), "--dry-run"]))


# -- one engine, scrape by scrape ----------------------------------------------------------


def test_it_sends_a_window_per_scrape_after_the_first(engine: FakeVllm) -> None:
    scraper = ss.EngineScraper(_config(engine.url, worker="w-0"))
    assert scraper.poll(100.0) is None  # the first scrape is the baseline
    _serve(engine)
    rec = scraper.poll(110.0)
    assert rec is not None
    assert (rec["group"], rec["worker"], rec["model_version"], rec["kv_schema"]) == (
        "chat", "w-0", "llama-3.1-8b", "auto-b16",
    )  # fmt: skip
    assert rec["ready"] is True and rec["draining"] is False
    win = rec["window"]
    assert (win["seconds"], win["requests"], win["slo_met"], win["queued"], win["active"]) == (
        10.0, 20, 20, 1, 3,
    )  # fmt: skip
    assert win["kv_used_pct"] == 40.0 and win["prefix_hit_pct"] == 25.0
    validate([rec])  # the contract takes it as it is
    quiet = scraper.poll(120.0)
    assert quiet is not None and quiet["window"]["requests"] == 0


def test_it_reports_not_ready_while_health_fails_or_the_engine_sleeps(engine: FakeVllm) -> None:
    scraper = ss.EngineScraper(_config(engine.url))
    scraper.poll(0.0)
    engine.healthy = False
    rec = scraper.poll(5.0)
    assert rec is not None and rec["ready"] is False
    engine.healthy = True
    with engine.lock:
        engine.metrics.registry.register(_Asleep())
    rec = scraper.poll(10.0)
    assert rec is not None and rec["ready"] is False


class _Asleep:
    """vLLM's engine_sleep_state while weights are offloaded."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        family = GaugeMetricFamily("vllm:engine_sleep_state", "sleep", labels=["sleep_state"])
        family.add_metric(["awake"], 0.0)
        family.add_metric(["weights_offloaded"], 1.0)
        yield family


def test_it_counts_from_zero_after_a_restart_and_shows_a_kv_cache_not_yet_there(
    engine: FakeVllm,
) -> None:
    scraper = ss.EngineScraper(_config(engine.url))
    scraper.poll(0.0)
    _serve(engine, 30)
    scraper.poll(5.0)
    engine.restart(kv_cache=False)
    _serve(engine, 4)
    rec = scraper.poll(10.0)
    assert rec is not None and rec["window"]["requests"] == 4  # not 4 - 30
    # Answering /health before cache_config_info exists: ready without a KV schema, which
    # the service calls ready_before_loaded.
    assert rec["ready"] is True and "kv_schema" not in rec
    engine.allocate_kv_cache()
    rec = scraper.poll(15.0)
    assert rec is not None and rec["kv_schema"] == "auto-b16"


def test_it_sends_nothing_while_the_engine_is_unreachable_and_resumes_after(
    engine: FakeVllm, caplog: pytest.LogCaptureFixture
) -> None:
    scraper = ss.EngineScraper(_config(engine.url, timeout=0.5))
    scraper.poll(0.0)
    engine.close()
    assert scraper.poll(5.0) is None and scraper.poll(10.0) is None
    assert scraper.problem is not None and "metrics unreadable" in scraper.problem
    assert sum("metrics unreadable" in r.message for r in caplog.records) == 1  # once
    back = FakeVllm("llama-3.1-8b", port=engine.port).start()  # restarted on its port
    try:
        _serve(back, 3)
        rec = scraper.poll(15.0)
        assert rec is not None and rec["window"]["requests"] == 3
        assert rec["window"]["seconds"] == 15.0  # since the last scrape it read
        assert scraper.problem is None
    finally:
        back.close()


def test_it_refuses_a_port_that_serves_some_other_metrics(engine: FakeVllm) -> None:
    cfg = ss.parse_config([{"url": engine.url, "engine": "sglang", "group": "g"}], "n1")[0]
    scraper = ss.EngineScraper(cfg)
    assert scraper.poll(0.0) is None
    assert scraper.problem == "no sglang metrics at /metrics (is this a sglang?)"


def test_it_says_once_when_a_threshold_is_not_a_bucket_bound(
    engine: FakeVllm, caplog: pytest.LogCaptureFixture
) -> None:
    scraper = ss.EngineScraper(_config(engine.url))
    for t in (0.0, 5.0, 10.0):
        _serve(engine, 2)  # a histogram has series once it observed something
        scraper.poll(t)
    warned = [r.message for r in caplog.records if "not a bucket bound" in r.message]
    assert len(warned) == 1
    assert "ttft threshold 2000 ms" in warned[0] and "only up to 1000 ms" in warned[0]


# -- SGLang: metrics plus its model and server info ---------------------------------------


class SglangStub:
    """Serves SGLang's scrapes in turn, its /get_model_info and /get_server_info."""

    def __init__(self, scrapes: list[str], weights: str = "default") -> None:
        self.scrapes, self.weights, self.calls = scrapes, weights, []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                stub.calls.append(self.path)
                if self.path == "/metrics":
                    body = stub.scrapes.pop(0).encode() if stub.scrapes else b""
                elif self.path == "/health":
                    body = b""
                elif self.path == "/get_model_info":
                    body = json.dumps({"model_path": "/models/Qwen3-8B", "is_generation": True,
                                       "weight_version": stub.weights}).encode()  # fmt: skip
                elif self.path == "/get_server_info":
                    body = json.dumps({"kv_cache_dtype": "fp8_e5m2", "page_size": 64,
                                       "version": "0.5.4"}).encode()  # fmt: skip
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_it_names_an_sglang_workers_model_weights_and_kv_layout() -> None:
    scrapes = [(FIXTURES / f"sglang-0.5.{s}.prom").read_text() for s in "ab"]
    stub = SglangStub(scrapes, weights="step-1200")
    try:
        cfg = ss.parse_config([{"url": stub.url, "engine": "sglang", "group": "g"}], "n1")[0]
        scraper = ss.EngineScraper(cfg)
        assert scraper.poll(0.0) is None
        rec = scraper.poll(10.0)
    finally:
        stub.close()
    assert rec is not None
    assert rec["model_version"] == "meta-llama/Llama-3.1-8B-Instruct@step-1200"
    assert rec["kv_schema"] == "fp8_e5m2-p64"
    assert rec["window"]["requests"] == 11 and rec["window"]["graph_miss_pct"] == 0.58
    assert stub.calls.count("/get_server_info") == 1  # once per engine process
    validate([rec])


def test_it_keeps_configured_names_over_the_engines(engine: FakeVllm) -> None:
    scraper = ss.EngineScraper(_config(engine.url, model_version="llama-r7", kv_schema="kv-3"))
    scraper.poll(0.0)
    rec = scraper.poll(5.0)
    assert rec is not None and (rec["model_version"], rec["kv_schema"]) == ("llama-r7", "kv-3")


def test_it_makes_an_engines_names_fit_the_contract() -> None:
    assert ss.wire_name("meta-llama/Llama 3.1 (8B)") == "meta-llama/Llama_3.1__8B_"
    assert ss.wire_name("/m/" + "x" * 200) == "x" * 128  # the end of a long path
    assert ss.wire_name("") is None and ss.wire_name(None) is None


# -- bounded reads -----------------------------------------------------------------------


@pytest.fixture
def odd_server() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/big":
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"x" * 300_000)
            elif self.path == "/drip":
                self.send_response(200)
                self.end_headers()
                for _ in range(40):
                    self.wfile.write(b"x" * 10)
                    self.wfile.flush()
                    time.sleep(0.1)
            else:
                self.send_response(302)
                self.send_header("Location", "http://example.invalid/metrics")
                self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_it_reads_at_most_the_bytes_it_allows(odd_server: str) -> None:
    with pytest.raises(ss.ScrapeError, match="over 100000 bytes"):
        ss.http_get(odd_server + "/big", 5.0, 100_000)


def test_it_gives_up_on_an_answer_that_drips_past_its_deadline(odd_server: str) -> None:
    started = time.monotonic()
    with pytest.raises(ss.ScrapeError, match=r"took over 0\.5 s"):
        ss.http_get(odd_server + "/drip", 0.5, 100_000)
    assert time.monotonic() - started < 2.0


def test_it_does_not_follow_a_redirect_away_from_the_engine(odd_server: str) -> None:
    status, _ = ss.http_get(odd_server + "/metrics", 2.0, 1000)
    assert status == 302


# -- in the agent --------------------------------------------------------------------------


def test_the_agent_ships_the_engines_windows(
    short_dir: Path, stub: StubIngest, engine: FakeVllm
) -> None:
    cfg = Config(
        server=stub.url, token="t", node="node-1", state_dir=short_dir / "s", interval=0.2,
        action_poll_s=0, host_evidence=False,
        serving=[_config(engine.url, worker="vllm-0", interval=0.5)],
    )  # fmt: skip
    agent = Agent(cfg)
    thread = threading.Thread(target=agent.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        served = False
        while time.monotonic() < deadline:
            windows = [r for r in stub.records() if r["kind"] == "serving"]
            if not served and windows:
                _serve(engine, 7)
                served = True
            if any(w["window"]["requests"] == 7 for w in windows):
                break
            time.sleep(0.1)
    finally:
        agent.stop_event.set()
        thread.join(timeout=15)
    windows = [r for r in stub.records() if r["kind"] == "serving"]
    assert sum(w["window"]["requests"] for w in windows) == 7, windows
    assert {w["worker"] for w in windows} == {"vllm-0"} and stub.invalid == []


def test_check_says_which_engines_it_can_read(
    engine: FakeVllm, capsys: pytest.CaptureFixture[str], short_dir: Path
) -> None:
    from agents.cli import check

    dead = ss.parse_config([{"url": "http://127.0.0.1:9", "engine": "sglang", "group": "g",
                             "timeout": 0.5}], "n1")  # fmt: skip
    cfg = Config(dry_run=True, fake_gpus=1, state_dir=short_dir / "s",
                 serving=[_config(engine.url, worker="ok"), *dead])  # fmt: skip
    assert check(cfg) == 1
    out = capsys.readouterr().out
    assert f"serving: vllm at {engine.url} readable as chat/ok" in out
    assert "PROBLEM: serving n1:9 (http://127.0.0.1:9): metrics unreadable" in out


def test_one_engine_down_does_not_hold_up_another_on_the_same_node(engine: FakeVllm) -> None:
    down = _config("http://127.0.0.1:9", worker="down", interval=0.3, timeout=0.3)
    sent: list[dict[str, Any]] = []
    scraper = ss.ServingScraper([_config(engine.url, worker="up", interval=0.3), down],
                                sent.append)  # fmt: skip
    scraper.start()
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(sent) < 3:
            time.sleep(0.05)
    finally:
        scraper.stop()
    assert len(sent) >= 3 and {r["worker"] for r in sent} == {"up"}
    assert all(0.2 <= r["window"]["seconds"] <= 5.0 for r in sent)
