"""Serving groups' states (serving, degraded, down, initializing) through real ingest."""

from __future__ import annotations

import pytest

from console.models import ConsistencyGroup
from console.serving import serving_state_of
from tests.server.scenarios.test_serving import GROUP, fleet, serving  # noqa: F401
from tests.server.scenarios.timeline import Timeline

pytestmark = pytest.mark.django_db


def state_of() -> dict:
    state = serving_state_of(ConsistencyGroup.objects.get(name=GROUP))
    assert state is not None
    return state


def test_it_is_initializing_before_the_first_window(post_batch):
    t = Timeline(post=post_batch, group=GROUP)
    t.add("node-0", t.at(0), {"kind": "transition", "group": GROUP, "generation": 1,
                              "to_state": "running", "model_version": "m-7"})  # fmt: skip
    t.send()
    group = ConsistencyGroup.objects.get(name=GROUP)
    group.kind = "serving"
    group.save(update_fields=["kind"])
    t.diagnose(at=1)
    assert state_of()["state"] == "initializing"


def test_it_is_serving_when_every_worker_is_ready_within_slo(fleet):  # noqa: F811
    fleet.diagnose(at=61)
    assert state_of() | {"reason": ""} == {"state": "serving", "reason": "", "workers": 3,
                                           "ready": 3, "breaching": 0}  # fmt: skip


def test_it_is_degraded_when_a_worker_breaches_the_slo(fleet):  # noqa: F811
    serving(fleet, 60, "w1", slo_met=300, ttft_ms_p99=4200.0)
    fleet.diagnose(at=61)
    s = state_of()
    assert (s["state"], s["breaching"], s["ready"]) == ("degraded", 1, 3)
    assert "w1" in s["reason"]


def test_it_is_degraded_when_a_worker_is_not_ready(fleet):  # noqa: F811
    serving(fleet, 60, "w2", ready=False, requests=0, slo_met=0)
    fleet.diagnose(at=61)
    assert (state_of()["state"], state_of()["ready"]) == ("degraded", 2)


def test_it_is_down_when_no_worker_is_ready(fleet):  # noqa: F811
    for w in ("w0", "w1", "w2"):
        serving(fleet, 60, w, ready=False, draining=True, requests=0, slo_met=0)
    fleet.diagnose(at=61)
    assert state_of()["state"] == "down"


def test_it_is_down_when_every_worker_went_silent(fleet):  # noqa: F811
    fleet.diagnose(at=200)
    assert state_of()["state"] == "down"


def test_it_shows_the_serving_state_in_rest_and_on_the_page(fleet, admin_client):  # noqa: F811
    serving(fleet, 60, "w1", slo_met=300, ttft_ms_p99=4200.0)
    fleet.diagnose(at=61)
    body = admin_client.get(f"/api/v1/groups/{GROUP}/").json()
    assert body["serving_state"]["state"] == "degraded"
    page = admin_client.get(f"/groups/{GROUP}/").content.decode()
    assert 'data-field="state">degraded<' in page
    assert 'data-field="workers_ready">3 / 3<' in page
