"""A risk (RPO/RTO) never counts as an interruption, nor masks the real root cause."""

from __future__ import annotations

from console.diagnosis.reliability import GroupSpan, Interruption, fleet_report


def _i(incident: int, kind: str, opened: float, layer: str) -> Interruption:
    return Interruption(incident=incident, group="g", generation=1, kind=kind, layer=layer,
                        opened=opened, restarted=True, total_lost_gpu_hours=0.5)  # fmt: skip


def test_an_rpo_risk_opened_before_a_kill_is_not_the_generations_interruption() -> None:
    risk = _i(1, "rpo_exceeded", 100.0, "undetermined")  # opened first, same generation
    kill = _i(2, "process_exit", 200.0, "software")
    report = fleet_report([risk, kill], [GroupSpan("g", "training", 2, 0.0, 3600.0)],
                          start=0.0, end=3600.0)  # fmt: skip
    assert report["interruptions"] == 1
    assert [c["kind"] for c in report["by_cause"]] == ["process_exit"]
    assert report["other_incidents"] == 1


def test_a_risk_alone_is_no_interruption() -> None:
    rto = _i(1, "rto_exceeded", 100.0, "undetermined")
    report = fleet_report([rto], [GroupSpan("g", "training", 2, 0.0, 3600.0)],
                          start=0.0, end=3600.0)  # fmt: skip
    assert report["interruptions"] == 0 and report["mtbf_hours"] is None
