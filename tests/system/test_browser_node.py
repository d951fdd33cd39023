"""The node page and the fleet's hardware filter in Debian chromium, against `faultline up`.

A spare node reports an Xid 48 through the real ingest endpoint with its own token: the
fleet page filtered to "out of service" shows it faulted with its reason, a healthy node
is filtered out, and its node page shows the GPU faulted and the fault on its timeline.
"""

from __future__ import annotations

import json
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.system.test_browser_fleet import ARTIFACTS, browser, login  # noqa: F401 - fixture

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def _post(service, token: str, node: str, seq: int, records: list[dict]) -> None:
    now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    for r in records:
        r.setdefault("ts", now)
    body = {"agent": {"id": f"agent-{node}", "node": node, "version": "test", "boot_id": "b1"},
            "seq": seq, "sent_at": now, "records": records}  # fmt: skip
    req = urllib.request.Request(
        service.url + "/api/v1/ingest", data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 202


def _sample(node: str, index: int) -> dict:
    return {"kind": "device_sample", "gpu": f"GPU-{node}-{index}", "index": index,
            "temp_c": 50.0, "util_pct": 0.0}  # fmt: skip


def test_it_shows_a_faulted_spare_under_the_out_of_service_filter_and_on_its_page(
    browser,  # noqa: F811 - the fixture
    service,
):
    bad, good = "spare-rma", "spare-ok"
    tokens = {n: service.token(n) for n in (bad, good)}
    _post(service, tokens[good], good, 1, [_sample(good, 0)])
    _post(service, tokens[bad], bad, 1, [_sample(bad, 0), _sample(bad, 1)])
    _post(service, tokens[bad], bad, 2, [
        {"kind": "device_event", "gpu": f"GPU-{bad}-1", "event": "xid", "code": 48,
         "detail": "double-bit ECC"}])  # fmt: skip
    _post(service, tokens[bad], bad, 3, [_sample(bad, 0), _sample(bad, 1)])  # clean: still out

    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    login(page, service)
    page.goto(service.url + "/?hardware=out_of_service")
    card = page.locator(f'[data-node="{bad}"]')
    card.wait_for(timeout=10_000)
    assert card.get_attribute("data-lifecycle") == "faulted"
    assert "Xid 48" in card.locator(".node-reason").inner_text()
    assert page.locator(f'[data-node="{good}"]').count() == 0
    assert page.locator("#hardware-filter").input_value() == "out_of_service"

    card.locator(f'a:text("{bad}")').click()
    page.wait_for_url(f"{service.url}/nodes/{bad}/")
    assert page.locator('[data-field="lifecycle"]').inner_text() == "faulted"
    gpu_row = page.locator(f'#gpu-rows tr[data-gpu="GPU-{bad}-1"]')
    assert "faulted" in gpu_row.inner_text()
    assert page.locator('#history li[data-kind="fault"]').count() == 2  # the GPU and the node
    assert page.locator("#node-incidents tr[data-incident]").count() == 1
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(Path(ARTIFACTS) / "node.png"), full_page=True)
    assert errors == []
