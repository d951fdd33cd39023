"""Serving groups through real ingest: SLO goodput, readiness and version contracts."""

from __future__ import annotations

from typing import Any

import pytest

from tests.server.scenarios.timeline import Timeline, only

pytestmark = pytest.mark.django_db

GROUP = "chat"


def window(**fields: Any) -> dict[str, Any]:
    base = {"seconds": 10, "requests": 500, "slo_met": 498, "ttft_ms_p50": 180.0,
            "ttft_ms_p99": 900.0, "tpot_ms_p50": 30.0, "tpot_ms_p99": 60.0,
            "e2e_ms_p99": 9000.0, "queued": 3, "active": 40, "kv_used_pct": 60.0}  # fmt: skip
    return {**base, **fields}


def serving(t: Timeline, at: float, worker: str, *, model: str = "m-7", **fields: Any) -> None:
    rec = {"kind": "serving", "group": GROUP, "worker": worker, "model_version": model,
           "adapter_version": None, "kv_schema": "kv-3", "ready": True, "draining": False,
           "window": window()}  # fmt: skip
    for key in ("ready", "draining", "kv_schema", "model_version"):
        if key in fields:
            rec[key] = fields.pop(key)
    rec["window"] = window(**fields)
    t.add(f"node-{worker[-1]}", t.at(at), rec)


@pytest.fixture
def fleet(post_batch) -> Timeline:
    t = Timeline(post=post_batch, group=GROUP)
    t.add("node-0", t.at(0), {"kind": "transition", "group": GROUP, "generation": 1,
                              "to_state": "running", "model_version": "m-7"})  # fmt: skip
    for i in range(0, 60, 10):
        for w in ("w0", "w1", "w2"):
            serving(t, i, w)
    t.heartbeats(until=70)
    return t


def test_it_raises_nothing_for_a_healthy_fleet(fleet):
    assert fleet.diagnose(at=61) == []


def test_it_links_an_slo_breach_to_kv_pressure(fleet):
    serving(fleet, 60, "w1", slo_met=300, ttft_ms_p99=4200.0, kv_used_pct=99.0, evictions=50,
            preempted=40)  # fmt: skip
    incident = only(fleet.diagnose(at=61))
    assert (incident.kind, incident.subject) == ("slo_breach", f"worker:{GROUP}/w1")
    assert "KV cache pressure" in incident.root_cause["evidence"]["likely_cause"]
    assert "ttft_ms_p99 4200 ms > 2000 ms" in incident.root_cause["evidence"]["breached"]


def test_it_names_a_breaching_canary_and_refuses_automatic_promotion(fleet):
    serving(fleet, 60, "w2", model_version="m-8", slo_met=350, e2e_ms_p99=70000.0)
    incident = only(fleet.diagnose(at=61))
    assert incident.kind == "slo_breach"
    assert "version canary m-8" in incident.root_cause["evidence"]["likely_cause"]
    assert incident.recovery["auto_restart_safe"] is False


def test_it_catches_a_worker_ready_before_its_model_is_loaded(fleet):
    serving(fleet, 60, "w0", model_version=None, requests=0, slo_met=0)
    incident = only(fleet.diagnose(at=61))
    assert (incident.kind, incident.subject) == ("ready_before_loaded", f"worker:{GROUP}/w0")


def test_it_catches_traffic_on_a_draining_worker(fleet):
    serving(fleet, 60, "w1", draining=True, ready=False, requests=20, slo_met=20)
    assert only(fleet.diagnose(at=61)).kind == "drained_worker_traffic"


def test_it_catches_a_worker_still_on_the_previous_model_after_a_rollout(fleet):
    fleet.add("node-0", fleet.at(60), {"kind": "transition", "group": GROUP, "generation": 1,
                                       "to_state": "running", "model_version": "m-8"})  # fmt: skip
    serving(fleet, 61, "w0", model_version="m-8")
    serving(fleet, 61, "w1", model_version="m-8")
    serving(fleet, 61, "w2", model_version="m-7")
    incident = only(fleet.diagnose(at=62))
    assert (incident.kind, incident.subject) == ("stale_version", f"worker:{GROUP}/w2")


def test_it_catches_duplicate_streamed_tokens_and_retry_storms(fleet):
    serving(fleet, 60, "w0", duplicate_tokens=12)
    serving(fleet, 60, "w1", retries=200)
    kinds = sorted(i.kind for i in fleet.diagnose(at=61))
    assert kinds == ["duplicate_finish", "retry_storm"]


def test_it_counts_in_flight_requests_of_a_worker_that_vanished_as_lost(post_batch):
    t = Timeline(post=post_batch, group=GROUP)
    for i in range(0, 30, 10):
        for w in ("w0", "w1"):
            serving(t, i, w)
    for i in range(30, 100, 10):
        serving(t, i, "w0")  # w1 stops reporting at 20 s holding 43 requests
    t.heartbeats(until=100)
    incident = only(t.diagnose(at=100))
    assert (incident.kind, incident.subject) == ("worker_lost", f"worker:{GROUP}/w1")
    assert incident.root_cause["evidence"]["lost_requests"] == 43


def test_it_serves_the_slo_and_the_version_split_over_the_api(fleet, client, cast):
    serving(fleet, 60, "w2", model_version="m-8", slo_met=350)
    fleet.diagnose(at=61)
    client.force_login(cast["viewer"])
    overview = client.get(f"/api/v1/groups/{GROUP}/serving/").json()
    shares = {v["version"]: v for v in overview["versions"]}
    assert set(shares) == {"m-7", "m-8"}
    assert shares["m-8"]["slo_met_ratio"] == 0.7
    assert abs(sum(v["traffic_share"] for v in shares.values()) - 1) < 1e-6
    assert {w["worker"] for w in overview["workers"]} == {"w0", "w1", "w2"}
    assert overview["slo"]["goodput_target"] == 0.95


def test_it_lets_operators_change_the_slo_and_refuses_viewers_and_bad_values(fleet, client, cast):
    fleet.send()
    url = f"/api/v1/groups/{GROUP}/slo/"
    client.force_login(cast["viewer"])
    assert client.put(url, {"ttft_ms_p99": 500}, content_type="application/json").status_code == 403
    client.force_login(cast["operator"])
    bad = client.put(url, {"ttft_ms_p99": "fast"}, content_type="application/json")
    assert bad.status_code == 400 and "ttft_ms_p99 must be a number" in bad.json()["error"]
    unknown = client.put(url, {"latency": 5}, content_type="application/json")
    assert unknown.status_code == 400 and "unknown SLO key" in unknown.json()["error"]
    ok = client.put(url, {"ttft_ms_p99": 500, "goodput_target": 0.99},
                    content_type="application/json")  # fmt: skip
    assert ok.status_code == 200
    assert ok.json() == {"ttft_ms_p99": 500.0, "tpot_ms_p99": 150.0, "e2e_ms_p99": 60000.0,
                         "goodput_target": 0.99}  # fmt: skip
    # With the tighter SLO the healthy fleet's 900 ms p99 TTFT now breaches.
    incidents = fleet.diagnose(at=61)
    assert {i.kind for i in incidents} == {"slo_breach"}


def test_it_refuses_anonymous_callers_on_serving_endpoints(fleet, client):
    fleet.send()
    assert client.get(f"/api/v1/groups/{GROUP}/serving/").status_code == 401
    assert client.get(f"/api/v1/groups/{GROUP}/slo/").status_code == 401


def test_a_launcher_reported_exit_names_the_worker_within_a_second(post_batch):
    from agents import protocol

    t = Timeline(post=post_batch, group=GROUP)
    for i in range(0, 20):
        for w in ("w0", "w1"):
            serving(t, i, w, seconds=1)
    # The launcher saw w1's process exit at 19.5 s: a serving window with `exited`.
    exit_window = {"seconds": 1.0, "active": 2, "queued": 1, "exited": True, "exit_code": 137}
    protocol.ServingWindowStats(**exit_window)  # the contract carries it
    t.add("node-1", t.at(19.5), {"kind": "serving", "group": GROUP, "worker": "w1",
                                 "ready": False, "window": exit_window})  # fmt: skip
    t.heartbeats(until=20)
    incident = only(t.diagnose(at=20))  # 0.5 s after the exit; w0 is not blamed
    assert (incident.kind, incident.subject) == ("worker_lost", f"worker:{GROUP}/w1")
    assert incident.root_cause["evidence"]["lost_requests"] == 3
    assert incident.root_cause["evidence"]["exit_code"] == 137


def test_a_rolled_back_workers_stale_version_clears_on_its_next_window(fleet):
    serving(fleet, 60, "w0")
    serving(fleet, 60, "w1")
    serving(fleet, 60, "w2", kv_schema="kv-2")  # its same-model peers serve kv-3
    incident = only(fleet.diagnose(at=61))
    assert incident.kind == "stale_version"
    for w in ("w0", "w1", "w2"):
        serving(fleet, 62, w)  # rolled back: the next window shows kv-3
    assert fleet.diagnose(at=62.5) == [incident]  # the incident settles (flap damping)...
    assert not incident.alerts.filter(active=True).exists()  # ...its finding is gone now
    serving(fleet, 63, "w2", kv_schema="kv-2")  # and comes back if the mismatch does
    assert fleet.diagnose(at=63.5) == [incident]
    assert incident.alerts.filter(active=True, kind="stale_version").exists()
