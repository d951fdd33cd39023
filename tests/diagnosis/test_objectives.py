"""Recovery objectives: RPO and RTO findings and the data-consistency limit on
restart advice, on plain snapshots."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from console.diagnosis import build_snapshot, diagnose
from console.diagnosis.findings import RISK_KINDS
from console.policy import remediation
from tests.diagnosis.factory import (
    GROUP,
    T0,
    device_event,
    of_kind,
    step,
    training,
    transition,
)


def _snap(records: list[dict[str, Any]], objectives: dict[str, Any], *, gen: int = 1,
          state: str = "running", now=T0):  # fmt: skip
    return build_snapshot(
        group=GROUP, generation=gen, state=state, records=records, nodes={},
        contract_findings=[], now=now, objectives=objectives,
    )  # fmt: skip


def _with_cursor(records: list[dict[str, Any]], cursor: int | None) -> list[dict[str, Any]]:
    """The factory's checkpoint (ckpt-100 at step 100) with its restore data cursor."""
    out = []
    for r in records:
        if r["kind"] == "checkpoint" and cursor is not None:
            r = {**r, "data_cursor": cursor}
        out.append(r)
    return out


def test_rpo_in_steps_fires_when_progress_since_the_valid_checkpoint_exceeds_it() -> None:
    recs = training(ranks=4, steps=20)  # steps 100..119, ckpt-100 committed at step 100
    d = diagnose(_snap(recs, {"rpo_steps": 10}), T0 + timedelta(seconds=1))
    (f,) = of_kind(d, "rpo_exceeded")
    assert f.evidence["steps_at_risk"] == 19 and f.evidence["checkpoint"] == "ckpt-100"
    assert diagnose(_snap(recs, {"rpo_steps": 19}), T0).findings == ()


def test_rpo_without_any_valid_checkpoint_counts_everything_since_the_start() -> None:
    recs = training(ranks=4, steps=20, with_checkpoint=False)
    (f,) = of_kind(diagnose(_snap(recs, {"rpo_steps": 100}), T0), "rpo_exceeded")
    assert f.evidence["checkpoint"] is None and f.evidence["steps_at_risk"] == 119


def test_rpo_in_minutes_is_time_driven_the_same_records_fire_later() -> None:
    snap = _snap(training(ranks=4, steps=20), {"rpo_minutes": 1})
    assert of_kind(diagnose(snap, T0 + timedelta(seconds=30)), "rpo_exceeded") == []
    (f,) = of_kind(diagnose(snap, T0 + timedelta(minutes=2)), "rpo_exceeded")
    assert f.evidence["age_s"] > 60 and f.last_seen == T0 + timedelta(minutes=2)


def test_a_risk_neither_blocks_a_restart_nor_calls_for_remediation() -> None:
    recs = [*training(ranks=8, steps=20), device_event(3, T0, "xid", 79)]
    d = diagnose(_snap(recs, {"rpo_steps": 5}), T0 + timedelta(seconds=1))
    (risk,) = of_kind(d, "rpo_exceeded")
    (xid,) = of_kind(d, "xid")
    assert risk.recovery is not None and risk.recovery.auto_restart_safe
    # The group's advice is the fault's, not the risk's.
    assert d.recovery is not None and d.recovery == xid.recovery and d.recovery.auto_restart_safe
    plan = remediation.plan(
        remediation.Cause(kind=risk.kind, subject=risk.subject, finding=risk.fingerprint,
                          recovery=risk.recovery.to_dict(), group=GROUP, job="42"),
        remediation.RemediationPolicy(),
    )  # fmt: skip
    assert plan.proposals == () and plan.pages == ()
    alone = diagnose(_snap(training(ranks=4, steps=20), {"rpo_steps": 5}), T0)
    assert {f.kind for f in alone.findings} == {"rpo_exceeded"} and alone.recovery is None


def test_rto_fires_while_a_recovery_runs_past_it_and_clears_once_work_resumes() -> None:
    fail = T0 - timedelta(seconds=60)
    recs = [
        *training(ranks=4, steps=20, end=fail),
        transition(fail, "running", "recovering", restart_count=1),
        transition(fail + timedelta(seconds=5), "recovering", "initializing", gen=2),
    ]
    snap = _snap(recs, {"rto_s": 30}, gen=2, state="initializing")
    (f,) = of_kind(diagnose(snap, T0), "rto_exceeded")
    assert f.evidence["elapsed_s"] == 60 and f.kind in RISK_KINDS
    assert of_kind(diagnose(snap, fail + timedelta(seconds=20)), "rto_exceeded") == []
    resumed = [*recs, *(step(r, 101, T0 - timedelta(seconds=1), gen=2) for r in range(4))]
    assert of_kind(diagnose(_snap(resumed, {"rto_s": 30}, gen=2), T0), "rto_exceeded") == []


CONSUMED = 100 * 4096  # the factory's steps report data_cursor = step x 4096


@pytest.mark.parametrize(
    ("consistency", "cursor", "safe", "why"),
    [
        ("exact", CONSUMED, True, None),
        ("exact", CONSUMED - 4096, False, "would repeat 4096 samples"),
        ("exact", CONSUMED + 4096, False, "would skip 4096 samples"),
        ("exact", None, False, "records no data cursor"),
        ("allow_repeat", CONSUMED - 4096, True, None),
        ("allow_repeat", CONSUMED + 4096, False, "would skip"),
        ("allow_repeat", None, True, None),
        ("allow_skip", CONSUMED - 4096, False, "would repeat"),
        ("allow_skip", CONSUMED + 4096, True, None),
        (None, CONSUMED - 4096, True, None),
    ],
)
def test_restart_advice_respects_the_groups_data_consistency(
    consistency: str | None, cursor: int | None, safe: bool, why: str | None
) -> None:
    recs = _with_cursor([*training(ranks=8, steps=20), device_event(3, T0, "xid", 79)], cursor)
    objectives = {"consistency": consistency} if consistency else {}
    d = diagnose(_snap(recs, objectives), T0 + timedelta(seconds=1))
    (xid,) = of_kind(d, "xid")
    assert xid.recovery is not None and xid.recovery.auto_restart_safe is safe, xid.recovery
    if why:
        assert why in xid.recovery.reason
    # Unsafe advice pages a human instead of restarting (the policy reads the advice).
    cause = remediation.Cause(kind="xid", subject=xid.subject, finding=xid.fingerprint,
                              recovery=xid.recovery.to_dict(), group=GROUP, job="42",
                              node="node-01", evidence=dict(xid.evidence))  # fmt: skip
    kinds = {p.kind for p in remediation.plan(cause, remediation.RemediationPolicy()).proposals}
    assert ("restart_group" in kinds) is safe


def test_at_most_once_serving_with_retries_is_not_restart_safe() -> None:
    recs = [*training(ranks=8, steps=20), device_event(3, T0, "xid", 79)]
    recs.append({"kind": "serving", "ts": T0, "group": GROUP, "worker": "w0",
                 "window": {"seconds": 10, "requests": 100, "retries": 3}})  # fmt: skip
    d = diagnose(_snap(recs, {"semantics": "at_most_once"}), T0 + timedelta(seconds=1))
    (xid,) = of_kind(d, "xid")
    assert xid.recovery is not None and not xid.recovery.auto_restart_safe
    assert "at_most_once" in xid.recovery.reason
