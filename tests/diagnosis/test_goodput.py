from __future__ import annotations

from datetime import timedelta

from console.diagnosis import diagnose
from tests.diagnosis.factory import T0, snap, step, training, transition

NOW = T0 + timedelta(seconds=1)


def test_it_counts_tokens_of_valid_steps_over_wall_time() -> None:
    g = diagnose(snap(training(ranks=4, steps=20)), NOW).goodput
    # 4 ranks x 20 steps x 4096 tokens over 26 s (25 steps of history span + 1 s).
    assert g.tokens_valid == 4 * 20 * 4096
    assert g.g_train_tokens_per_s is not None
    assert abs(g.g_train_tokens_per_s - g.tokens_valid / g.wall_s) < 1e-9


def test_it_excludes_tokens_of_steps_that_failed_numeric_checks() -> None:
    recs = [*training(ranks=4), step(0, 120, T0 + timedelta(seconds=1), loss=float("nan"))]
    for rk in range(1, 4):
        recs.append(step(rk, 120, T0 + timedelta(seconds=1)))
    g = diagnose(snap(recs), NOW).goodput
    assert g.tokens_total - g.tokens_valid == 4 * 4096 and g.badput_s["invalid"] == 1.0


def test_it_counts_steps_repeated_after_a_restart_as_recompute() -> None:
    gen1 = training(ranks=2, steps=10, end=T0 - timedelta(seconds=60), gen=1)
    gen2 = [
        transition(T0 - timedelta(seconds=50), "running", "recovering", gen=2),
        transition(T0 - timedelta(seconds=20), "recovering", "running", gen=2),
    ]
    gen2 += [
        step(rk, 105 + i, T0 - timedelta(seconds=10 - i), gen=2)
        for rk in range(2)
        for i in range(10)
    ]
    g = diagnose(snap(gen1 + gen2, gen=2), NOW).goodput
    assert g.badput_s["recompute"] == 5.0  # steps 105..109 done twice, 1 s each
    assert g.badput_s["restart"] == 30.0


def test_it_counts_silence_beyond_the_hang_threshold_as_stall() -> None:
    g = diagnose(snap(training(ranks=2)), T0 + timedelta(seconds=100)).goodput
    assert g.badput_s["stall"] == 100.0
