"""Fleet, group and incident pages in Debian chromium against a real `faultline up`.

An agent token posts a training group's history, then an Xid with every other rank
blocked in all_reduce; the Celery worker diagnoses it and the incident must appear on
the already-open fleet and group pages without a reload, then render root cause first
with its symptoms folded under it.
"""

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
GROUP = "pw-train"
NODE = "node-pw"
RANKS = 4


def _post(service: Any, token: str, records: list[dict[str, Any]], sent_at: datetime) -> None:
    body = json.dumps(make_batch(records, node=NODE, sent_at=sent_at)).encode()
    request = urllib.request.Request(
        service.url + "/api/v1/ingest", data=body, method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 202


def _history(start: datetime, steps: int) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = [
        {"kind": "transition", "group": GROUP, "generation": 1, "from_state": "initializing",
         "to_state": "running", "restart_count": 0, "world_size": RANKS, "ts": iso(start)},
    ]  # fmt: skip
    for rank in range(RANKS):
        gpu = f"GPU-pw-{rank}"
        records += [
            {"kind": "process", "group": GROUP, "generation": 1, "rank": rank,
             "event": "started", "pid": 100 + rank, "gpu": gpu, "ts": iso(start)},
            {"kind": "device_sample", "gpu": gpu, "index": rank, "temp_c": 60.0,
             "ts": iso(start)},
        ]  # fmt: skip
        records += [
            {"kind": "step", "group": GROUP, "generation": 1, "rank": rank, "step": s,
             "tokens": 2048, "duration_ms": 1000.0, "loss": 2.5,
             "phases": {"compute": 700.0, "collective": 250.0, "input": 50.0},
             "ts": iso(start + timedelta(seconds=s))}
            for s in range(steps)
        ]  # fmt: skip
    return records


def _xid(at: datetime) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = [
        {"kind": "device_event", "gpu": "GPU-pw-1", "event": "xid", "code": 79, "ts": iso(at)}
    ]
    for rank in range(RANKS):
        if rank == 1:
            continue  # the rank on the lost GPU never enters the collective
        entry = {"seq": 21, "pg": "0", "op": "all_reduce", "numel": 1024, "dtype": "bfloat16",
                 "state": "started", "started_ts": iso(at)}  # fmt: skip
        records.append(
            {"kind": "collective", "group": GROUP, "generation": 1, "rank": rank,
             "entries": [entry], "ts": iso(at)}
        )  # fmt: skip
    return records


def _watch(page: Any) -> list[str]:
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    return errors


def test_it_shows_a_new_incident_live_then_its_root_cause_and_symptoms(browser, service):  # noqa: F811
    token = service.token(NODE)
    now = datetime.now(UTC)
    start = now - timedelta(seconds=40)
    _post(service, token, _history(start, 20), sent_at=now)

    context = browser.new_context(viewport={"width": 1400, "height": 1000})  # one session
    fleet = context.new_page()
    fleet_errors = _watch(fleet)
    login(fleet, service)
    fleet.wait_for_selector("body[data-live=up]", timeout=10_000)
    fleet.evaluate("window.__noReload = true")

    group = context.new_page()
    group_errors = _watch(group)
    group.goto(f"{service.url}/groups/{GROUP}/")
    group.wait_for_selector("body[data-live=up]", timeout=10_000)
    group.wait_for_selector("#chart-heatmap .main-svg", timeout=15_000)  # Plotly drew it
    group.evaluate("window.__noReload = true")

    _post(service, token, _xid(start + timedelta(seconds=21)), sent_at=datetime.now(UTC))

    xid_row = '#incident-rows tr:has(code:text-is("xid"))'
    fleet.wait_for_selector(xid_row, timeout=30_000)
    group.wait_for_selector(xid_row, timeout=30_000)
    assert fleet.evaluate("window.__noReload") is True  # same documents: no reload
    assert group.evaluate("window.__noReload") is True
    ARTIFACTS.mkdir(exist_ok=True)
    fleet.screenshot(path=str(ARTIFACTS / "pages-fleet.png"), full_page=True)
    group.screenshot(path=str(ARTIFACTS / "pages-group.png"), full_page=True)

    group.click(f"{xid_row} a[href^='/incidents/']")
    group.wait_for_selector("#incident-page")
    incident_errors = _watch(group)
    assert "xid" in group.inner_text("#incident-page code >> nth=0")
    group.wait_for_selector("#symptoms details.fold", timeout=20_000)
    assert int(group.inner_text("#symptom-total")) >= 1
    assert "explained by root cause xid" in group.inner_text("#symptoms")
    group.screenshot(path=str(ARTIFACTS / "pages-incident.png"), full_page=True)
    assert fleet_errors == [] and group_errors == [] and incident_errors == []


def test_it_lets_an_admin_acknowledge_from_the_incident_page(browser, service):  # noqa: F811
    incidents = service.api(f"/api/v1/incidents/?group={GROUP}&state=open")["results"]
    if not incidents:
        pytest.skip("needs the incident from the previous test")
    page = browser.new_page()
    errors = _watch(page)
    login(page, service)
    page.goto(f"{service.url}/incidents/{incidents[0]['id']}/")
    page.wait_for_selector("body[data-live=up]", timeout=10_000)
    page.focus("#ack-button")
    page.keyboard.press("Enter")  # keyboard-reachable
    page.wait_for_selector("#incident-state:text-is('acknowledged')", timeout=10_000)
    assert "acknowledged" in page.inner_text("#timeline")
    assert errors == []


REL_GROUP, REL_NODE = "pw-rel", "node-rel"


def _post_as(service: Any, token: str, node: str, records: list[dict[str, Any]]) -> None:
    body = json.dumps(make_batch(records, node=node, sent_at=datetime.now(UTC))).encode()
    request = urllib.request.Request(
        service.url + "/api/v1/ingest", data=body, method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 202


def _rel_step(gen: int, rank: int, step: int, ts: datetime) -> dict[str, Any]:
    return {"kind": "step", "group": REL_GROUP, "generation": gen, "rank": rank, "step": step,
            "tokens": 1000, "data_cursor": step * 2000, "loss": 2.0, "ts": iso(ts)}  # fmt: skip


def _rel_transition(gen: int, frm: str, to: str, ts: datetime) -> dict[str, Any]:
    return {"kind": "transition", "group": REL_GROUP, "generation": gen, "from_state": frm,
            "to_state": to, "world_size": 2, "ts": iso(ts)}  # fmt: skip


def test_it_draws_the_reliability_records_charts(browser, service):  # noqa: F811
    """A killed rank, a restart from step 20 through ingest: one interruption, drawn."""
    import time

    token = service.token(REL_NODE)
    start = datetime.now(UTC) - timedelta(seconds=60)
    at = lambda s: start + timedelta(seconds=s)  # noqa: E731
    history = [_rel_transition(1, "initializing", "running", start)]
    history += [
        {"kind": "process", "group": REL_GROUP, "generation": 1, "rank": r, "event": "started",
         "pid": 200 + r, "gpu": f"GPU-rel-{r}", "ts": iso(start)}
        for r in range(2)
    ]  # fmt: skip
    history += [_rel_step(1, r, s, at(s)) for s in range(1, 26) for r in range(2)]
    history.append(
        {"kind": "checkpoint", "group": REL_GROUP, "generation": 1, "checkpoint_id": "rel-20",
         "step": 20, "phase": "committed", "ts": iso(at(20.5)),
         "manifest": {"shards": [{"path": "s0.bin", "bytes": 10, "sha256": "0" * 64}],
                      "total_bytes": 10, "format": "manifest"}, "data_cursor": 40000}
    )  # fmt: skip
    history.append(
        {"kind": "process", "group": REL_GROUP, "generation": 1, "rank": 1, "event": "exited",
         "pid": 201, "exit_code": 137, "signal": 9, "reason": "killed", "ts": iso(at(26))}
    )  # fmt: skip
    _post_as(service, token, REL_NODE, history)
    deadline = time.monotonic() + 30
    while not service.api(f"/api/v1/incidents/?group={REL_GROUP}")["results"]:
        assert time.monotonic() < deadline, "the killed rank never opened an incident"
        time.sleep(0.5)
    now = datetime.now(UTC)
    restart = [
        _rel_transition(1, "running", "quiescing", now),
        _rel_transition(1, "quiescing", "recovering", now + timedelta(milliseconds=100)),
        _rel_transition(2, "recovering", "running", now + timedelta(milliseconds=200)),
    ]
    restart += [
        _rel_step(2, r, s, now + timedelta(milliseconds=300 + 50 * (s - 21)))
        for s in range(21, 31)
        for r in range(2)
    ]
    time.sleep(1.0)  # every record above is in the past when it arrives
    _post_as(service, token, REL_NODE, restart)
    deadline = time.monotonic() + 30
    while not service.api("/api/v1/reliability/?days=1")["interruptions"]:
        assert time.monotonic() < deadline, "the restart never made an interruption"
        time.sleep(0.5)

    page = browser.new_page()
    errors = _watch(page)
    login(page, service)
    page.goto(service.url + "/reliability/?days=1")
    page.wait_for_selector('#reliability-page[data-drawn="1"]', timeout=15_000)
    for chart in ("chart-layers", "chart-days"):
        page.wait_for_selector(f"#{chart} .main-svg", timeout=10_000)
    assert page.locator("#chart-layers .bars .point").count() >= 1  # a bar was drawn
    assert page.locator('#by-layer tr[data-layer="software"]').count() == 1  # process_exit
    assert page.locator("#interruptions tr[data-incident]").count() >= 1
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "reliability.png"), full_page=True)
    assert errors == []
    page.close()
