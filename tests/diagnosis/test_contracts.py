from __future__ import annotations

from datetime import timedelta

from console.diagnosis import ROOT_CAUSE, diagnose
from tests.diagnosis.factory import T0, snap, training


def _with(kind: str):
    cf = [
        {"kind": kind, "subject": "group:llama-70b", "ts": T0, "evidence": {"generations": [3, 4]}}
    ]
    return diagnose(snap(training(ranks=4), contract_findings=cf), T0 + timedelta(seconds=1))


def test_it_passes_a_split_brain_through_as_a_critical_root_cause() -> None:
    (f,) = _with("split_brain").findings
    assert (f.kind, f.role, f.severity, f.evidence) == (
        "split_brain",
        ROOT_CAUSE,
        "critical",
        {"generations": [3, 4]},
    )


def test_it_blocks_auto_restart_on_a_stale_generation() -> None:
    (f,) = _with("stale_generation").findings
    assert f.recovery is not None and f.recovery.auto_restart_safe is False


def test_it_passes_a_data_cursor_regression_through() -> None:
    assert [f.kind for f in _with("data_cursor_regression").root_causes] == [
        "data_cursor_regression"
    ]
