"""probe_divergence: a fixed input whose answer differs, across ranks and over time."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from console.diagnosis import ROOT_CAUSE, UNDETERMINED, diagnose
from tests.diagnosis.factory import (
    GROUP,
    T0,
    checkpoint,
    of_kind,
    rank_subject,
    snap,
    training,
)


def probe(rank: int | None, n: int | None, value: Any = None, **kw: Any) -> dict[str, Any]:
    rec = {"kind": "probe", "ts": kw.pop("ts", T0), "group": GROUP, "generation": 1,
           "probe": kw.pop("name", "fixed_batch_loss"), "rank": rank, "step": n}  # fmt: skip
    if value is not None:
        rec["value"] = value
    rec.update(kw)
    return rec


def _probed(ranks: int, answers: dict[int, dict[int, Any]]) -> list[dict[str, Any]]:
    """A healthy group plus probes: answers[step][rank] = value (or checksum string)."""
    recs = training(ranks=ranks)
    for n, by_rank in answers.items():
        ts = T0 - timedelta(seconds=120 - n)
        for rk, a in by_rank.items():
            if isinstance(a, str) and a != "NaN":
                recs.append(probe(rk, n, checksum=a, ts=ts))
            else:
                recs.append(probe(rk, n, a, ts=ts))
    return recs


def test_it_names_the_rank_whose_fixed_batch_loss_differs_from_the_majority() -> None:
    answers = {n: {0: 0.5, 1: 0.5, 2: 0.5, 3: 0.5} for n in (100, 110, 120)}
    answers[110][2] = answers[120][2] = 0.61
    d = diagnose(snap(_probed(4, answers)), T0)
    (f,) = of_kind(d, "probe_divergence")
    assert (f.subject, f.role) == (rank_subject(2), ROOT_CAUSE)
    assert f.evidence["first_step"] == 110 and f.evidence["divergent_steps"] == [110, 120]
    assert f.evidence["answer"] == 0.61 and f.evidence["majority_answer"] == 0.5
    assert f.recovery is not None and f.recovery.auto_restart_safe is False


def test_it_names_a_checksum_that_differs() -> None:
    answers = {120: {0: "aa11", 1: "aa11", 2: "bb22"}}
    (f,) = of_kind(diagnose(snap(_probed(3, answers)), T0), "probe_divergence")
    assert f.subject == rank_subject(2) and f.evidence["answer"] == "bb22"


def test_it_tolerates_reduction_order_noise() -> None:
    answers = {120: {0: 0.5, 1: 0.5 * (1 + 1e-7), 2: 0.5 * (1 - 1e-7)}}
    assert of_kind(diagnose(snap(_probed(3, answers)), T0), "probe_divergence") == []


def test_it_leaves_a_tie_undetermined_on_the_group() -> None:
    answers = {120: {0: 0.5, 1: 0.7}}
    (f,) = of_kind(diagnose(snap(_probed(2, answers)), T0), "probe_divergence")
    assert (f.subject, f.role) == (f"group:{GROUP}", UNDETERMINED)
    assert sorted(map(sorted, f.evidence["sides"])) == [[0], [1]]
    assert f.recovery is not None and f.recovery.auto_restart_safe is False


def test_it_forgets_a_divergence_the_newest_probe_no_longer_shows() -> None:
    answers = {110: {0: 0.5, 1: 0.5, 2: 0.9}, 120: {0: 0.4, 1: 0.4, 2: 0.4}}
    assert of_kind(diagnose(snap(_probed(3, answers)), T0), "probe_divergence") == []


def test_it_calls_a_non_finite_answer_on_every_rank_a_group_root_cause() -> None:
    nan = float("nan")
    answers = {110: {0: 0.5, 1: 0.5, 2: 0.5}, 115: {0: nan, 1: nan, 2: nan}}
    answers[120] = answers[115]
    recs = _probed(3, answers)
    ck = T0 - timedelta(seconds=4)
    recs += [
        checkpoint(ck, "ckpt-115", 115, "committed"),
        checkpoint(ck, "ckpt-115", 115, "verified"),
    ]
    d = diagnose(snap(recs), T0)
    (f,) = of_kind(d, "probe_divergence")
    assert (f.subject, f.role) == (f"group:{GROUP}", ROOT_CAUSE)
    assert f.evidence["first_step"] == 115
    assert d.checkpoint == "ckpt-100"  # the NaN-era checkpoint is no restore point


def test_it_names_the_one_rank_whose_answer_is_nan() -> None:
    answers = {120: {0: 0.5, 1: "NaN", 2: 0.5}}
    (f,) = of_kind(diagnose(snap(_probed(3, answers)), T0), "probe_divergence")
    assert f.subject == rank_subject(1) and f.evidence["answer"] == "non-finite"


def test_it_ignores_probes_of_an_older_generation() -> None:
    recs = _probed(3, {})
    recs += [{**probe(rk, 120, v), "generation": 0} for rk, v in ((0, 0.5), (1, 0.5), (2, 9.0))]
    assert of_kind(diagnose(snap(recs), T0), "probe_divergence") == []


def _serving_probe(worker: str, checksum: str, ts_s: float, version: str = "m1") -> dict:
    return {"kind": "probe", "ts": T0 + timedelta(seconds=ts_s), "group": GROUP, "generation": 1,
            "probe": "fixed_request", "worker": worker, "checksum": checksum,
            "model_version": version}  # fmt: skip


def test_it_names_the_serving_worker_whose_fixed_request_answer_differs() -> None:
    recs = [_serving_probe(w, "aa" if w != "w2" else "cc", 1) for w in ("w0", "w1", "w2")]
    (f,) = of_kind(diagnose(snap(recs), T0 + timedelta(seconds=2)), "probe_divergence")
    assert f.subject == f"worker:{GROUP}/w2" and f.role == ROOT_CAUSE


def test_it_names_a_serving_worker_whose_answer_changed_under_the_same_version() -> None:
    recs = [_serving_probe("w0", "aa", 1), _serving_probe("w0", "dd", 5)]
    (f,) = of_kind(diagnose(snap(recs), T0 + timedelta(seconds=6)), "probe_divergence")
    assert f.subject == f"worker:{GROUP}/w0" and f.evidence["earlier_answer"] == "aa"


def test_it_accepts_a_new_answer_after_a_version_switch() -> None:
    recs = [_serving_probe("w0", "aa", 1, "m1"), _serving_probe("w0", "dd", 5, "m2")]
    assert of_kind(diagnose(snap(recs), T0 + timedelta(seconds=6)), "probe_divergence") == []


def test_it_steps_the_restore_point_back_before_the_first_divergent_step() -> None:
    answers = {n: {0: 0.5, 1: 0.5, 2: 0.5} for n in (100, 110, 120)}
    answers[110][1] = answers[120][1] = 0.9
    recs = _probed(3, answers)
    ck = T0 - timedelta(seconds=5)
    recs += [
        checkpoint(ck, "ckpt-115", 115, "committed"),
        checkpoint(ck, "ckpt-115", 115, "verified"),
    ]
    d = diagnose(snap(recs), T0)
    assert d.checkpoint == "ckpt-100"  # ckpt-115 was written from corrupt state
    healthy = [r for r in recs if r["kind"] != "probe"]
    assert diagnose(snap(healthy), T0).checkpoint == "ckpt-115"
