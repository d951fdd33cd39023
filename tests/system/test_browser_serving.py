"""The serving group page in Debian chromium: G_serve, latency, versions, workers, live."""

from __future__ import annotations

import json
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import iso, make_batch
from tests.system.test_browser_fleet import browser, login  # noqa: F401 - shared fixture

pytestmark = [pytest.mark.slow, pytest.mark.browser]

ARTIFACTS = Path("test-artifacts")
GROUP = "pw-chat"
NODE = "node-serve"


def _post(service: Any, token: str, records: list[dict[str, Any]]) -> None:
    body = json.dumps(make_batch(records, node=NODE)).encode()
    request = urllib.request.Request(
        service.url + "/api/v1/ingest", data=body, method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 202


def _window(ts: datetime, worker: str, model: str, *, met: int) -> dict[str, Any]:
    return {"kind": "serving", "group": GROUP, "worker": worker, "model_version": model,
            "kv_schema": "kv-3", "ready": True, "draining": False, "ts": iso(ts),
            "window": {"seconds": 10, "requests": 500, "slo_met": met, "ttft_ms_p99": 800.0,
                       "tpot_ms_p99": 60.0, "kv_used_pct": 55.0, "active": 20}}  # fmt: skip


def test_it_shows_g_serve_versions_and_workers_and_updates_live(browser, service):  # noqa: F811
    token = service.token(NODE)
    start = datetime.now(UTC) - timedelta(minutes=3)
    history = [
        _window(start + timedelta(seconds=10 * i), f"w{w}", "m-7", met=498)
        for i in range(12) for w in range(2)
    ]  # fmt: skip
    _post(service, token, history)

    page = browser.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    login(page, service)
    page.goto(f"{service.url}/groups/{GROUP}/")
    page.wait_for_selector('#version-rows tr[data-version="m-7"]', timeout=15_000)
    page.wait_for_selector("#chart-gserve .main-svg", timeout=15_000)
    page.wait_for_selector("body[data-live=up]", timeout=10_000)
    page.evaluate("window.__noReload = true")

    # A canary appears and breaches: its version row and an incident arrive without reload.
    _post(service, token, [_window(datetime.now(UTC), "w2", "m-8", met=300)])
    page.wait_for_selector('#version-rows tr[data-version="m-8"]', timeout=20_000)
    page.wait_for_selector("#incident-rows tr[data-incident]", timeout=20_000)

    assert page.evaluate("window.__noReload") is True
    assert page.locator("#worker-rows tr[data-worker]").count() == 3
    assert "TTFT ≤ 2,000 ms" in page.inner_text("#slo-note")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "serving.png"), full_page=True)
    assert errors == []
