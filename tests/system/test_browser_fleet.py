"""The fleet page in Debian chromium: a new node appears live, without a reload."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.system.conftest import ADMIN

pytestmark = [pytest.mark.slow, pytest.mark.browser]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path("test-artifacts")


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian chromium is not installed (apt-get install chromium)")
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"],
        )  # fmt: skip
        yield b
        b.close()


def login(page, service, who=ADMIN):
    page.goto(service.url + "/login/")
    page.fill("input[name=username]", who[0])
    page.fill("input[name=password]", who[1])
    page.click("button[type=submit]")
    page.wait_for_url(service.url + "/")


def test_it_shows_a_new_node_appear_live_without_reloading(browser, service):
    page = browser.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    login(page, service)
    page.wait_for_selector("body[data-live=up]", timeout=10_000)
    page.evaluate("window.__noReload = true")

    service.start_agent("node-live")
    page.wait_for_selector('[data-node="node-live"] .gpu >> nth=7', timeout=20_000)

    assert page.evaluate("window.__noReload") is True  # same document: no reload happened
    assert page.locator('[data-node="node-live"] .gpu').count() == 8
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "fleet.png"), full_page=True)
    assert errors == []


def test_it_sends_anonymous_visitors_to_the_login_page(browser, service):
    page = browser.new_page()
    page.goto(service.url + "/")
    assert page.url.startswith(service.url + "/login/")
