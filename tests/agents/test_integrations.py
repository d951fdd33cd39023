"""The framework-neutral half of the integrations (agents.integrations.common) and what the
agent package loads: steps assembled from hook times and micro-batches, the run's
transitions, checkpoints reported from what the save wrote, FLOPs from the model."""

from __future__ import annotations

import hashlib
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agents import flops
from agents.integrations import common
from agents.integrations.common import Session
from agents.reporter import Reporter

from .conftest import validate

ROOT = Path(__file__).resolve().parents[2]


class _Capture(Reporter):
    def __init__(self, rank: int = 0) -> None:
        super().__init__(socket_path="/nonexistent/faultline.sock", group="g", rank=rank)
        self.records: list[dict[str, Any]] = []

    def _send(self, rec: dict[str, Any]) -> None:
        self.records.append(rec)

    def kinds(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["kind"] == kind]


def test_the_agent_package_loads_no_framework_and_no_torch() -> None:
    code = (
        "import sys, agents, agents.reporter, agents.flops, agents.integrations, "
        "agents.integrations.common, agents.agent\n"
        "loaded = {'torch', 'transformers', 'lightning'} & set(sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


@pytest.mark.parametrize(
    ("module", "extra"), [("transformers", "transformers"), ("lightning", "lightning")]
)
def test_an_integration_without_its_framework_names_the_extra(module: str, extra: str) -> None:
    code = (
        f"import sys; sys.modules[{module!r}] = None\n"
        f"try:\n    import agents.integrations.{module}\n"
        "except ImportError as exc:\n    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    assert f"pip install 'faultline[{extra}]'" in out


class _Optimizer:
    param_groups = [{"lr": 3e-4}]


def _one_step(session: Session, losses: list[float], batches: list[tuple[int, int]]) -> dict:
    session.step_begin()
    for (tokens, seq), loss in zip(batches, losses, strict=True):
        session.micro_batch(tokens, seq)
        session.loss(loss)
    session.pre_optimizer(_Optimizer())
    session.optimizer_done()
    return session.step_end(1, grad_norm=0.5)


def test_it_assembles_a_step_from_its_micro_batches_and_hook_times() -> None:
    rep = _Capture()
    session = Session(flops_per_token=1000.0, rep=rep)
    session.begin(rank=0, world=2, group_hint="run")
    fields = _one_step(session, [2.0, 3.0], [(128, 32), (64, 16)])
    assert (fields["tokens"], fields["loss"], fields["lr"]) == (192, 2.5, 3e-4)
    assert fields["model_flops"] == fields["hw_flops"] == 192 * 1000.0
    assert set(fields["phases"]) == {"input", "compute", "optimizer"}
    assert sum(fields["phases"].values()) <= fields["duration_ms"] + 0.01
    session.send(fields)
    validate(rep.records)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_one_non_finite_micro_batch_makes_the_steps_loss_non_finite(bad: float) -> None:
    # An average must not hide it: a NaN among finite losses stays a NaN.
    session = Session(flops_per_token=1.0, rep=_Capture())
    session.begin(rank=1, world=2, group_hint="run")
    fields = _one_step(session, [2.0, bad, 2.0], [(8, 4)] * 3)
    assert not math.isfinite(fields["loss"])


def test_it_counts_recomputation_in_the_hardware_flops() -> None:
    session = Session(flops_per_token=600.0, recompute=True, rep=_Capture())
    session.begin(rank=0, world=1, group_hint="run")
    fields = _one_step(session, [1.0], [(10, 5)])
    assert fields["hw_flops"] == flops.hardware_flops(6000.0, recompute=True)


def test_a_save_between_steps_goes_to_the_next_steps_checkpoint_phase() -> None:
    session = Session(flops_per_token=1.0, rep=_Capture())
    session.begin(rank=0, world=1, group_hint="run")
    _one_step(session, [1.0], [(1, 1)])
    session.checkpoint_took(250.0)
    fields = _one_step(session, [1.0], [(1, 1)])
    assert fields["phases"]["checkpoint"] == 250.0
    assert "checkpoint" not in _one_step(session, [1.0], [(1, 1)])["phases"]


@pytest.mark.parametrize("rank", [0, 1])
def test_only_rank_zero_speaks_for_the_group(rank: int) -> None:
    rep = _Capture(rank)
    session = Session(rep=rep)
    session.begin(rank=rank, world=4, group_hint="run")
    session.end()
    got = [(t["to_state"], t["world_size"]) for t in rep.kinds("transition")]
    assert got == ([("running", 4), ("completed", 4)] if rank == 0 else [])
    validate(rep.records)


def test_it_names_the_group_after_the_run_when_nothing_else_does(monkeypatch) -> None:
    monkeypatch.delenv("FAULTLINE_GROUP", raising=False)
    rep = Reporter(socket_path="/nonexistent/faultline.sock")
    Session(rep=rep).begin(rank=0, world=1, group_hint="my run (v2)")
    assert rep.group == "my_run_v2"


def test_an_exception_on_its_way_out_is_this_ranks_exit() -> None:
    rep = _Capture(rank=1)
    session = Session(rep=rep)
    session.begin(rank=1, world=2, group_hint="run")
    session.failed(MemoryError("CUDA out of memory"))
    (exit_,) = rep.kinds("process")
    assert (exit_["event"], exit_["reason"], exit_["rank"]) == ("exited", "oom", 1)
    assert exit_.pop("message") == "CUDA out of memory"  # the agent keeps it off the wire
    validate(rep.records)


# -- checkpoints ----------------------------------------------------------------------------


@pytest.fixture
def fast_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common, "SETTLE_S", 0.2)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_it_reports_a_directory_once_other_ranks_files_have_landed(tmp_path, fast_settle):
    ckpt = tmp_path / "checkpoint-4"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(b"m" * 1000)
    rep = _Capture()
    session = Session(rep=rep)
    session.begin(rank=0, world=2, group_hint="run")
    session.checkpoint(ckpt, step=4, duration_ms=12.5, fmt="transformers")
    (ckpt / "rng_state_1.pth").write_bytes(b"r" * 10)  # rank 1, a moment later
    session.wait_verified(10)
    committed, verified = rep.kinds("checkpoint")
    assert (committed["phase"], committed["checkpoint_id"], committed["step"]) == (
        "committed", "checkpoint-4", 4,
    )  # fmt: skip
    assert committed["duration_ms"] == 12.5
    assert [s["path"] for s in committed["manifest"]["shards"]] == [
        "model.safetensors", "rng_state_1.pth",
    ]  # fmt: skip
    assert verified["phase"] == "verified"
    assert {s["path"]: s["sha256"] for s in verified["manifest"]["shards"]} == {
        "model.safetensors": _sha(ckpt / "model.safetensors"),
        "rng_state_1.pth": _sha(ckpt / "rng_state_1.pth"),
    }
    validate(rep.records)


def test_commits_go_out_in_save_order_whichever_directory_settles_first(
    tmp_path: Path, fast_settle
) -> None:
    """An earlier save whose directory keeps changing (another rank still writing) is
    committed before a later save that held still at once: never after it, which ingest
    would read as a checkpoint older than the newest commit."""
    import threading
    import time

    early, late = tmp_path / "checkpoint-4", tmp_path / "checkpoint-8"
    for ckpt in (early, late):
        ckpt.mkdir()
        (ckpt / "model.safetensors").write_bytes(b"m" * 100)
    rep = _Capture()
    session = Session(rep=rep)
    session.begin(rank=0, world=2, group_hint="run")
    session.verify_checkpoints = False
    session.checkpoint(early, step=4, duration_ms=1.0, fmt="transformers")
    session.checkpoint(late, step=8, duration_ms=1.0, fmt="transformers")

    def slow_rank() -> None:  # keeps checkpoint-4's listing moving for ~1 s
        for i in range(5):
            (early / f"rng_state_{i}.pth").write_bytes(b"r")
            time.sleep(0.15)

    writer = threading.Thread(target=slow_rank)
    writer.start()
    writer.join()
    session.wait_verified(10)
    committed = [r["checkpoint_id"] for r in rep.kinds("checkpoint") if r["phase"] == "committed"]
    assert committed == ["checkpoint-4", "checkpoint-8"]


def test_it_reports_a_single_file_save_by_its_name(tmp_path: Path, fast_settle) -> None:
    path = tmp_path / "epoch=0-step=8.ckpt"
    path.write_bytes(b"x" * 4096)
    rep = _Capture()
    session = Session(rep=rep)
    session.begin(rank=0, world=1, group_hint="run")
    session.checkpoint(path, step=8, duration_ms=3.0, fmt="lightning")
    session.wait_verified(10)
    committed, verified = rep.kinds("checkpoint")
    assert committed["checkpoint_id"] == "epoch_0-step_8"  # the contract's name alphabet
    assert committed["manifest"]["shards"] == [{"path": path.name, "bytes": 4096}]
    assert verified["manifest"]["shards"][0]["sha256"] == _sha(path)
    validate(rep.records)


def test_a_checkpoint_the_framework_rotated_away_is_gone_not_corrupt(
    tmp_path: Path, fast_settle, monkeypatch
) -> None:
    path = tmp_path / "step-4.ckpt"
    path.write_bytes(b"x" * 100)

    def rotated(p: Path, rate: int, stop: Any) -> str:
        p.unlink()  # the next save's retention deleted it before it was hashed
        raise FileNotFoundError(p)

    monkeypatch.setattr(common, "hash_file", rotated)
    rep = _Capture()
    session = Session(rep=rep)
    session.begin(rank=0, world=1, group_hint="run")
    session.checkpoint(path, step=4, duration_ms=1.0, fmt="lightning")
    session.wait_verified(10)
    assert [c["phase"] for c in rep.kinds("checkpoint")] == ["committed"]


def test_a_shard_that_changed_after_the_save_is_corrupt_and_named(
    tmp_path: Path, fast_settle, monkeypatch
) -> None:
    path = tmp_path / "step-4.ckpt"
    path.write_bytes(b"x" * 100)
    real = common.hash_file

    def torn(p: Path, rate: int, stop: Any) -> str:
        p.write_bytes(b"x" * 50)  # overwritten, short, after the save returned
        return real(p, rate, stop)

    monkeypatch.setattr(common, "hash_file", torn)
    rep = _Capture()
    session = Session(rep=rep)
    session.begin(rank=0, world=1, group_hint="run")
    session.checkpoint(path, step=4, duration_ms=1.0, fmt="lightning")
    session.wait_verified(10)
    corrupt = rep.kinds("checkpoint")[-1]
    assert corrupt["phase"] == "corrupt" and "step-4.ckpt" in corrupt["detail"]
    validate(rep.records)


def test_it_can_leave_verification_to_the_node_agent(tmp_path: Path, fast_settle) -> None:
    path = tmp_path / "last.ckpt"
    path.write_bytes(b"x")
    rep = _Capture()
    session = Session(rep=rep, verify_checkpoints=False)
    session.begin(rank=0, world=1, group_hint="run")
    session.checkpoint(path, step=1, duration_ms=1.0, fmt="lightning")
    session.wait_verified(10)
    assert [c["phase"] for c in rep.kinds("checkpoint")] == ["committed"]


# -- shapes and FLOPs (torch) --------------------------------------------------------------


def test_it_reads_token_ids_from_the_shapes_a_batch_comes_in() -> None:
    torch = pytest.importorskip("torch")
    ids = torch.zeros((4, 32), dtype=torch.long)
    assert common.batch_tokens({"input_ids": ids, "labels": ids}) == (128, 32)
    assert common.batch_tokens((torch.zeros(4, 7), ids)) == (128, 32)  # features first
    assert common.batch_tokens([ids[:2]]) == (64, 32)
    assert common.batch_tokens(torch.zeros((4, 32))) is None  # floats are not token ids
    assert common.batch_tokens(torch.zeros(8, dtype=torch.long)) is None  # no sequence
    assert common.batch_tokens("text") is None


def test_it_counts_the_weights_that_do_a_matmul_per_token() -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Embedding(100, 8), torch.nn.Linear(8, 8))
    assert common.model_shape(model) == (8 * 8 + 8, None, None)  # no config: no L, d


@pytest.mark.parametrize("seq", [32, 128])
def test_the_formula_matches_what_torch_counts_for_a_real_gpt2(seq: int) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=seq, vocab_size=128,
                        bos_token_id=0, eos_token_id=0)  # fmt: skip
    model = GPT2LMHeadModel(config)
    params, layers, hidden = common.model_shape(model)
    assert (layers, hidden) == (2, 64)
    ids = torch.randint(0, 128, (4, seq))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=ids).loss.backward()
    formula = 4 * seq * flops.model_flops_per_token(params, layers=2, hidden=64, seq_len=seq)
    # Within 2 %: biases and norms are counted as weights but do no matmul.
    assert 0.98 < counter.get_total_flops() / formula <= 1.0


def test_the_integrations_survive_their_own_bugs(monkeypatch, caplog) -> None:
    with common.never_raises("a part"):
        raise RuntimeError("integration bug")
    with common.never_raises("a part"):
        raise RuntimeError("again")  # logged once per part, not per step
    assert sum("a part" in r.getMessage() for r in caplog.records) == 1
    assert os.environ.get("FAULTLINE_GROUP") != "must-not-leak"


def test_a_session_survives_the_pickling_of_a_spawn_strategy(tmp_path: Path) -> None:
    import pickle

    session = Session(flops_per_token=10.0, rep=_Capture())
    session.begin(rank=0, world=2, group_hint="run")
    copy = pickle.loads(pickle.dumps(session))  # noqa: S301 -- our own bytes, just made
    assert copy.rep is None and copy.flops_per_token == 10.0  # the child makes its own
    copy.rep = _Capture()
    path = tmp_path / "last.ckpt"
    path.write_bytes(b"x")
    copy.checkpoint(path, step=1, duration_ms=1.0, fmt="lightning")
    copy.wait_verified(10)
    assert [c["phase"] for c in copy.rep.kinds("checkpoint")] == ["committed", "verified"]


def test_the_lightning_callback_pickles_before_fit() -> None:
    pytest.importorskip("lightning")
    import pickle

    from agents.integrations.lightning import FaultlineCallback

    callback = pickle.loads(pickle.dumps(FaultlineCallback(layers=2, hidden=64)))  # noqa: S301
    assert callback.session.layers == 2


def test_the_frameworks_rank_wins_over_the_one_a_reporter_was_made_with() -> None:
    rep = _Capture(rank=0)  # made before the framework knew (RANK unset, say)
    session = Session(flops_per_token=1.0, rep=rep)
    session.begin(rank=3, world=4, group_hint="run")
    session.send(_one_step(session, [1.0], [(4, 2)]))
    assert [r["rank"] for r in rep.kinds("step")] == [3]
