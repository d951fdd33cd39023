"""Every console page of a running `faultline demo`, in Debian chromium, as a person reads it.

One demo (4 nodes, the fast schedule) plays its faults until the on-call's quarantine waits
for two approvers and a recovery has been measured; then, on each page (fleet, groups,
incidents, node, approvals, audit, reliability):
- no ISO timestamp, no number with more than four significant digits, none above 9,999
  without separators, no markup in the title (tests/system/readable.py);
- axe-core (from the npm registry, pinned, cached under .faultline/test) finds no serious
  or critical violation;
- the charts scale to the group (the Plotly figures' own JSON), the ETTR chart's axis fits
  the days that reported and its legend clears the dates, no node badge wraps mid-word;
and an approver votes on the waiting action with the keyboard alone.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from faultline.embedded import free_port
from faultline.testing.service import BIN, Service, service_env, wait_for
from tests.system.readable import problems
from tests.system.test_browser_fleet import browser, login  # noqa: F401 - shared fixture

pytestmark = [pytest.mark.slow, pytest.mark.browser]

ARTIFACTS = Path("test-artifacts")
AXE_VERSION = "4.10.3"
AXE_SHA512 = (
    "Xm7bpRXnDSX2YE2YFfBk2FnF0ep6tmG7xPh8iHee8MIcrgq762Nkce856dYtJYLkuIoYZvGfTs/PbZhideTcEg=="
)
AXE_CACHE = Path(".faultline") / "test" / f"axe-core-{AXE_VERSION}"
WIDTH = 1440
APPROVER = ("appr-kb", "pw-appr-kb-12345")


def _axe_source() -> str:
    """axe.min.js of the pinned axe-core, fetched once with `npm pack` and checked."""
    cached = AXE_CACHE / "axe.min.js"
    if not cached.exists():
        npm = shutil.which("npm")
        if npm is None:
            pytest.skip("npm is not installed (apt-get install npm): axe-core comes from it")
        AXE_CACHE.mkdir(parents=True, exist_ok=True)
        pack = [npm, "pack", f"axe-core@{AXE_VERSION}", "--pack-destination", str(AXE_CACHE)]
        subprocess.run(pack, check=True, capture_output=True, timeout=300)
        tgz = AXE_CACHE / f"axe-core-{AXE_VERSION}.tgz"
        digest = base64.b64encode(hashlib.sha512(tgz.read_bytes()).digest()).decode()
        assert digest == AXE_SHA512, f"axe-core {AXE_VERSION} tarball does not match its pin"
        with tarfile.open(tgz) as tar:
            member = tar.extractfile("package/axe.min.js")
            assert member is not None
            cached.write_bytes(member.read())
    return cached.read_text()


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory):
    data = tmp_path_factory.mktemp("demo-console")
    port = free_port()
    ws_port = free_port(avoid=frozenset({port}))
    log = data / "demo.log"
    proc = subprocess.Popen(
        [str(BIN / "faultline"), "demo", "--nodes", "4", "--gpus", "8", "--schedule", "fast",
         "--port", str(port), "--ws-port", str(ws_port), "--data-dir", str(data)],
        env=service_env(data), stdout=open(log, "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
        start_new_session=True,
    )  # fmt: skip
    svc = Service(f"http://127.0.0.1:{port}", port, ws_port, data, proc, log)
    try:
        waiting = wait_for(
            lambda: [a for a in svc.api("/api/v1/actions/?state=proposed")["results"]
                     if a["kind"] == "quarantine_node"],
            180, "the on-call's quarantine to wait on the approvals page",
        )  # fmt: skip
        wait_for(
            lambda: [i for i in svc.api("/api/v1/reliability/?days=1")["incidents"]
                     if i["downtime_s"] is not None],
            180, "a measured recovery on the reliability record",
        )  # fmt: skip
        svc.cli("user", "create", APPROVER[0], "--role", "approver", "--password", APPROVER[1])
        yield svc, waiting[0]
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        ARTIFACTS.mkdir(exist_ok=True)
        shutil.copy(log, ARTIFACTS / "demo-console.log")


def _pages(svc: Service, action: dict[str, Any]) -> list[str]:
    incidents = svc.api("/api/v1/incidents/?limit=100")["results"]
    picked = {action["incident"]}
    for kind in ("xid", "collective_mismatch"):
        picked |= {i["id"] for i in incidents if i["kind"] == kind and i["group"]}
    node = action["target"].split(":", 1)[1]
    return [
        "/", "/groups/train-a/", "/groups/train-b/", "/groups/serve/", f"/nodes/{node}/",
        "/approvals/", "/audit/", "/reliability/?days=1",
        *(f"/incidents/{pk}/" for pk in sorted(p for p in picked if p)),
    ]  # fmt: skip


def _open(page: Any, svc: Service, path: str) -> None:
    page.goto(svc.url + path)
    page.wait_for_load_state("networkidle")
    # Charts draw from JSON fetched after load: wait for every chart container to draw
    # (a serving chart whose series is still empty may never; its page is checked as is).
    with contextlib.suppress(PlaywrightTimeout):
        page.wait_for_function(
            "() => [...document.querySelectorAll('.chart')].every("
            "c => c.querySelector('.main-svg') || c.querySelector('.empty'))",
            timeout=15_000,
        )


def test_every_page_reads_in_one_format(browser, demo):  # noqa: F811
    svc, action = demo
    page = browser.new_page(viewport={"width": WIDTH, "height": 900})
    login(page, svc)
    found: dict[str, list[str]] = {}
    shots = Path(os.environ.get("FAULTLINE_SHOTS", ARTIFACTS / "console"))
    shots.mkdir(parents=True, exist_ok=True)
    for path in _pages(svc, action):
        _open(page, svc, path)
        name = path.strip("/").replace("/", "-").split("?")[0] or "fleet"
        page.screenshot(path=str(shots / f"{name}.png"), full_page=True)
        if bad := problems(page):
            found[path] = bad
    assert found == {}


def test_axe_finds_no_serious_or_critical_violation(browser, demo):  # noqa: F811
    svc, action = demo
    source = _axe_source()
    # The console's CSP forbids inline scripts: axe is evaluated by the test, not the page.
    context = browser.new_context(viewport={"width": WIDTH, "height": 900}, bypass_csp=True)
    page = context.new_page()
    login(page, svc)
    found = {}
    for path in _pages(svc, action):
        _open(page, svc, path)
        page.evaluate(source)
        result = page.evaluate("() => axe.run(document, { resultTypes: ['violations'] })")
        bad = [
            f"{v['id']} ({v['impact']}): {v['help']} — {[n['target'] for n in v['nodes'][:3]]}"
            for v in result["violations"]
            if v["impact"] in ("serious", "critical")
        ]
        if bad:
            found[path] = bad
    context.close()
    assert found == {}


def test_an_approver_votes_with_the_keyboard_alone(browser, demo):  # noqa: F811
    svc, action = demo
    page = browser.new_page(viewport={"width": WIDTH, "height": 900})
    login(page, svc, APPROVER)
    page.goto(svc.url + "/approvals/")
    card = f'[data-action="{action["id"]}"]'
    page.wait_for_selector(card)
    # Tab from the top of the page to this card's Approve button; type a reason on the way.
    for _ in range(300):
        page.keyboard.press("Tab")
        focus = page.evaluate(
            "(card) => { const e = document.activeElement; return {"
            " inCard: !!e.closest(card), name: e.name || '', value: e.value || '',"
            " outline: getComputedStyle(e).outlineStyle } }",
            card,
        )
        if focus["inCard"] and focus["name"] == "reason":
            page.keyboard.type("checked the node's cooling logs")
        if focus["inCard"] and focus["value"] == "approve":
            assert focus["outline"] != "none"  # the focus is visible
            break
    else:
        pytest.fail("Tab never reached the waiting action's Approve button")
    page.keyboard.press("Enter")
    page.wait_for_load_state("networkidle")
    detail = svc.api(f"/api/v1/actions/{action['id']}/")
    assert [(v["user"], v["decision"]) for v in detail["votes"]] == [(APPROVER[0], "approve")]
    assert detail["state"] == "proposed" and detail["approvals_required"] == 2
    # Back on the page, which says so (the card left "waiting for you": this approver voted).
    said = page.inner_text(".messages")
    assert f"action {action['id']} is proposed" in said and "1 of 2 approvals" in said


def test_charts_scale_to_the_group_and_fit_their_data(browser, demo):  # noqa: F811
    svc, _ = demo
    page = browser.new_page(viewport={"width": WIDTH, "height": 900})
    login(page, svc)
    _open(page, svc, "/groups/train-a/")
    fig = page.evaluate(
        "() => { const h = document.getElementById('chart-heatmap'),"
        " p = document.getElementById('chart-percentiles');"
        " return { heat: h.data[0], py: p.layout.yaxis, shapes: p.layout.shapes } }"
    )
    scale = svc.api("/api/v1/pages/groups/train-a/charts/")["scale"]
    heat = fig["heat"]
    assert heat["zauto"] is False and (heat["zmin"], heat["zmax"]) == (scale["zmin"], scale["zmax"])
    assert heat["colorscale"] == scale["colorscale"]
    # The group's own median and straggler limit, with at least the limit's span around it.
    assert scale["zmin"] <= scale["median_ms"] < scale["limit_ms"] <= scale["zmax"]
    assert scale["zmax"] - scale["median_ms"] >= 2 * (scale["limit_ms"] - scale["median_ms"]) - 1e-9
    lo, hi = fig["py"]["range"]
    assert lo <= scale["median_ms"] and hi >= scale["limit_ms"]
    assert sorted(s["y0"] for s in fig["shapes"]) == [scale["median_ms"], scale["limit_ms"]]

    _open(page, svc, "/reliability/?days=30")
    ticks = page.evaluate(
        "() => [...document.querySelectorAll('#chart-days .xtick text')].map(t => {"
        " const b = t.getBoundingClientRect(); return [t.textContent, b.top, b.bottom] })"
    )
    legend = page.evaluate(
        "() => { const b = document.querySelector('#chart-days .legend').getBoundingClientRect();"
        " return [b.top, b.bottom] }"
    )
    days = [d for d in svc.api("/api/v1/reliability/?days=30")["per_day"] if d["observed"]]
    assert 1 <= len(ticks) <= len(days) + 1, ticks  # a demo of minutes: one day, not 30
    assert all(bottom <= legend[0] or top >= legend[1] for _, top, bottom in ticks)

    _open(page, svc, "/")
    wrapped = page.evaluate(
        "() => [...document.querySelectorAll('#nodes .flag, #nodes .badge')]"
        ".filter(e => e.getClientRects().length > 1 ||"
        " e.getBoundingClientRect().height > 2 * parseFloat(getComputedStyle(e).fontSize))"
        ".map(e => e.textContent)"
    )
    assert wrapped == []
