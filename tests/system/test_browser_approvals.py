"""The approve flow in Debian chromium: an approver approves, a viewer cannot."""

from __future__ import annotations

import base64
import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.system.test_browser_fleet import browser, login  # noqa: F401 - shared fixture

pytestmark = [pytest.mark.slow, pytest.mark.browser]

ARTIFACTS = Path("test-artifacts")
PEOPLE = {"op-pw": "operator", "appr-pw": "approver", "view-pw": "viewer"}


def _password(name: str) -> str:
    return f"pw-{name}-12345"


def _propose(service: Any, node: str) -> int:
    auth = base64.b64encode(f"op-pw:{_password('op-pw')}".encode()).decode()
    body = json.dumps({"kind": "cordon_node", "target": f"node:{node}",
                       "reason": "Xid 79 twice this hour"}).encode()  # fmt: skip
    request = urllib.request.Request(
        service.url + "/api/v1/actions/", data=body, method="POST",
        headers={"Authorization": f"Basic {auth}", "Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=10) as response:
        return int(json.loads(response.read())["action"]["id"])


def test_it_lets_an_approver_approve_and_shows_a_viewer_no_buttons(browser, service):  # noqa: F811
    for name, role in PEOPLE.items():
        service.cli("user", "create", name, "--role", role, "--password", _password(name))
    service.start_agent("node-approve")  # the target must be a known node
    import time

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        nodes = service.api("/api/v1/nodes/")["results"]
        if any(n["name"] == "node-approve" for n in nodes):
            break
        time.sleep(0.3)
    action_id = _propose(service, "node-approve")

    viewer = browser.new_page()
    login(viewer, service, ("view-pw", _password("view-pw")))
    viewer.goto(service.url + "/approvals/")
    assert viewer.locator(f'[data-action="{action_id}"]').count() in (0, 1)
    assert viewer.locator("button[value=approve]").count() == 0

    page = browser.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    login(page, service, ("appr-pw", _password("appr-pw")))
    page.goto(service.url + "/approvals/")
    card = page.locator(f'[data-action="{action_id}"]')
    card.wait_for(timeout=10_000)
    assert "Blast radius" in card.inner_text()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "approvals.png"), full_page=True)
    card.locator("button[value=approve]").click()
    page.wait_for_load_state()
    detail = service.api(f"/api/v1/actions/{action_id}/")
    # One approval carries it unless the blast-radius gate asked for two distinct approvers.
    assert [v["decision"] for v in detail["votes"]] == ["approve"]
    if detail["approvals_required"] == 1:
        assert detail["state"] in {"approved", "dispatched", "acknowledged", "succeeded"}
    else:
        assert detail["state"] == "proposed"
    assert errors == []
