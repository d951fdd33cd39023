from __future__ import annotations

from datetime import timedelta

from console.diagnosis import diagnose
from tests.diagnosis.factory import T0, of_kind, snap, training, transition


def _restarts(n: int) -> list[dict]:
    return [
        transition(T0 - timedelta(minutes=5 * i), "running", "recovering", restart_count=i)
        for i in range(n)
    ]


def test_it_calls_more_restarts_than_the_limit_a_retry_storm() -> None:
    d = diagnose(snap([*training(ranks=4), *_restarts(4)]), T0 + timedelta(seconds=1))
    (storm,) = of_kind(d, "retry_storm")
    assert storm.evidence["restarts"] == 4
    assert storm.recovery is not None and not storm.recovery.auto_restart_safe


def test_it_tolerates_restarts_up_to_the_limit() -> None:
    d = diagnose(snap([*training(ranks=4), *_restarts(3)]), T0 + timedelta(seconds=1))
    assert of_kind(d, "retry_storm") == []
