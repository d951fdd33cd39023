"""The serving and topology-change drill rows: their invariants can fail, and the real
serving loop keeps its declared semantics (a failover re-runs a request from the tokens the
client already has: each token index streamed once, the output unchanged)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from faultline.drill import invariants
from faultline.drill.matrix import MATRIX, NOT_HERE, REAL

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="no torch")


def _outcome(tokens: list[int], *, done: int = 1, duplicates: int = 0) -> dict[str, Any]:
    return {"tokens": tokens, "reference": [1, 2, 3], "n": 3, "duplicates": duplicates,
            "gaps": False, "done": [{"worker": "w0"}] * done}  # fmt: skip


def test_serving_invariants_fail_on_a_duplicate_a_double_finish_or_a_wrong_token() -> None:
    ok = invariants.serving({"r1": _outcome([1, 2, 3])}, drained=True)
    assert ok == {"every_request_finished": True, "streamed_tokens_finished_once": True,
                  "outputs_match_reference": True}  # fmt: skip
    dup = invariants.serving({"r1": _outcome([1, 2, 3], duplicates=1)}, drained=True)
    assert dup["streamed_tokens_finished_once"] is False
    twice = invariants.serving({"r1": _outcome([1, 2, 3], done=2)}, drained=True)
    assert twice["streamed_tokens_finished_once"] is False
    wrong = invariants.serving({"r1": _outcome([1, 2, 4])}, drained=True)
    assert wrong["outputs_match_reference"] is False
    lost = invariants.serving({"r1": _outcome([1], done=0)}, drained=False)
    assert lost["every_request_finished"] is False


def test_the_serving_and_topology_rows_run_here_for_real() -> None:
    rows = {s.name: s for s in MATRIX}
    for name in ("serving_worker_exit", "canary_switch", "topology_change", "topology_change_tp"):
        assert rows[name].runs == REAL
    assert sum(1 for s in MATRIX if s.quick and s.layer == "serving") <= 1
    for spec in MATRIX:
        if spec.runs == NOT_HERE:
            assert spec.why, spec.name


@needs_torch
def test_a_resumed_request_continues_exactly_where_the_dead_worker_stopped() -> None:
    from faultline.drill.serving_loop import TinyLM, generate

    model = TinyLM("toy-v1")
    prompt = list(range(12))
    whole = generate(model, prompt, 24)
    assert generate(model, prompt, 24, resume=whole[:9]) == whole
    assert generate(TinyLM("toy-v1", "lora-kv2"), prompt, 24) != whole  # the adapter matters


@needs_torch
@pytest.mark.slow
@pytest.mark.torch
def test_a_killed_worker_s_requests_finish_once_on_its_peer(tmp_path: Path) -> None:
    """Real workers (no service: the reporter drops its records), the drill's router."""
    from faultline.drill.serving_drill import Fleet

    drill = SimpleNamespace(work=tmp_path, group="serve-test", socket=tmp_path / "none.sock")
    fleet = Fleet(drill, 2)
    try:
        for name in fleet.names:
            fleet.start(name)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(fleet.ready(n) for n in fleet.names):
            time.sleep(0.1)
        assert all(fleet.ready(n) for n in fleet.names), fleet.why()
        fleet.serve()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(fleet.state("w1").get("active", [])) < 2:
            time.sleep(0.01)
        fleet.procs["w1"].send_signal(signal.SIGKILL)
        fleet.procs["w1"].wait(5)
        moved, _, _ = fleet.fail_over("w1")
        assert moved >= 2
        assert any(n > 0 for n in fleet.failed_over.values())  # some were mid-stream
        time.sleep(1.0)
        assert fleet.drain()
        held = invariants.serving(fleet.outcomes(), True)
        assert held == dict.fromkeys(held, True), held
        # A naive failover (re-run from scratch, as if nothing was delivered) streams the
        # delivered tokens twice: the invariant says so.
        rid = next(r for r, n in fleet.failed_over.items() if n > 0)
        fleet.stop_flag.clear()
        fleet._send(rid, "w0")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(fleet.client(rid)["done"]) < 2:
            time.sleep(0.05)
        broken = invariants.serving(fleet.outcomes(), True)
        assert broken["streamed_tokens_finished_once"] is False
    finally:
        fleet.stop_all()


# -- topology change ----------------------------------------------------------------------
class _Job:
    def __init__(self, root: Path, generation: int, world: int) -> None:
        self.status = root / f"gen{generation}"
        self.status.mkdir(parents=True)
        self.world, self.generation = world, generation

    def alive(self) -> bool:
        return False

    def log(self, step: int, rank: int, lo: int, n: int, loss: float, tp: int = 1) -> None:
        line = {"step": step, "samples": [lo, lo + n], "loss": loss, "tp": tp}
        with open(self.status / f"rank{rank}.steps", "a") as fh:
            fh.write(json.dumps(line) + "\n")


def _resize_case(
    tmp_path: Path, *, shift: int = 0, loaded: str = "abc", tp: int = 1, split: bool = False
) -> dict[str, bool]:
    """Generation 1: 2 ranks to step 8 (checkpoint at 5); generation 2: 1 rank from 5.
    `tp` 2: generation 1 is one TP-2 replica (both ranks read the whole slice; `split`:
    they wrongly read halves, as if DP)."""
    old, new = _Job(tmp_path, 1, 2), _Job(tmp_path, 2, 1)
    for step in range(1, 9):
        for rank in range(2):
            if tp == 1 or split:
                old.log(step, rank, (step - 1) * 64 + rank * 32, 32, 1.0 / step, tp=tp)
            else:
                old.log(step, rank, (step - 1) * 64, 64, 1.0 / step, tp=tp)
    for step in range(6, 12):
        new.log(step, 0, (step - 1) * 64 + shift, 64, 1.0 / step)
    (new.status / "restored-rank0.json").write_text(json.dumps({
        "manifest_cursor": 5 * 64, "state_cursor": 5 * 64, "manifest_world": 2, "world": 1,
        "manifest_tp": tp, "saved_param_sha": "abc", "loaded_param_sha": loaded,
    }))  # fmt: skip
    result = SimpleNamespace(
        measured={"resume_step": 5, "last_step": 8, "expected_resume": 5, "global_batch": 64,
                  "old_tp": tp}
    )  # fmt: skip
    drill = SimpleNamespace(
        result=result,
        restart_count=1,
        group_info=lambda: {"generation": 2, "restart_count": 1, "world_size": 1},
    )
    return invariants.resized(drill, old, new, false_findings=[])


def test_resize_invariants_hold_for_a_faithful_resize(tmp_path: Path) -> None:
    held = _resize_case(tmp_path)
    assert held == dict.fromkeys(held, True), held


def test_resize_invariants_catch_a_shifted_cursor_and_a_wrong_load(tmp_path: Path) -> None:
    shifted = _resize_case(tmp_path / "a", shift=32)  # the new world skips 32 samples
    assert shifted["global_batch_per_step_kept"] is False
    assert shifted["replayed_losses_match"] is True  # (the fake losses do not see data)
    wrong = _resize_case(tmp_path / "b", loaded="def")
    assert wrong["checkpoint_maps_onto_new_world"] is False


def test_resize_invariants_hold_for_a_tensor_parallel_job_and_catch_a_split_slice(
    tmp_path: Path,
) -> None:
    held = _resize_case(tmp_path / "tp", tp=2)
    assert held == dict.fromkeys(held, True), held
    # TP ranks that read halves of the batch (a DP split under a TP label): caught.
    split = _resize_case(tmp_path / "split", tp=2, split=True)
    assert split["global_batch_per_step_kept"] is False


def _torchrun(args: list[str], nproc: int, cwd: Path) -> None:
    run = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           "--master-port", str(_free_port())]  # fmt: skip
    cmd = [*run, "-m", "faultline.drill.resize_trainer", *args]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    env.pop("FAULTLINE_SOCKET", None)  # no agent: the reporter drops its records
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _losses(path: Path) -> dict[int, float]:
    return {
        int(d["step"]): float(d["loss"]) for d in map(json.loads, path.read_text().splitlines())
    }


@needs_torch
@pytest.mark.slow
@pytest.mark.torch
def test_a_tensor_parallel_checkpoint_restores_onto_one_rank_with_its_halves_merged(
    tmp_path: Path,
) -> None:
    """Real gloo, real DCP: TP 2 saves each rank's halves as DTensor shards; one rank with
    TP 1 loads the whole weights (the checksum saved over the gathered weights), replays
    the same losses, and TP 2 computes what the unsharded model computes (DP 2)."""
    ck, tp_s, dp_s, new_s = (tmp_path / d for d in ("ck", "tp", "dp", "new"))
    for d in (ck, tp_s, dp_s, new_s):
        d.mkdir()
    common = ["--group", "g", "--steps", "8", "--step-sleep", "0", "--ckpt-every", "4"]
    _torchrun([*common, "--generation", "1", "--tp", "2", "--ckpt-root", str(ck),
               "--status-dir", str(tp_s)], 2, tmp_path)  # fmt: skip
    manifest = json.loads((ck / "g-step_000004" / "faultline.json").read_text())
    assert (manifest["world_size"], manifest["tp"], manifest["dp"]) == (2, 2, 1)
    assert len(list((ck / "g-step_000004").glob("*.distcp"))) == 2  # one shard file per rank
    tp_rank0, tp_rank1 = _losses(tp_s / "rank0.steps"), _losses(tp_s / "rank1.steps")
    assert tp_rank0 == tp_rank1  # the TP ranks agree on the global loss
    _torchrun([*common, "--generation", "1", "--ckpt-root", str(tmp_path / "ck-dp"),
               "--status-dir", str(dp_s)], 2, tmp_path)  # fmt: skip
    dp = _losses(dp_s / "rank0.steps")
    assert max(abs(tp_rank0[s] - dp[s]) / dp[s] for s in dp) < 1e-4
    resume = ["--resume", str(ck / "g-step_000004")]
    _torchrun([*common, "--generation", "2", "--ckpt-root", str(tmp_path / "ck-new"), *resume,
               "--status-dir", str(new_s)], 1, tmp_path)  # fmt: skip
    restored = json.loads((new_s / "restored-rank0.json").read_text())
    assert restored["saved_param_sha"] == restored["loaded_param_sha"]
    assert restored["manifest_tp"] == 2 and restored["world"] == 1
    replayed = _losses(new_s / "rank0.steps")
    assert min(replayed) == 5
    assert max(abs(replayed[s] - tp_rank0[s]) / tp_rank0[s] for s in range(5, 9)) < 1e-4
