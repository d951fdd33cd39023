"""A launcher's own root cause (torchrun's first observed failure) beside Faultline's.

Through real ingest and the real pipeline: the launcher's exits (agents.integrations.
torchelastic) carry the error file's message, scrubbed as it is stored, and which exit
torchrun named; the incident's REST field and page line say whether it is Faultline's rank.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ingest.models import ProcessRecord
from tests.server.scenarios.timeline import HEALTHY_S, Timeline, only

pytestmark = pytest.mark.django_db

SECRET_PATH = "/home/alice/datasets/customer-x/shard-00017.bin"


def _job(post_batch: object, generation: int = 1) -> Timeline:
    """Four ranks stepping for HEALTHY_S seconds; each generation three minutes later."""
    start = datetime.now(UTC) - timedelta(minutes=12 - 3 * generation)
    t = Timeline(post=post_batch, ranks=4, generation=generation, start=start)
    t.boot(at=0)
    t.steps(first=0, count=HEALTHY_S, at=1)
    t.heartbeats(until=HEALTHY_S + 60)
    return t


def _exit(t: Timeline, rank: int, at: float, **fields: object) -> None:
    t.add(t.node(rank), t.at(at), {"kind": "process", "group": t.group,
          "generation": t.generation, "rank": rank, "event": "exited", "pid": 100 + rank,
          **fields})  # fmt: skip


def _raised_on_rank_2(t: Timeline, *, torchrun_names: int) -> None:
    """Rank 2 raises; torchrun then tears the others down (SIGTERM) and names one rank."""
    at = HEALTHY_S + 0.4
    _exit(t, 2, at, exit_code=1, reason="exception", error_type="ValueError",
          message=f"bad sample in {SECRET_PATH}",
          launcher_root_cause="torchelastic" if torchrun_names == 2 else None)  # fmt: skip
    for rank in (0, 1, 3):
        _exit(t, rank, at + 0.3, exit_code=143, signal=15, reason="killed",
              launcher_root_cause="torchelastic" if torchrun_names == rank else None)  # fmt: skip
    t.add(t.node(0), t.at(at + 0.4), {"kind": "transition", "group": t.group,
          "generation": t.generation, "to_state": "recovering", "from_state": "running",
          "reason": "worker_failed"})  # fmt: skip


def test_it_stores_the_launchers_message_scrubbed_and_names_its_root_cause(
    post_batch, client, cast
):
    t = _job(post_batch)
    _raised_on_rank_2(t, torchrun_names=2)
    incident = only(t.diagnose(at=HEALTHY_S + 2))
    assert (incident.kind, incident.subject) == ("exception", "rank:job/2")
    stored = ProcessRecord.objects.get(rank=2, event="exited")
    assert stored.message == "bad sample in <path>" and stored.launcher_root_cause == "torchelastic"
    assert incident.root_cause["evidence"]["message"] == "bad sample in <path>"

    client.force_login(cast["viewer"])
    body = client.get(f"/api/v1/incidents/{incident.pk}/").json()
    launcher = body["launcher_root_cause"]
    assert (launcher["launcher"], launcher["rank"], launcher["error_type"]) == (
        "torchelastic", 2, "ValueError",
    )  # fmt: skip
    assert (launcher["agrees"], launcher["faultline_rank"]) == (True, 2)
    assert "alice" not in str(body)
    listed = client.get("/api/v1/incidents/?group=job").json()["results"]
    assert [i["launcher_root_cause"] for i in listed] == [launcher]
    page = client.get(f"/incidents/{incident.pk}/").content.decode()
    assert 'id="launcher-root-cause" data-rank="2" data-agrees="1"' in page
    assert "Faultline names the same rank." in page


def test_it_shows_where_torchrun_and_faultline_disagree(post_batch, client, cast):
    # Same whole second for every error file: torchrun's tie goes to the lowest local rank.
    t = _job(post_batch)
    _raised_on_rank_2(t, torchrun_names=0)
    incident = only(t.diagnose(at=HEALTHY_S + 2))
    client.force_login(cast["viewer"])
    launcher = client.get(f"/api/v1/incidents/{incident.pk}/").json()["launcher_root_cause"]
    assert (launcher["rank"], launcher["signal"], launcher["agrees"]) == (0, 15, False)
    page = client.get(f"/incidents/{incident.pk}/").content.decode()
    assert 'data-rank="0" data-agrees="0"' in page
    assert "Faultline names rank 2 instead." in page


def test_it_shows_no_launcher_line_where_no_launcher_named_one(post_batch, client, cast):
    t = _job(post_batch)
    _raised_on_rank_2(t, torchrun_names=-1)
    incident = only(t.diagnose(at=HEALTHY_S + 2))
    client.force_login(cast["viewer"])
    assert client.get(f"/api/v1/incidents/{incident.pk}/").json()["launcher_root_cause"] is None
    assert (
        'id="launcher-root-cause"' not in client.get(f"/incidents/{incident.pk}/").content.decode()
    )


def test_a_list_reads_every_incidents_launcher_root_cause_in_one_query(post_batch, client, cast):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client.force_login(cast["viewer"])
    counts = []
    for generation in (1, 2, 3):
        t = _job(post_batch, generation)
        _raised_on_rank_2(t, torchrun_names=2)
        t.diagnose(at=HEALTHY_S + 2)
        with CaptureQueriesContext(connection) as seen:
            results = client.get("/api/v1/incidents/?group=job").json()["results"]
        launcher_reads = [q for q in seen.captured_queries if "launcher_root_cause" in q["sql"]]
        counts.append(len(launcher_reads))
        assert len(results) == generation
        assert all(i["launcher_root_cause"]["rank"] == 2 for i in results)
    assert counts == [1, 1, 1]


def _restarted(t: Timeline, *, at: float) -> None:
    """torchrun's next generation, half a second after the failure's recovering."""
    nxt = t.generation + 1
    t.add(t.node(0), t.at(at), {"kind": "transition", "group": t.group, "generation": nxt,
          "to_state": "running", "from_state": "recovering", "reason": "restart",
          "restart_count": nxt, "world_size": t.ranks})  # fmt: skip


def test_a_failure_restarted_before_any_pass_saw_it_still_opens_its_incident(
    post_batch, client, cast
):
    # torchrun restarts within a second: the failure's batch and the restart's arrive before
    # the pass the first one scheduled reads the group. The ended generation is judged as of
    # its end, once; its incident belongs to it.
    t = _job(post_batch)
    _raised_on_rank_2(t, torchrun_names=2)
    _restarted(t, at=HEALTHY_S + 1.3)
    incidents = t.diagnose(at=HEALTHY_S + 2)
    (incident,) = [i for i in incidents if i.generation == 1]
    assert (incident.kind, incident.subject) == ("exception", "rank:job/2")
    client.force_login(cast["viewer"])
    body = client.get(f"/api/v1/incidents/{incident.pk}/").json()
    assert (body["launcher_root_cause"]["rank"], body["launcher_root_cause"]["agrees"]) == (2, True)
    # Judged once: another pass neither duplicates it nor judges the ending again.
    again = t.diagnose(at=HEALTHY_S + 3)
    assert [i.pk for i in again if i.generation == 1] == [incident.pk]
    from console.models import ConsistencyGroup

    assert ConsistencyGroup.objects.get(name="job").summary["ended_judged"] == 1


def test_a_generation_that_ended_healthy_opens_nothing(post_batch):
    t = _job(post_batch)
    t.add(t.node(0), t.at(HEALTHY_S + 0.5), {"kind": "transition", "group": t.group,
          "generation": 1, "to_state": "recovering", "from_state": "running",
          "reason": "membership_change"})  # fmt: skip
    _restarted(t, at=HEALTHY_S + 1.0)
    assert t.diagnose(at=HEALTHY_S + 2) == []
