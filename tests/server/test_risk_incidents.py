"""A risk (RPO) that opened before a kill neither blocks nor masks the kill's incident, and
the fleet's reliability record counts the kill, not the risk, as the interruption.

Every record goes through POST /api/v1/ingest and the real pipeline; the reliability record
is console.queries.recovery.fleet_report, what REST and `faultline report` show.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from console import pipeline
from console.models import Incident
from console.queries import recovery
from tests.conftest import iso, make_batch
from tests.server.test_recovery_costs import GROUP, NODE, _ckpt, _step, _transition

pytestmark = pytest.mark.django_db


def test_an_rpo_risk_before_a_kill_is_not_the_interruption(post_batch):
    t0 = (datetime.now(UTC) - timedelta(seconds=150)).replace(microsecond=0)
    at = lambda s: t0 + timedelta(seconds=s)  # noqa: E731
    send = lambda recs: post_batch(make_batch(recs, node=NODE))  # noqa: E731
    start = _transition(1, "initializing", "running", at(0), objectives={"rpo_steps": 3})
    procs = [{"kind": "process", "group": GROUP, "generation": 1, "rank": r, "event": "started",
              "pid": 100 + r, "ts": iso(at(0))} for r in range(2)]  # fmt: skip
    assert send([start, *procs]).status_code == 202
    steps = [_step(1, r, s, at(s)) for s in range(1, 26) for r in range(2)]
    assert (
        send([*steps, _ckpt("committed", at(20.5)), _ckpt("verified", at(21))]).status_code == 202
    )
    pipeline.diagnose(group_name=GROUP, now=at(25.2))  # 5 steps since ckpt-20 > RPO 3
    (risk,) = Incident.objects.filter(group__name=GROUP)
    assert (risk.kind, risk.role) == ("rpo_exceeded", "root_cause")

    killed = {"kind": "process", "group": GROUP, "generation": 1, "rank": 1, "event": "exited",
              "pid": 101, "exit_code": 137, "signal": 9, "reason": "killed",
              "ts": iso(at(25.5))}  # fmt: skip
    assert send([killed]).status_code == 202
    pipeline.diagnose(group_name=GROUP, now=at(27))
    kill = Incident.objects.get(group__name=GROUP, kind="process_exit")
    assert kill.role == "root_cause" and kill.state == "open"  # the risk masks nothing
    assert kill.recovery.get("checkpoint") == "ckpt-20"

    send([_transition(1, "running", "recovering", at(30)),
          _transition(2, "recovering", "running", at(33), restart_count=1)])  # fmt: skip
    assert send([_step(2, r, s, at(36 + s - 21)) for s in range(21, 26) for r in range(2)])
    pipeline.diagnose(group_name=GROUP, now=at(45))

    report = recovery.fleet_report(days=1, now=at(46))
    assert report["interruptions"] == 1
    assert [(c["kind"], c["count"]) for c in report["by_cause"]] == [("process_exit", 1)]
    assert report["other_incidents"] >= 1  # the risk is counted there, not as a stop
    # A risk interrupted nothing: it has no recovery costs (REST and page show none).
    risk.refresh_from_db()
    assert recovery.incident_records(risk) is None
    assert recovery.incident_records(kill) is not None
