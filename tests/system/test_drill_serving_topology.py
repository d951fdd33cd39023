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
    topology = [f"topology_change{x}" for x in ("", "_tp", "_pp", "_ep", "_ep4", "_pp4")]
    for name in ("serving_worker_exit", "canary_switch", *topology):
        assert rows[name].runs == REAL
    assert sum(1 for s in MATRIX if s.quick and s.layer == "serving") <= 1
    for spec in MATRIX:
        if spec.runs == NOT_HERE:
            assert spec.why, spec.name


def test_the_faults_own_incident_is_no_finding_of_the_resized_world() -> None:
    """A fast box: process_exit opened 0.4 s after the kill and the new world launched
    0.5 s later, inside new_incidents' 1 s clock slack; the fault's own incident was
    reported as a false finding of the resized world (3 of 4 topology rows failed)."""
    from datetime import UTC, datetime

    from faultline.drill.runner import Drill
    from faultline.drill.topology import findings_after

    launched = time.time()

    def opened(at: float) -> str:
        return datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z")

    incidents = [
        {"id": 7, "kind": "process_exit", "subject": "rank:g/1", "state": "open",
         "role": "root_cause", "opened_at": opened(launched - 0.5)},
        {"id": 8, "kind": "rank_missing", "subject": "rank:g/1", "state": "open",
         "role": "root_cause", "opened_at": opened(launched + 3.0)},
    ]  # fmt: skip

    class _Drill:
        """The two reads findings_after makes, with the drill's own clock slack."""

        def incidents(self) -> list[dict[str, Any]]:
            return incidents

        new_incidents = Drill.new_incidents

    drill = _Drill()
    assert findings_after(drill, launched, before={7}) == ["rank_missing@rank:g/1"]
    assert findings_after(drill, launched, before=set()) == [
        "process_exit@rank:g/1", "rank_missing@rank:g/1",
    ]  # fmt: skip


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

    def log(self, step: int, rank: int, lo: int, n: int, loss: float, **shape: Any) -> None:
        line = {"step": step, "samples": [lo, lo + n], "loss": loss, **shape}
        with open(self.status / f"rank{rank}.steps", "a") as fh:
            fh.write(json.dumps(line) + "\n")


def _resize_case(
    tmp_path: Path,
    *,
    shift: int = 0,
    loaded: str = "abc",
    tp: int = 1,
    pp: int = 1,
    ep: int = 1,
    split: bool = False,
    idle_expert: bool = False,
    manifest: dict[str, Any] | None = None,
) -> dict[str, bool]:
    """Generation 1: 2 ranks to step 8 (checkpoint at 5); generation 2: 1 rank from 5.
    `tp` or `pp` 2: generation 1 is one TP-2 replica or 2-stage pipeline (both ranks read
    the whole slice; `split`: they wrongly read halves, as if DP); `ep` 2: two EP ranks,
    each its own half, each logging the tokens its expert took (`idle_expert`: the gate
    sent rank 1's expert none)."""
    old, new = _Job(tmp_path, 1, 2), _Job(tmp_path, 2, 1)
    shared = tp * pp > 1 and not split
    for step in range(1, 9):
        for rank in range(2):
            extra: dict[str, Any] = {"tp": tp, "pp": pp, "ep": ep}
            if ep > 1:
                extra["routed"] = {str(rank): 0 if idle_expert and rank == 1 else 30 + rank}
            if shared:
                old.log(step, rank, (step - 1) * 64, 64, 1.0 / step, **extra)
            else:
                old.log(step, rank, (step - 1) * 64 + rank * 32, 32, 1.0 / step, **extra)
    for step in range(6, 12):
        new.log(step, 0, (step - 1) * 64 + shift, 64, 1.0 / step)
    (new.status / "restored-rank0.json").write_text(json.dumps({
        "manifest_cursor": 5 * 64, "state_cursor": 5 * 64, "manifest_world": 2, "world": 1,
        "manifest_tp": tp, "manifest_pp": pp, "manifest_ep": ep,
        "saved_param_sha": "abc", "loaded_param_sha": loaded, **(manifest or {}),
    }))  # fmt: skip
    result = SimpleNamespace(
        measured={"resume_step": 5, "last_step": 8, "expected_resume": 5, "global_batch": 64,
                  "old_tp": tp, "old_pp": pp, "old_ep": ep, "experts": 2 if ep > 1 else 0}
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


def test_resize_invariants_hold_for_pipeline_and_expert_parallel_jobs(tmp_path: Path) -> None:
    for name, shape in (("pp", {"pp": 2}), ("ep", {"ep": 2})):
        held = _resize_case(tmp_path / name, **shape)
        assert held == dict.fromkeys(held, True), (name, held)
    assert "every_expert_took_tokens" in _resize_case(tmp_path / "ep2", ep=2)
    # Pipeline stages that read halves of the batch: caught, as for TP.
    split = _resize_case(tmp_path / "pp-split", pp=2, split=True)
    assert split["global_batch_per_step_kept"] is False
    # An MoE whose gate sent one expert nothing tested nothing of EP: not a pass.
    idle = _resize_case(tmp_path / "idle", ep=2, idle_expert=True)
    assert idle["every_expert_took_tokens"] is False
    # A manifest that names another shape than the world that wrote it: not a faithful map.
    mislabelled = _resize_case(tmp_path / "pp-bad", pp=2, manifest={"manifest_pp": 1})
    assert mislabelled["checkpoint_maps_onto_new_world"] is False


def test_the_resize_trainer_refuses_a_shape_it_cannot_run() -> None:
    from faultline.drill.resize_trainer import _shape_error

    assert _shape_error(2, 1, 1, 1, 0) is None
    assert _shape_error(2, 1, 2, 1, 0) is None
    assert _shape_error(2, 1, 1, 2, 2) is None
    assert "at most one" in (_shape_error(4, 2, 2, 1, 0) or "")
    assert "2 layers" in (_shape_error(4, 1, 4, 1, 0) or "")  # 4 stages of a 2-layer MLP
    assert _shape_error(4, 1, 4, 1, 0, layers=4) is None
    assert "2 layers" not in (_shape_error(2, 1, 2, 1, 0, layers=4) or "")
    assert "4 layers" in (_shape_error(4, 1, 3, 1, 0, layers=4) or "")  # 3 does not divide 4
    assert "two-layer" in (_shape_error(2, 2, 1, 1, 0, layers=4) or "")  # TP splits 2 layers
    assert "--experts" in (_shape_error(2, 1, 1, 2, 0) or "")  # EP without experts
    assert "--experts" in (_shape_error(4, 1, 1, 4, 2) or "")  # more EP ranks than experts
    assert "global batch" in (_shape_error(3, 1, 1, 1, 0) or "")


def _torchrun(args: list[str], nproc: int, cwd: Path) -> None:
    run = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           "--master-port", str(_free_port())]  # fmt: skip
    cmd = [*run, "-m", "faultline.drill.resize_trainer", *args]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    env.pop("FAULTLINE_SOCKET", None)  # no agent: the reporter drops its records
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, _failure(done)


def _failure(done: subprocess.CompletedProcess[str]) -> str:
    """What a failed torchrun said: every line that names an error (a rank's traceback
    can scroll out of a tail when the other rank aborts after it), then the tails."""
    lines = (done.stdout + done.stderr).splitlines()
    marks = ("Error", "Traceback", "terminate", "abort", "Signal", "exitcode", "failed")
    named = [ln for ln in lines if any(m in ln for m in marks)]
    return "\n".join([*named[:80], "--- stdout tail:", done.stdout[-4000:],
                      "--- stderr tail:", done.stderr[-8000:]])  # fmt: skip


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


@needs_torch
@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize(
    ("flags", "reference", "restore"),
    [
        # a 2-stage pipeline computes what the unsplit model computes on DP 2
        (["--pp", "2"], ([], 2), []),
        # a 2-expert MoE with one expert per rank computes what one rank's MoE computes
        (["--experts", "2", "--ep", "2"], (["--experts", "2"], 1), ["--experts", "2"]),
    ],
    ids=["pp", "ep"],
)
def test_a_pipeline_or_expert_parallel_checkpoint_restores_onto_one_rank(
    tmp_path: Path, flags: list[str], reference: tuple[list[str], int], restore: list[str]
) -> None:
    """Real gloo, real DCP: each rank saves the stage or expert it holds (the EP gate on
    both); one rank loads the whole model with the checksum saved over the gathered
    weights and replays the same losses; split, the job computes the unsplit model's."""
    ck, old_s, ref_s, new_s = (tmp_path / d for d in ("ck", "old", "ref", "new"))
    for d in (ck, old_s, ref_s, new_s):
        d.mkdir()
    common = ["--group", "g", "--steps", "8", "--step-sleep", "0", "--ckpt-every", "4"]
    _torchrun([*common, "--generation", "1", *flags, "--ckpt-root", str(ck),
               "--status-dir", str(old_s)], 2, tmp_path)  # fmt: skip
    manifest = json.loads((ck / "g-step_000004" / "faultline.json").read_text())
    assert manifest["world_size"] == 2
    assert (manifest["pp"], manifest["ep"]) == ((2, 1) if "--pp" in flags else (1, 2))
    assert len(list((ck / "g-step_000004").glob("*.distcp"))) == 2  # one shard file per rank
    rank0, rank1 = _losses(old_s / "rank0.steps"), _losses(old_s / "rank1.steps")
    assert rank0 == rank1  # both ranks report the global loss
    if "--ep" in flags:  # the gate sent each rank's expert tokens: EP was exercised
        lines = [json.loads(ln) for r in (0, 1) for ln in (old_s / f"rank{r}.steps").open()]
        assert all(v > 0 for ln in lines for v in ln["routed"].values())
        assert {k for ln in lines for k in ln["routed"]} == {"0", "1"}
        # The dispatch is an all_to_all whose splits follow the routing: each rank sends
        # all of its 32 tokens, and the splits are uneven and change from step to step.
        assert all(sum(ln["sent"]) == 32 for ln in lines)
        assert len({tuple(ln["sent"]) for ln in lines}) > 1
        assert any(a != b for ln in lines for a, b in [ln["sent"]])
    ref_flags, ref_world = reference
    _torchrun([*common, "--generation", "1", *ref_flags, "--ckpt-root", str(tmp_path / "ck-r"),
               "--status-dir", str(ref_s)], ref_world, tmp_path)  # fmt: skip
    ref = _losses(ref_s / "rank0.steps")
    assert max(abs(rank0[s] - ref[s]) / ref[s] for s in ref) < 1e-4
    resume = ["--resume", str(ck / "g-step_000004")]
    _torchrun([*common, "--generation", "2", *restore, "--ckpt-root", str(tmp_path / "ck-n"),
               *resume, "--status-dir", str(new_s)], 1, tmp_path)  # fmt: skip
    restored = json.loads((new_s / "restored-rank0.json").read_text())
    assert restored["saved_param_sha"] == restored["loaded_param_sha"]
    assert restored["world"] == 1
    replayed = _losses(new_s / "rank0.steps")
    assert min(replayed) == 5
    assert max(abs(replayed[s] - rank0[s]) / rank0[s] for s in range(5, 9)) < 1e-4


def _four_onto_two(new_s: Path, old: dict[int, float], dim: str) -> list[dict[str, Any]]:
    """Both ranks of a 2-rank world restored from a 4-rank `dim`-split checkpoint loaded
    the saved checksum and replayed the old world's losses from step 5; their records."""
    out = []
    for r in (0, 1):
        restored = json.loads((new_s / f"restored-rank{r}.json").read_text())
        assert restored["saved_param_sha"] == restored["loaded_param_sha"]
        assert (restored[f"manifest_{dim}"], restored["manifest_world"], restored["world"]) == (
            4, 4, 2,
        )  # fmt: skip
        replayed = _losses(new_s / f"rank{r}.steps")
        assert min(replayed) == 5
        assert max(abs(replayed[s] - old[s]) / old[s] for s in range(5, 9)) < 1e-4
        out.append(restored)
    return out


@needs_torch
@pytest.mark.slow
@pytest.mark.torch
def test_a_four_stage_pipeline_restores_onto_two_stages(tmp_path: Path) -> None:
    """PP 4 -> PP 2 of a 4-layer model (real gloo, real DCP): four ranks each hold one
    layer and compute the unsplit model's losses; each of the two new stages loads two old
    ranks' layers with the checksum saved over the gathered weights and replays the same
    losses. A checkpoint of another depth is refused with a clear error."""
    ck, old_s, ref_s, new_s = (tmp_path / d for d in ("ck", "old", "ref", "new"))
    for d in (ck, old_s, ref_s, new_s):
        d.mkdir()
    common = ["--group", "g", "--steps", "8", "--step-sleep", "0", "--ckpt-every", "4",
              "--layers", "4"]  # fmt: skip
    _torchrun([*common, "--generation", "1", "--pp", "4", "--ckpt-root", str(ck),
               "--status-dir", str(old_s)], 4, tmp_path)  # fmt: skip
    manifest = json.loads((ck / "g-step_000004" / "faultline.json").read_text())
    assert (manifest["world_size"], manifest["pp"], manifest["layers"]) == (4, 4, 4)
    assert len(list((ck / "g-step_000004").glob("*.distcp"))) == 4  # one shard file per rank
    old = _losses(old_s / "rank0.steps")
    assert all(_losses(old_s / f"rank{r}.steps") == old for r in (1, 2, 3))
    _torchrun([*common, "--generation", "1", "--ckpt-root", str(tmp_path / "ck-r"),
               "--status-dir", str(ref_s)], 1, tmp_path)  # fmt: skip
    ref = _losses(ref_s / "rank0.steps")
    assert max(abs(old[s] - ref[s]) / ref[s] for s in ref) < 1e-4
    resume = ["--resume", str(ck / "g-step_000004")]
    _torchrun([*common, "--generation", "2", "--pp", "2", "--ckpt-root", str(tmp_path / "ck-n"),
               *resume, "--status-dir", str(new_s)], 2, tmp_path)  # fmt: skip
    assert all(x["manifest_layers"] == 4 for x in _four_onto_two(new_s, old, "pp"))
    # The same checkpoint into a two-layer model: refused before anything loads.
    cmd = [sys.executable, "-m", "faultline.drill.resize_trainer", "--group", "g",
           "--generation", "3", "--ckpt-root", str(tmp_path / "ck-x"), *resume,
           "--status-dir", str(tmp_path)]  # fmt: skip
    env = {
        **os.environ,
        "RANK": "0",
        "WORLD_SIZE": "1",
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }
    env.pop("FAULTLINE_SOCKET", None)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "4-layer model, not --layers 2" in done.stdout


@needs_torch
@pytest.mark.slow
@pytest.mark.torch
def test_an_ep4_checkpoint_restores_onto_an_ep2_world(tmp_path: Path) -> None:
    """A split restored onto another split of the same kind (real gloo, real DCP): four
    experts on four ranks, then two on each of two ranks. Each new rank loads two old
    ranks' experts and the gate with the checksum saved over the gathered weights, replays
    the same global losses, and routes tokens to both of its experts."""
    ck, old_s, new_s = (tmp_path / d for d in ("ck", "old", "new"))
    for d in (ck, old_s, new_s):
        d.mkdir()
    common = ["--group", "g", "--steps", "8", "--step-sleep", "0", "--ckpt-every", "4",
              "--experts", "4"]  # fmt: skip
    _torchrun([*common, "--generation", "1", "--ep", "4", "--ckpt-root", str(ck),
               "--status-dir", str(old_s)], 4, tmp_path)  # fmt: skip
    manifest = json.loads((ck / "g-step_000004" / "faultline.json").read_text())
    assert (manifest["world_size"], manifest["ep"]) == (4, 4)
    assert len(list((ck / "g-step_000004").glob("*.distcp"))) == 4  # one shard file per rank
    old = _losses(old_s / "rank0.steps")
    assert all(_losses(old_s / f"rank{r}.steps") == old for r in (1, 2, 3))
    sent = [json.loads(ln)["sent"] for r in range(4) for ln in (old_s / f"rank{r}.steps").open()]
    assert all(len(x) == 4 and sum(x) == 16 for x in sent)  # each rank's 16 tokens, 4 ways
    assert len({tuple(x) for x in sent}) > 1  # the splits follow the routing
    resume = ["--resume", str(ck / "g-step_000004")]
    _torchrun([*common, "--generation", "2", "--ep", "2", "--ckpt-root", str(tmp_path / "ck-n"),
               *resume, "--status-dir", str(new_s)], 2, tmp_path)  # fmt: skip
    _four_onto_two(new_s, old, "ep")
    lines = [json.loads(ln) for r in (0, 1) for ln in (new_s / f"rank{r}.steps").open()]
    # rank 0 of EP 2 holds experts 0 and 1, rank 1 experts 2 and 3
    assert {tuple(sorted(ln["routed"])) for ln in lines} == {("0", "1"), ("2", "3")}
