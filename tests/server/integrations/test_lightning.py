"""A real Lightning `Trainer` (2 DDP/gloo CPU processes started as a launcher starts them,
a 2-layer transformer built in memory) reporting through `FaultlineCallback`, judged by
the real service: ingest on Postgres, then a diagnosis pass. Healthy: no incident, the
run's steps, checkpoints and transitions; NaN loss on rank 0: `nan_loss` naming rank 0."""

from __future__ import annotations

from pathlib import Path

import pytest

from console.models import ConsistencyGroup, Incident
from ingest.models import CheckpointRecord, StepRecord

from .jobs import judge, run

pytest.importorskip("lightning")
pytestmark = [pytest.mark.slow, pytest.mark.django_db]

JOB = "tests.server.integrations.lightning_job"
STEPS = 8


def _launcher(rank: int) -> dict[str, str]:
    # Lightning's own environment for processes started outside it: one node, two devices.
    return {"LOCAL_RANK": str(rank), "NODE_RANK": "0"}


def test_it_judges_a_healthy_lightning_run_healthy(post_batch, short_dir: Path, tmp_path):
    records = run(JOB, short_dir, tmp_path / "out", group="pl-ok", launcher=_launcher)
    judge(post_batch, records, "pl-ok")

    group = ConsistencyGroup.objects.get(name="pl-ok")
    assert list(Incident.objects.filter(group=group)) == []
    assert group.state == "completed" and group.world_size == 2
    steps = StepRecord.objects.filter(group=group)
    for rank in (0, 1):
        mine = list(steps.filter(rank=rank).order_by("step"))
        assert [s.step for s in mine] == list(range(1, STEPS + 1))
        for s in mine:
            assert s.tokens == 4 * 32
            assert s.loss is not None and 3.0 < s.loss < 7.0
            assert s.grad_norm is not None and s.grad_norm > 0
            assert s.lr == pytest.approx(1e-3)
            assert s.model_flops is not None and s.model_flops > 0
    # Both saves were reported by the rank that wrote them (rank 0) with the file's size;
    # the last one kept is hashed: the group's newest valid checkpoint.
    saved = CheckpointRecord.objects.filter(group=group)
    assert {c.checkpoint_id for c in saved} >= {"epoch_0-step_8"}
    assert group.summary["newest_valid_checkpoint"] == "epoch_0-step_8"
    assert group.summary["utilisation"]["mfu"] is None  # CPU: absent, never 0


def test_it_names_nan_loss_on_the_rank_that_went_nan(post_batch, short_dir: Path, tmp_path):
    records = run(
        JOB, short_dir, tmp_path / "out", group="pl-nan", launcher=_launcher,
        args=("--nan-rank", "0", "--nan-step", "5"),
    )  # fmt: skip
    judge(post_batch, records, "pl-nan")

    (incident,) = Incident.objects.filter(group__name="pl-nan", kind="nan_loss")
    evidence = incident.root_cause["evidence"]
    assert (evidence["first_rank"], evidence["first_step"]) == (0, 5)
