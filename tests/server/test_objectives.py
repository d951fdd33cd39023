"""Recovery objectives end to end: declared by the launcher's transition, by an
operator over REST or per pool; RPO findings through the real ingest path and the sweep;
restart advice that respects an `exact` group's data consistency."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from console import pipeline
from console.models import Action, AuditLog, ConsistencyGroup, Incident, Node
from tests.conftest import iso, make_batch

pytestmark = pytest.mark.django_db

GROUP = "obj-train"
NODE = "obj-node-0"
RANKS = 2


def _gpu(rank: int) -> str:
    return f"GPU-{NODE}-{rank}"


def _start(post_batch: Any, start: datetime, objectives: dict[str, Any]) -> None:
    records: list[dict[str, Any]] = [
        {"kind": "transition", "group": GROUP, "generation": 1, "from_state": "initializing",
         "to_state": "running", "objectives": objectives, "ts": iso(start)},
    ]  # fmt: skip
    for rank in range(RANKS):
        records += [
            {"kind": "process", "group": GROUP, "generation": 1, "rank": rank,
             "event": "started", "pid": 100 + rank, "gpu": _gpu(rank), "ts": iso(start)},
            {"kind": "device_sample", "gpu": _gpu(rank), "index": rank, "temp_c": 60.0,
             "ts": iso(start)},
        ]  # fmt: skip
    assert post_batch(make_batch(records, node=NODE)).status_code == 202


def _steps(post_batch: Any, start: datetime, first: int, last: int) -> datetime:
    """Steps first..last (one a second from `start` + first s); data_cursor = step x 100."""
    records = [
        {"kind": "step", "group": GROUP, "generation": 1, "rank": rank, "step": s,
         "tokens": 100, "data_cursor": s * 100, "duration_ms": 1000.0, "loss": 2.0,
         "ts": iso(start + timedelta(seconds=s))}
        for s in range(first, last + 1)
        for rank in range(RANKS)
    ]  # fmt: skip
    end = start + timedelta(seconds=last)
    assert post_batch(make_batch(records, node=NODE)).status_code == 202
    return end


def _checkpoint(post_batch: Any, ts: datetime, step: int, cursor: int | None = None) -> None:
    cid = f"ck-{step}"
    shards = [{"path": f"{cid}/s{i}", "bytes": 10, "sha256": f"{i:064x}"} for i in range(2)]
    rec: dict[str, Any] = {
        "kind": "checkpoint", "group": GROUP, "generation": 1, "checkpoint_id": cid,
        "step": step, "phase": "committed", "duration_ms": 2000.0, "ts": iso(ts),
        "manifest": {"shards": shards, "total_bytes": 20, "format": "dcp"},
    }  # fmt: skip
    if cursor is not None:
        rec["data_cursor"] = cursor
    assert post_batch(make_batch([rec], node=NODE)).status_code == 202


def _open(kind: str) -> list[Incident]:
    return list(Incident.objects.filter(group__name=GROUP, kind=kind).exclude(state="resolved"))


# Batches are sent "now" (record times in the past): a sent_at far from the server's clock
# would be corrected as agent clock skew.


def test_an_rpo_in_steps_declared_by_the_launcher_raises_rpo_exceeded_through_ingest(post_batch):
    start = datetime.now(UTC) - timedelta(minutes=2)
    _start(post_batch, start, {"rpo_steps": 10, "consistency": "allow_repeat"})
    group = ConsistencyGroup.objects.get(name=GROUP)
    assert group.objectives == {"launcher": {"rpo_steps": 10, "consistency": "allow_repeat"}}
    end = _steps(post_batch, start, 0, 5)
    _checkpoint(post_batch, end, 3, cursor=300)
    pipeline.diagnose(group_name=GROUP, now=end + timedelta(seconds=1))
    assert _open("rpo_exceeded") == []  # 2 steps since ck-3

    end = _steps(post_batch, start, 6, 20)
    pipeline.diagnose(group_name=GROUP, now=end + timedelta(seconds=1))
    (incident,) = _open("rpo_exceeded")
    evidence = incident.root_cause["evidence"]
    assert evidence["steps_at_risk"] == 17 and evidence["checkpoint"] == "ck-3"
    assert evidence["rpo_steps"] == 10 and evidence["objective_source"] == "launcher"
    # A risk: the advice stays "no restart needed", nothing is proposed or taken out.
    assert incident.recovery["auto_restart_safe"] is True
    assert not Action.objects.exists()
    # A newer checkpoint within the RPO clears it.
    _checkpoint(post_batch, end, 20, cursor=2000)
    pipeline.diagnose(group_name=GROUP, now=end + timedelta(seconds=2))
    assert Incident.objects.get(pk=incident.pk).clear_since is not None


def test_an_rpo_in_minutes_fires_from_the_sweep_without_new_records(post_batch):
    start = datetime.now(UTC) - timedelta(minutes=3)
    _start(post_batch, start, {"rpo_minutes": 1})
    end = _steps(post_batch, start, 0, 20)
    _checkpoint(post_batch, start + timedelta(seconds=5), 5, cursor=500)
    pipeline.diagnose(group_name=GROUP, now=end)
    assert _open("rpo_exceeded") == []  # ck-5 is 15 s old

    later = start + timedelta(seconds=5 + 90)
    assert GROUP in pipeline.groups_to_sweep(now=later, window=timedelta(minutes=30))
    pipeline.diagnose(group_name=GROUP, now=later)  # what the sweep's task runs
    (incident,) = _open("rpo_exceeded")
    assert incident.root_cause["evidence"]["age_s"] == 90.0


def test_an_exact_groups_restart_that_would_repeat_samples_is_not_auto_restart_safe(
    post_batch, client, cast
):
    start = datetime.now(UTC) - timedelta(minutes=2)
    _start(post_batch, start, {"consistency": "exact"})
    end = _steps(post_batch, start, 0, 10)
    # ck-5's saved loader resumes at cursor 400, but the model had consumed 500 by step 5.
    _checkpoint(post_batch, start + timedelta(seconds=5), 5, cursor=400)
    xid_at = end + timedelta(seconds=1)
    xid = {"kind": "device_event", "gpu": _gpu(1), "event": "xid", "code": 79, "ts": iso(xid_at)}
    assert post_batch(make_batch([xid], node=NODE)).status_code == 202
    pipeline.diagnose(group_name=GROUP, now=xid_at + timedelta(seconds=2))

    (incident,) = _open("xid")
    assert incident.recovery["auto_restart_safe"] is False
    assert "would repeat 100 samples" in incident.recovery["reason"]
    assert not Action.objects.filter(kind="restart_group").exists()

    # An operator loosens it to allow_repeat: the same restart becomes safe.
    client.force_login(cast["operator"])
    url = f"/api/v1/groups/{GROUP}/objectives/"
    resp = client.put(url, {"consistency": "allow_repeat"}, content_type="application/json")
    assert resp.status_code == 200, resp.content
    assert resp.json()["objectives"]["sources"]["consistency"] == "operator"
    pipeline.diagnose(group_name=GROUP, now=xid_at + timedelta(seconds=3))
    incident.refresh_from_db()
    assert incident.recovery["auto_restart_safe"] is True, incident.recovery


def test_rest_objectives_refuse_viewers_validate_audit_and_show_sources(
    post_batch, client, cast, settings
):
    start = datetime.now(UTC) - timedelta(minutes=1)
    _start(post_batch, start, {"rpo_steps": 50})
    settings.FAULTLINE_OBJECTIVES = {"default": {"rto_s": 900}, "pools": {"h100": {"rto_s": 300}}}
    Node.objects.filter(name=NODE).update(pool="h100")
    url = f"/api/v1/groups/{GROUP}/objectives/"
    assert client.get(url).status_code == 401
    client.force_login(cast["viewer"])
    got = client.get(url).json()
    assert (
        got["objectives"]["rto_s"] == 300 and got["objectives"]["sources"]["rto_s"] == "pool:h100"
    )
    assert got["objectives"]["sources"]["rpo_steps"] == "launcher"
    assert "checkpoint_interval" in got["advice"] and got["advice"]["checkpoint_interval"]["basis"]
    page = client.get(f"/groups/{GROUP}/").content.decode()
    assert "Recovery objectives" in page and "pool:h100" in page and "Hot spares" in page
    assert client.put(url, {"rpo_steps": 5}, content_type="application/json").status_code == 403
    assert not AuditLog.objects.filter(verb="group.objectives_changed").exists()

    client.force_login(cast["operator"])
    bad = client.put(url, {"consistency": "mostly"}, content_type="application/json")
    assert bad.status_code == 400 and "consistency" in bad.json()["error"]
    unknown = client.put(url, {"rpo": 5}, content_type="application/json")
    assert unknown.status_code == 400 and "rpo" in unknown.json()["error"]
    ok = client.put(url, {"rpo_steps": 5, "goodput_target": 0.9}, content_type="application/json")
    assert ok.status_code == 200
    o = ok.json()["objectives"]
    assert o["rpo_steps"] == 5 and o["sources"]["rpo_steps"] == "operator"
    assert o["goodput_target"] == 0.9 and o["sources"]["goodput_target"] == "slo"
    (entry,) = AuditLog.objects.filter(verb="group.objectives_changed")
    assert entry.actor == "operator" and entry.data["after"] == {"rpo_steps": 5,
                                                                 "goodput_target": 0.9}  # fmt: skip
    group = ConsistencyGroup.objects.get(name=GROUP)
    assert group.slo["goodput_target"] == 0.9  # the one goodput SLO, shared with serving
    assert group.objectives["launcher"] == {"rpo_steps": 50}  # the launcher's kept beside

    client.force_login(cast["admin"])
    assert client.put(url, {}, content_type="application/json").status_code == 200
    detail = client.get(f"/api/v1/groups/{GROUP}/").json()
    assert detail["objectives"]["rpo_steps"] == 50  # back to the launcher's
    assert "goodput_target" not in detail["objectives"]
    assert detail["checkpoint_advice"]["hot_spares"]["basis"]


def test_the_launcher_may_not_smuggle_unknown_objectives(post_batch):
    start = datetime.now(UTC)
    rec = {"kind": "transition", "group": GROUP, "generation": 1, "to_state": "running",
           "objectives": {"rpo_steps": 5, "priority": "high"}, "ts": iso(start)}  # fmt: skip
    resp = post_batch(make_batch([rec], node=NODE))
    assert resp.status_code == 400 and "priority" in resp.content.decode()


def test_a_recovery_running_past_its_rto_raises_rto_exceeded_until_work_resumes(post_batch):
    start = datetime.now(UTC) - timedelta(minutes=2)
    _start(post_batch, start, {"rto_s": 30})
    end = _steps(post_batch, start, 0, 5)
    down = end + timedelta(seconds=1)
    recovering = {"kind": "transition", "group": GROUP, "generation": 1,
                  "from_state": "running", "to_state": "recovering", "reason": "rank_lost",
                  "restart_count": 1, "ts": iso(down)}  # fmt: skip
    assert post_batch(make_batch([recovering], node=NODE)).status_code == 202
    pipeline.diagnose(group_name=GROUP, now=down + timedelta(seconds=20))
    assert _open("rto_exceeded") == []
    pipeline.diagnose(group_name=GROUP, now=down + timedelta(seconds=45))
    (incident,) = _open("rto_exceeded")
    assert incident.root_cause["evidence"]["elapsed_s"] == 45.0
    assert incident.recovery["auto_restart_safe"] is True and not Action.objects.exists()

    back = down + timedelta(seconds=50)
    records = [
        {"kind": "transition", "group": GROUP, "generation": 2, "from_state": "recovering",
         "to_state": "running", "restart_count": 1, "ts": iso(back)},
        *({"kind": "step", "group": GROUP, "generation": 2, "rank": r, "step": 6,
           "tokens": 100, "duration_ms": 1000.0, "ts": iso(back + timedelta(seconds=1))}
          for r in range(RANKS)),
    ]  # fmt: skip
    assert post_batch(make_batch(records, node=NODE)).status_code == 202
    pipeline.diagnose(group_name=GROUP, now=back + timedelta(seconds=2))
    assert Incident.objects.get(pk=incident.pk).clear_since is not None
