from __future__ import annotations

import json

from console.diagnosis.findings import ROOT_CAUSE, make_finding
from tests.diagnosis.factory import T0


def _f(**kw: object):
    base = dict(
        group="g",
        generation=1,
        kind="xid",
        subject="gpu:GPU-1",
        role=ROOT_CAUSE,
        severity="critical",
        summary="s",
        first_seen=T0,
    )
    base.update(kw)
    return make_finding(**base)


def test_it_derives_the_same_id_for_the_same_kind_and_subject() -> None:
    assert _f().id == _f(summary="other words").id


def test_it_derives_different_ids_for_different_subjects() -> None:
    assert _f().id != _f(subject="gpu:GPU-2").id


def test_it_keeps_the_fingerprint_stable_but_generation_scoped() -> None:
    assert _f().fingerprint == _f().fingerprint
    assert _f().fingerprint != _f(generation=2).fingerprint


def test_it_renders_json_safe_evidence_including_nan() -> None:
    d = _f(evidence={"loss": float("nan"), "at": T0, "ranks": (1, 2)}).to_dict()
    text = json.dumps(d, allow_nan=False)
    assert json.loads(text)["evidence"] == {"loss": "NaN", "at": T0.isoformat(), "ranks": [1, 2]}
