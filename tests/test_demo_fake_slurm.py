"""The demo's fake Slurm answers the real Slurm backend: drain, resume, requeue read back."""

from __future__ import annotations

from pathlib import Path

from agents.schedulers import execute
from agents.schedulers.slurm import Slurm
from faultline.demo import fake_slurm


def _run(env: dict[str, str], action: dict[str, object]) -> dict[str, object]:
    return dict(execute(Slurm(), action, node="node-001", timeout_s=10, env=env))


def test_it_drains_resumes_and_requeues_through_the_real_backend(tmp_path: Path) -> None:
    env = fake_slurm.install(tmp_path)
    drain = {"id": 5, "kind": "drain_node", "target": "node:node-002", "group": None,
             "generation": None, "params": {"node": "node-002", "reason": "Xid 79"}}  # fmt: skip
    out = _run(env, drain)
    assert out["status"] == "succeeded", out
    assert out["outcome"]["state"] == "applied"  # type: ignore[index]  # a dict
    node = fake_slurm.state(tmp_path)["nodes"]["node-002"]
    assert node == {"state": "IDLE+DRAIN", "reason": "faultline: 5 Xid 79"}
    resume = {**drain, "id": 6, "kind": "uncordon_node"}
    assert _run(env, resume)["status"] == "succeeded"
    assert fake_slurm.state(tmp_path)["nodes"]["node-002"]["state"] == "IDLE"
    requeue = {"id": 7, "kind": "restart_group", "target": "group:train-a", "group": "train-a",
               "generation": 1, "params": {"job": "12345", "reason": "from ckpt"}}  # fmt: skip
    out = _run(env, requeue)
    assert out["status"] == "succeeded", out
    assert fake_slurm.state(tmp_path)["jobs"]["12345"] == {"state": "PENDING", "restarts": 1}
