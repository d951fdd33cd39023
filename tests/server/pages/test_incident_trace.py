"""The incident page's correlation view: the one step a rank's incident is about,
its records and collective calls on every rank beside it joined by `step_id`; and the
request-id range of a worker's incident. Records go through real ingest and incidents
come from the real pipeline (tests.server.scenarios.timeline)."""

from __future__ import annotations

import re

import pytest

from agents.wire import parse_step_id, step_id
from console.diagnosis.findings import culprit_of
from tests.server.scenarios.test_serving import GROUP, serving
from tests.server.scenarios.timeline import HEALTHY_S, Timeline, healthy_job, only

pytestmark = pytest.mark.django_db


def _page(client, cast, incident) -> str:
    client.force_login(cast["viewer"])
    response = client.get(f"/incidents/{incident.pk}/")
    assert response.status_code == 200
    return response.content.decode()


def _row(html: str, rank: int) -> str:
    match = re.search(rf'<tr data-rank="{rank}"[^>]*>(.*?)</tr>', html, re.S)
    assert match, f"no trace row for rank {rank}"
    return match.group(1)


def _stepped_waits(t: Timeline, *, step: int, entered: list[int], **odd) -> None:
    """Ranks in `entered` started step `step`'s all_reduce (seq = step) and wait in it."""
    tagged = {str(r): {"step_id": step_id(1, step), **odd.get(str(r), {})} for r in entered}
    t.collectives(seq=step, at=HEALTHY_S + 1, entered=entered, **tagged)


def test_a_ranks_exception_shows_the_step_it_died_in_across_the_ranks(post_batch, client, cast):
    t = healthy_job(post_batch)  # steps 0..29 on 8 ranks
    t.add(t.node(2), t.at(HEALTHY_S + 0.5), {
        "kind": "process", "group": t.group, "generation": 1, "rank": 2, "event": "exited",
        "gpu": t.gpu(2), "exit_code": 1, "reason": "exception",
        "error_type": "RuntimeError"})  # fmt: skip
    _stepped_waits(t, step=HEALTHY_S, entered=[r for r in range(8) if r != 2])
    incident = only(t.diagnose(at=HEALTHY_S + 10))
    assert (incident.kind, incident.subject) == ("exception", f"rank:{t.group}/2")

    html = _page(client, cast, incident)
    assert 'id="trace" data-kind="rank"' in html
    assert f'<code data-field="step_id">{step_id(1, HEALTHY_S)}</code>' in html
    assert "the step after its last reported one" in html
    culprit = _row(html, 2)
    assert "← this incident" in culprit and "not finished" in culprit
    assert "none reported" in culprit  # it never entered the step's all_reduce
    for peer in (0, 1, 3, 7):
        row = _row(html, peer)
        assert f'data-call="all_reduce:{HEALTHY_S}"' in row and "started" in row
        assert "not finished" in row  # waiting on rank 2
    # The page's JSON twin carries the same trace for automation.
    data = client.get(f"/api/v1/pages/incidents/{incident.pk}/").json()["trace"]
    assert (data["kind"], data["step"], data["rank"]) == ("rank", HEALTHY_S, 2)
    assert [r["rank"] for r in data["ranks"]] == list(range(8))


def test_a_mismatched_collective_shows_the_step_of_its_unfinished_call(post_batch, client, cast):
    t = healthy_job(post_batch)
    _stepped_waits(t, step=HEALTHY_S, entered=list(range(8)), **{"6": {"dtype": "float32"}})
    incident = only(t.diagnose(at=HEALTHY_S + 20))
    assert (incident.kind, incident.subject) == ("collective_mismatch", f"rank:{t.group}/6")

    html = _page(client, cast, incident)
    assert f'<code data-field="step_id">{step_id(1, HEALTHY_S)}</code>' in html
    assert "its unfinished collective" in html
    assert f'data-call="all_reduce:{HEALTHY_S}"' in _row(html, 6)


def test_a_committed_step_shows_its_phases(post_batch, client, cast):
    t = healthy_job(post_batch)
    t.collectives(seq=HEALTHY_S, at=HEALTHY_S + 1, entered=[r for r in range(8) if r != 5])
    t.add(t.node(5), t.at(HEALTHY_S + 0.5),
          {"kind": "device_event", "gpu": t.gpu(5), "event": "xid", "code": 79})  # fmt: skip
    incident = only(t.diagnose(at=HEALTHY_S + 1.5))
    assert incident.kind == "xid"  # on the GPU; its evidence names rank 5

    html = _page(client, cast, incident)
    # No step ids on these calls (an older agent): the newest step every rank finished.
    assert f'<code data-field="step_id">{step_id(1, HEALTHY_S - 1)}</code>' in html
    row = _row(html, 5)
    assert "done in" in row and "compute" in row and "collective 250" in row


def test_an_incident_about_no_rank_or_worker_has_no_trace(post_batch, client, cast):
    t = healthy_job(post_batch)
    t.steps(first=HEALTHY_S, count=1, at=HEALTHY_S + 1, loss=lambda r, s: "NaN")
    incident = only(t.diagnose(at=HEALTHY_S + 1.5))
    assert incident.kind == "nan_loss"  # about the group
    assert 'id="trace"' not in _page(client, cast, incident)


def test_a_lost_worker_shows_the_request_ids_it_held(post_batch, client, cast):
    t = Timeline(post=post_batch, group=GROUP)
    for i in range(0, 30, 10):
        for w in ("w0", "w1"):
            serving(t, i, w, first_request_id=f"{w}-r{i}00", last_request_id=f"{w}-r{i}42")
    for i in range(30, 100, 10):
        serving(t, i, "w0")
    t.heartbeats(until=100)
    incident = only(t.diagnose(at=100))
    assert (incident.kind, incident.subject) == ("worker_lost", f"worker:{GROUP}/w1")

    html = _page(client, cast, incident)
    assert 'id="trace" data-kind="worker"' in html
    assert '<code data-field="first_request_id">w1-r2000</code>' in html
    assert '<code data-field="last_request_id">w1-r2042</code>' in html


def test_it_reads_only_well_formed_step_ids_and_rank_or_worker_subjects():
    assert parse_step_id(step_id(3, 41)) == (3, 41)
    for bad in (None, 7, "g1:s", "g-1:s2", "g1:s2x", "s2", "g\u0661:s2"):
        assert parse_step_id(bad) is None
    assert culprit_of("rank:llm/12", {}) == ("rank", 12)
    assert culprit_of("worker:chat/w1", {}) == ("worker", "w1")
    assert culprit_of("gpu:GPU-1", {"rank": 5}) == ("rank", 5)
    assert culprit_of("gpu:GPU-1", {"ranks": [5]}) == ("rank", 5)
    assert culprit_of("gpu:GPU-1", {"ranks": [4, 5]}) is None  # shared: which one?
    assert culprit_of("gpu:GPU-1", {"rank": True}) is None
    assert culprit_of("node:n1", {}) is None
    assert culprit_of("rank:llm/\u0661\u0662", {}) is None  # Arabic-Indic 12
