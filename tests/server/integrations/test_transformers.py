"""A real `transformers.Trainer` (2 DDP/gloo CPU processes, a 2-layer GPT-2 built from a
config) reporting through `FaultlineCallback`, judged by the real service: ingest on
Postgres, then a diagnosis pass. Healthy: no incident, the run's steps, checkpoints and
transitions as the Trainer made them; NaN loss on rank 1: `nan_loss` naming rank 1."""

from __future__ import annotations

from pathlib import Path

import pytest

from console.models import ConsistencyGroup, Incident
from ingest.models import CheckpointRecord, StepRecord

from .jobs import judge, run

pytest.importorskip("transformers")
pytestmark = [pytest.mark.slow, pytest.mark.django_db]

JOB = "tests.server.integrations.hf_job"
STEPS = 8


def _torchrun_like(rank: int) -> dict[str, str]:
    return {"RANK": str(rank), "LOCAL_RANK": str(rank)}


def test_it_judges_a_healthy_trainer_run_healthy(post_batch, short_dir: Path, tmp_path: Path):
    records = run(JOB, short_dir, tmp_path / "out", group="hf-ok", launcher=_torchrun_like)
    judge(post_batch, records, "hf-ok")

    group = ConsistencyGroup.objects.get(name="hf-ok")
    assert list(Incident.objects.filter(group=group)) == []
    assert group.state == "completed" and group.world_size == 2
    steps = StepRecord.objects.filter(group=group)
    for rank in (0, 1):
        mine = steps.filter(rank=rank).order_by("step")
        assert [s.step for s in mine] == list(range(1, STEPS + 1))
        for s in mine:
            assert s.tokens == 4 * 32  # this rank's batch: 4 sequences of 32 tokens
            assert s.loss is not None and 3.0 < s.loss < 6.0  # ~ln(128) at random init
            assert s.lr is not None and s.lr > 0
            assert s.model_flops is not None and s.model_flops > 0
            assert s.phases and s.phases["compute"] > 0
        assert [s.grad_norm is not None for s in mine] == [True] * STEPS  # logging_steps=1
    phases = dict(
        CheckpointRecord.objects.filter(group=group).values_list("checkpoint_id", "phase")
    )
    assert set(phases) == {"checkpoint-4", "checkpoint-8"}
    summary = group.summary
    assert summary["newest_valid_checkpoint"] == "checkpoint-8"  # hashed: verified
    use = summary["utilisation"]
    assert use["ranks_with_flops"] == 2
    assert use["mfu"] is None and use["hfu"] is None  # a CPU run: absent, never 0
    assert use["absent"] == [{"reason": "no GPU", "ranks": 2}]


def test_it_names_nan_loss_on_the_rank_that_went_nan(post_batch, short_dir: Path, tmp_path):
    records = run(
        JOB, short_dir, tmp_path / "out", group="hf-nan", launcher=_torchrun_like,
        args=("--nan-rank", "1", "--nan-step", "4"),
    )  # fmt: skip
    judge(post_batch, records, "hf-nan")

    (incident,) = Incident.objects.filter(group__name="hf-nan", kind="nan_loss")
    evidence = incident.root_cause["evidence"]
    assert (evidence["first_rank"], evidence["first_step"]) == (1, 4)
