"""Correctness probes through ingest and the snapshot loader: stored, loaded, diagnosed."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from console import snapshots
from console.diagnosis import diagnose
from ingest.models import ProbeRecord, ServingWindow, StepRecord
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db


def _probe(rank: int, value: float | str, step: int = 20, **kw: object) -> dict:
    return {"kind": "probe", "group": "job", "generation": 1, "rank": rank, "step": step,
            "step_id": f"g1:s{step}", "probe": "fixed_batch_loss", "value": value,
            **kw}  # fmt: skip


def test_it_stores_probes_and_the_diagnosis_names_the_divergent_rank(post_batch):
    records = [{"kind": "transition", "group": "job", "generation": 1, "to_state": "running"}]
    records += [_probe(0, 0.5), _probe(1, 0.75), _probe(2, 0.5)]
    records += [{"kind": "step", "group": "job", "generation": 1, "rank": rk, "step": 20,
                 "step_id": "g1:s20", "duration_ms": 100.0} for rk in range(3)]  # fmt: skip
    assert post_batch(make_batch(records)).status_code == 202
    assert sorted(ProbeRecord.objects.values_list("rank", "value")) == [
        (0, 0.5), (1, 0.75), (2, 0.5),
    ]  # fmt: skip
    assert StepRecord.objects.count() == 3  # step_id is accepted (derivable, not stored)
    now = datetime.now(UTC)
    snap = snapshots.load(group_name="job", now=now)
    assert snap is not None and len(snap.probes) == 3
    (f,) = [f for f in diagnose(snap, now).findings if f.kind == "probe_divergence"]
    assert f.subject == "rank:job/1"


def test_it_keeps_a_nan_probe_and_a_serving_probe_without_generation(post_batch):
    serving = {"kind": "probe", "group": "chat", "worker": "w0", "probe": "fixed_request",
               "checksum": "ab12", "model_version": "m1"}  # fmt: skip
    window = {"kind": "serving", "group": "chat", "worker": "w0",
              "window": {"seconds": 5.0, "requests": 3, "first_request_id": "r-1",
                         "last_request_id": "r-3"}}  # fmt: skip
    assert post_batch(make_batch([_probe(0, "NaN"), serving, window])).status_code == 202
    nan = ProbeRecord.objects.get(group__name="job")
    assert nan.value != nan.value  # NaN kept as NaN
    kept = ProbeRecord.objects.get(group__name="chat")
    assert (kept.worker, kept.checksum, kept.rank, kept.stale) == ("w0", "ab12", None, False)
    assert kept.group.kind == "serving"
    stored = ServingWindow.objects.get(group__name="chat").window
    assert (stored["first_request_id"], stored["last_request_id"]) == ("r-1", "r-3")
