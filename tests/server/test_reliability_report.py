"""The fleet's reliability record on a seeded month of synthetic incidents.

Incidents are opened and resolved through console.actions.record_diagnosis (the path
diagnosis takes) and their costs stored through console.actions.record_incident_costs;
groups and nodes exist because their agents reported through ingest. The figures the
report, its REST and `faultline report` give are checked against counts made by hand.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from console import actions
from console.actions.diagnosis import SETTLE
from console.diagnosis.engine import Diagnosis
from console.diagnosis.findings import ROOT_CAUSE, make_finding
from console.diagnosis.goodput import Goodput
from console.models import Incident, Node
from console.queries import recovery
from ingest.models import DeviceRollup, DeviceSample
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db

DAYS = 30
# (day, group, kind, subject, evidence, restarted, lost GPU-hours)
MONTH = [
    (1, "llm-a", "xid", "gpu:G0", {"code": 79, "node": "n0", "gpu": "G0"}, True, 2.0),
    (2, "llm-a", "xid", "gpu:G0", {"code": 79, "node": "n0", "gpu": "G0"}, True, 2.0),
    (3, "llm-a", "xid", "gpu:G1", {"code": 48, "node": "n1", "gpu": "G1"}, True, 1.0),
    (5, "llm-a", "xid", "gpu:G2", {"code": 74, "node": "n1", "gpu": "G2"}, True, 1.0),
    (7, "llm-b", "network_slow", "rank:llm-b/1", {}, True, 1.0),
    (9, "llm-b", "node_down", "node:n2", {}, True, 1.0),
    (11, "llm-b", "checkpoint_corrupt", "checkpoint:llm-b/c1", {}, True, 1.0),
    (13, "llm-a", "process_exit", "rank:llm-a/3", {}, True, 1.0),
    (15, "llm-a", "nan_loss", "group:llm-a", {}, True, 1.0),
    (17, "llm-b", "input_stall", "rank:llm-b/0", {}, True, 1.0),
    (19, "llm-a", "straggler", "rank:llm-a/2", {}, False, 0.0),  # slowed, never stopped
]
DOWNTIME_S = 600.0
GPUS = {"n0": 8, "n1": 8, "n2": 4}
REPORTED_DAYS = 2  # the fleet's GPUs sampled for the last two days of the month only


def _seed_exposure(now: datetime, days: int = REPORTED_DAYS) -> None:
    """Minute rollups as ingest.rollups writes them: every minute of the last `days` days."""
    start = now.replace(second=0, microsecond=0) - timedelta(days=days)
    rows = [
        DeviceRollup(node=Node.objects.get(name=node), minute=start + timedelta(minutes=m),
                     samples=gpus, gpus=gpus, throttled_gpus=0)
        for node, gpus in GPUS.items()
        for m in range(days * 1440)
    ]  # fmt: skip
    DeviceRollup.objects.bulk_create(rows, batch_size=5000)


def _seed_fleet(post_batch) -> None:
    for node, group in (("n0", "llm-a"), ("n1", "llm-a"), ("n2", "llm-b")):
        recs = [{"kind": "heartbeat", "uptime_s": 10.0, "spool_depth": 0, "dropped": 0}]
        if node != "n1":
            recs.append(
                {"kind": "transition", "group": group, "generation": 1, "to_state": "running",
                 "from_state": "initializing", "world_size": 8 if group == "llm-a" else 4}
            )  # fmt: skip
        assert post_batch(make_batch(recs, node=node)).status_code == 202


def _diagnose(group: str, findings: tuple, at: datetime) -> list[int]:
    diagnosis = Diagnosis(group, _generation[group], at, findings, Goodput(60.0, 60.0))
    return actions.record_diagnosis(group_name=group, diagnosis=diagnosis, now=at)


_generation: dict[str, int] = {}
NODE_OF = {"llm-a": "n0", "llm-b": "n2"}


def _restart(post_batch, group: str) -> None:
    """The launcher relaunches the group as its next generation (through ingest)."""
    gen = _generation[group] = _generation[group] + 1
    rec = {"kind": "transition", "group": group, "generation": gen, "to_state": "running",
           "from_state": "recovering", "restart_count": gen - 1}  # fmt: skip
    assert post_batch(make_batch([rec], node=NODE_OF[group])).status_code == 202


def _seed_month(post_batch, now: datetime) -> list[int]:
    _generation.update({"llm-a": 1, "llm-b": 1})
    ids = []
    for n, (day, group, kind, subject, ev, restarted, lost) in enumerate(MONTH):
        opened = now - timedelta(days=DAYS) + timedelta(days=day, hours=n)
        finding = make_finding(
            group=group, generation=1, kind=kind, subject=subject, role=ROOT_CAUSE,
            severity="critical", summary=f"{kind} on {subject}", first_seen=opened,
            evidence=ev, key=str(n),
        )  # fmt: skip
        clear = opened + timedelta(minutes=10)
        (iid,) = _diagnose(group, (finding,), opened)
        _diagnose(group, (), clear)  # the settle clock starts ...
        _diagnose(group, (), clear + SETTLE)  # ... and runs out: resolved
        costs = {
            "restarted": restarted, "complete": True,
            "downtime_s": DOWNTIME_S if restarted else None,
            "lost_work_s": 1800.0 if restarted else None,
            "lost_tokens": 1000 if restarted else None,
            "total_lost_gpu_hours": lost if restarted else None,
        }  # fmt: skip
        actions.record_incident_costs(incident_id=iid, costs=costs, actor="test", now=clear)
        ids.append(iid)
        if restarted:
            _restart(post_batch, group)
    return ids


def test_a_seeded_month_gives_the_counts_made_by_hand(post_batch, client, cast, tmp_path):
    now = datetime.now(UTC)
    _seed_fleet(post_batch)
    ids = _seed_month(post_batch, now)
    assert Incident.objects.filter(pk__in=ids, state="resolved").count() == len(MONTH)

    _seed_exposure(now)
    r = recovery.fleet_report(days=DAYS, now=now)
    assert r["interruptions"] == 10 and r["other_incidents"] == 1  # the straggler
    layers = {row["layer"]: row for row in r["by_layer"]}
    assert {k: v["count"] for k, v in layers.items()} == {
        "gpu": 2, "hbm": 1, "nvlink": 1, "network": 1, "host": 1, "storage": 1,
        "software": 1, "model": 1, "data": 1,
    }  # fmt: skip
    assert r["hardware_share"] == round(7 / 10, 4)  # ~78 % in Llama 3; 70 % here
    assert r["lost_gpu_hours"] == 12.0
    assert layers["gpu"]["share_lost_gpu_hours"] == round(4 / 12, 4)
    # MTBF over what reported (two days of 20 GPUs on 3 nodes), not the 30 days asked for.
    hours = REPORTED_DAYS * 24
    assert r["exposure"]["observed_hours"] == pytest.approx(hours, abs=0.02)
    assert r["exposure"]["gpu_hours"] == pytest.approx(hours * 20, abs=0.5)
    assert r["exposure"]["node_hours"] == pytest.approx(hours * 3, abs=0.05)
    assert layers["gpu"]["mtbf_hours"] == pytest.approx(hours / 2, abs=0.01)
    assert r["mtbf_hours"] == pytest.approx(hours / 10, abs=0.01)
    assert r["mtbf_gpu_hours"] == pytest.approx(hours * 20 / 10, abs=0.1)
    assert r["mtbf_node_hours"] == pytest.approx(hours * 3 / 10, abs=0.01)
    by_node = {row["node"]: row for row in r["per_node"]}
    assert by_node["n0"]["mtbf_hours"] == pytest.approx(hours / 2, abs=0.01)
    assert by_node["n2"]["node_hours"] == pytest.approx(hours, abs=0.02)
    # A longer window over the same exposure changes no rate.
    assert recovery.fleet_report(days=DAYS * 2, now=now)["mtbf_hours"] == r["mtbf_hours"]
    assert r["mttr_s"] == DOWNTIME_S and r["mttr_backed_by"] == 10
    assert [(o["node"], o["interruptions"]) for o in r["repeat_offenders"]["nodes"]] == [
        ("n0", 2), ("n1", 2),
    ]  # fmt: skip
    assert [(o["gpu"], o["interruptions"]) for o in r["repeat_offenders"]["gpus"]] == [("G0", 2)]
    per_node = {row["node"]: row["interruptions"] for row in r["per_node"]}
    assert per_node == {"n0": 2, "n1": 2, "n2": 1}
    assert sum(d["interruptions"] for d in r["per_day"]) == 10
    groups = {g["group"]: g for g in r["per_group"]}
    assert (groups["llm-a"]["interruptions"], groups["llm-b"]["interruptions"]) == (6, 4)
    # ETTR: llm-a lost 6 x (600 s down + 1800 s redone) of its hours in the window.
    span_a = groups["llm-a"]["hours"] * 3600
    assert groups["llm-a"]["ettr"] == round(1 - 6 * 2400 / span_a, 4)
    assert r["node_incidents"] == 0  # no node incident was open for these xids to link to
    incidents = Incident.objects.filter(pk__in=ids).order_by("opened_at")
    assert [i.generation for i in incidents if i.group.name == "llm-b"] == [1, 2, 3, 4]

    # The REST endpoint: viewers read it, anonymous callers are refused.
    anon = client.get(f"/api/v1/reliability/?days={DAYS}")
    assert anon.status_code in (401, 403)
    client.force_login(cast["viewer"])
    body = client.get(f"/api/v1/reliability/?days={DAYS}").json()
    assert body["interruptions"] == 10 and body["by_layer"] == r["by_layer"]
    assert client.get("/api/v1/reliability/?days=0").status_code == 400
    page = client.get(f"/reliability/?days={DAYS}").content.decode()
    assert 'id="chart-layers"' in page and 'id="reliability-data"' in page
    assert page.count('<tr data-incident="') == 10


def test_faultline_report_writes_the_same_figures(post_batch, tmp_path, monkeypatch):
    from faultline import cli

    now = datetime.now(UTC)
    _seed_fleet(post_batch)
    _seed_month(post_batch, now)

    class Ready:  # the test database is already set up: no embedded servers here
        def __init__(self, *_a):
            pass

        def __enter__(self):
            return None

        def __exit__(self, *_a):
            return False

    monkeypatch.setattr(cli.bootstrap, "django_ready", Ready)
    out_json, out_md = tmp_path / "r.json", tmp_path / "r.md"
    argv = ["report", "--days", str(DAYS), "--json", str(out_json), "--markdown", str(out_md)]
    assert cli.main(argv) == 0
    data = json.loads(out_json.read_text())
    assert data["interruptions"] == 10
    md = out_md.read_text()
    assert "| GPU | hardware | 2 | 20.0 % |" in md
    assert "interruptions: **10**" in md
    # No GPU sampled in this window: the rates say so instead of dividing the window.
    assert data["mtbf_hours"] is None and data["mtbf_note"] == "not enough exposure"
    assert "MTBF fleet-wide: not enough exposure (over 0 h)" in md


def test_a_fleet_that_reported_for_minutes_shows_no_mtbf(post_batch):
    """Three minutes of samples and one interruption: not "MTBF 720 h" over a 30-day window."""
    now = datetime.now(UTC)
    _seed_fleet(post_batch)
    _generation.update({"llm-a": 1, "llm-b": 1})
    node = Node.objects.get(name="n0")
    DeviceSample.objects.bulk_create(
        DeviceSample(node=node, gpu=f"G{g}", index=g, ts=now - timedelta(seconds=s))
        for g in range(8)
        for s in range(0, 180, 10)
    )
    finding = make_finding(
        group="llm-a", generation=1, kind="xid", subject="gpu:G0", role=ROOT_CAUSE,
        severity="critical", summary="xid", first_seen=now - timedelta(minutes=2),
        evidence={"code": 79, "node": "n0", "gpu": "G0"},
    )  # fmt: skip
    (iid,) = _diagnose("llm-a", (finding,), now - timedelta(minutes=2))
    actions.record_incident_costs(
        incident_id=iid, costs={"restarted": True, "complete": True, "downtime_s": 60.0},
        actor="test", now=now,
    )  # fmt: skip
    r = recovery.fleet_report(days=DAYS, now=now)
    assert r["interruptions"] == 1
    assert 0.05 <= r["exposure"]["observed_hours"] <= 0.067  # three or four minutes, rounded
    assert r["exposure"]["gpu_hours"] == pytest.approx(
        8 * r["exposure"]["observed_hours"], abs=0.01
    )
    assert r["mtbf_hours"] is None and r["mtbf_gpu_hours"] is None
    assert r["mtbf_note"] == "not enough exposure"
    assert r["per_node"][0]["mtbf_hours"] is None
    assert r["per_node"][0]["mtbf_note"] == "not enough exposure"
