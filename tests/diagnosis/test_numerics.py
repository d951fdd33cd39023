from __future__ import annotations

from datetime import timedelta

from console.diagnosis import ROOT_CAUSE, diagnose
from tests.diagnosis.factory import T0, of_kind, snap, step, training

NOW = T0 + timedelta(seconds=2)


def _diag(extra: list[dict]):
    return diagnose(snap([*training(ranks=4), *extra]), NOW)


def test_it_calls_a_nan_loss_a_group_root_cause_that_blocks_restart() -> None:
    d = _diag([step(2, 120, T0 + timedelta(seconds=1), loss=float("nan"))])
    (nan,) = of_kind(d, "nan_loss")
    assert (nan.subject, nan.role, nan.evidence["first_step"]) == (
        "group:llama-70b",
        ROOT_CAUSE,
        120,
    )
    assert nan.recovery is not None and nan.recovery.auto_restart_safe is False


def test_it_calls_an_infinite_loss_a_nan_loss_too() -> None:
    assert of_kind(_diag([step(2, 120, T0, loss=float("inf"))]), "nan_loss")


def test_it_calls_a_tenfold_grad_norm_jump_an_explosion() -> None:
    d = _diag([step(rk, 120, T0 + timedelta(seconds=1), grad_norm=40.0) for rk in range(4)])
    (boom,) = of_kind(d, "grad_explosion")
    assert boom.evidence["grad_norm"] == 40.0 and boom.evidence["median_grad_norm"] == 1.0


def test_it_ignores_an_overflow_step_the_scaler_skipped() -> None:
    d = _diag(
        [
            step(
                0,
                120,
                T0 + timedelta(seconds=1),
                grad_norm=float("inf"),
                overflow=True,
                loss_scale=32768.0,
            )
        ]
    )
    assert d.findings == ()


def test_it_calls_a_loss_scale_below_the_floor_a_collapse() -> None:
    d = _diag(
        [step(rk, 120, T0 + timedelta(seconds=1), loss_scale=0.5, overflow=True) for rk in range(4)]
    )
    (c,) = of_kind(d, "loss_scale_collapse")
    assert c.evidence["loss_scale"] == 0.5 and c.evidence["peak_loss_scale"] == 65536.0
