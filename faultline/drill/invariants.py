"""The seed's invariants, checked after a drill's recovery: pass or fail on these, not on
"it restarted".

Owns the checks: one active generation (every older generation's ranks are gone and the
console's generation is the newest), monotonic ids (generation and restart count moved
forward by exactly the restarts the drill made), the newest VALID checkpoint was used
(committed, hashed by the agent, not broken by the drill, not written after a silent
corruption), and no sample skipped or repeated beyond the declared consistency (replay
from the checkpoint: exactly the steps since it repeat once, none is skipped; each step's
samples are a pure function of (step, rank) in the drill's trainer). Must not judge faults:
it reads the trainer's per-step logs, the checkpoint directories and the REST API.
"""

from __future__ import annotations

import contextlib
import itertools
import json
from collections import Counter
from pathlib import Path
from typing import Any

# `Drill` and `Job` are faultline.drill.runner's (runner imports this module, so they are
# duck-typed here: no import cycle).
Drill = Any
Job = Any


# Faults after which every later checkpoint holds bad state (NaN weights, corrupt weights).
POISONED = frozenset({"nan", "corrupt_weights"})


def logged_steps(job: Job, rank: int) -> list[int]:
    """The steps this rank of this generation reported, in order (the trainer's log)."""
    out: list[int] = []
    with contextlib.suppress(OSError):
        for line in (job.status / f"rank{rank}.steps").read_text().splitlines():
            with contextlib.suppress(ValueError, KeyError):
                out.append(int(json.loads(line)["step"]))
    return out


def log_lines(job: Job, rank: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    with contextlib.suppress(OSError):
        for line in (job.status / f"rank{rank}.steps").read_text().splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


def _contiguous(steps: list[int]) -> bool:
    return all(b == a + 1 for a, b in itertools.pairwise(steps))


def newest_valid_step(drill: Drill) -> int:
    """The drill's own answer to "which checkpoint must recovery use": the newest
    committed directory the agent hashed as verified that the drill did not break."""
    best = 0
    for directory in drill.ckpt_root.glob(f"{drill.group}-step_*"):
        step = int(directory.name.rsplit("_", 1)[-1])
        if step in drill.broken or not (directory / "COMMITTED").exists():
            continue
        if drill.spec.inside in POISONED and step >= drill.spec.fault_step:
            continue  # written from NaN or silently corrupt state: not a restore point
        if drill.agent_phase(step) == "verified":
            best = max(best, step)
    return best


def check(drill: Drill) -> dict[str, bool]:
    """After a restore: every invariant, by name."""
    info = drill.group_info() or {}
    newest = drill.jobs[-1]
    older_gone = all(not j.alive() for j in drill.jobs[:-1])
    out = {
        "one_active_generation": older_gone and info.get("generation") == newest.generation,
        "monotonic_ids": info.get("generation") == newest.generation
        and info.get("restart_count") == drill.restart_count,
    }
    r = drill.result
    resume = int(r.measured.get("resume_step", 0))
    out["newest_valid_checkpoint_used"] = resume == int(r.measured.get("expected_resume", -1))
    skipped = False
    repeated = 0
    last = int(r.measured.get("last_step", 0))
    for rank in range(drill.spec.world):
        steps = logged_steps(newest, rank)
        if not steps or steps[0] != resume + 1 or not _contiguous(steps):
            skipped = True
        repeated = max(repeated, len([s for s in steps if s <= last]))
        for older in drill.jobs[:-1]:
            if not _contiguous(logged_steps(older, rank)):
                skipped = True
    out["no_sample_skipped"] = not skipped
    # Declared consistency: replay from the checkpoint, so exactly the steps since it repeat.
    out["repeats_only_since_checkpoint"] = repeated == max(0, last - resume)
    return out


def without_restore(drill: Drill) -> dict[str, bool]:
    """Rows that need no restart: the job kept its one generation and skipped nothing."""
    info = drill.group_info() or {}
    job = drill.jobs[-1]
    steps_ok = all(_contiguous(logged_steps(job, rk)) for rk in range(drill.spec.world))
    return {
        "one_active_generation": info.get("generation") == job.generation,
        "no_sample_skipped": steps_ok,
    }


def spool_path(drill: Drill, node: str = "drill-node") -> Path:
    return drill.service.data_dir / "agents" / node


# -- serving rows (faultline.drill.serving_drill) ------------------------------------------
def serving(outcomes: dict[str, dict[str, Any]], drained: bool) -> dict[str, bool]:
    """The serving invariants over every request the drill's router sent.

    `outcomes[rid]` is the client's view (faultline.drill.serving_drill.Fleet.client) plus
    the request's reference output: `tokens` received in index order, `duplicates` (an
    index received twice), `gaps`, `done` (one entry per worker that finished it), `n`.
    Declared semantics: a request a dead worker held re-runs on a peer from the tokens
    already delivered, so every token index is streamed exactly once and every request
    finishes exactly once, with the output the model gives without any failure.
    """
    finished_once = all(
        len(o["done"]) == 1 and not o["duplicates"] and not o["gaps"] and len(o["tokens"]) == o["n"]
        for o in outcomes.values()
    )
    return {
        "every_request_finished": drained and all(o["done"] for o in outcomes.values()),
        "streamed_tokens_finished_once": bool(outcomes) and finished_once,
        "outputs_match_reference": all(
            o["reference"] is not None and o["tokens"] == o["reference"] for o in outcomes.values()
        ),
    }


# -- topology change (faultline.drill.topology) ---------------------------------------------
def _restored(job: Job, rank: int) -> dict[str, Any]:
    with contextlib.suppress(OSError, ValueError):
        return dict(json.loads((job.status / f"restored-rank{rank}.json").read_text()))
    return {}


def resized(drill: Drill, old: Job, new: Job, *, false_findings: list[str]) -> dict[str, bool]:
    """After recovery onto a different world size (faultline.drill.resize_trainer).

    Declared consistency: a fixed global batch (each step consumes GLOBAL samples, split
    evenly over the DP replicas; a replica's TP ranks share its slice), a global data
    cursor, replay from the checkpoint. So: every generation consumes contiguous global
    samples with no overlap between its replicas, each slice read by exactly TP ranks; the
    new one starts at the manifest's cursor; only the steps since the checkpoint repeat;
    the weights loaded on every new rank are the ones saved by the old world; the replayed
    steps' global losses equal the old generation's.
    """
    info = drill.group_info() or {}
    r = drill.result
    resume = int(r.measured.get("resume_step", 0))
    last = int(r.measured.get("last_step", 0))
    out = {
        "one_active_generation": not old.alive() and info.get("generation") == new.generation,
        "monotonic_ids": info.get("generation") == new.generation
        and info.get("restart_count") == drill.restart_count,
        "newest_valid_checkpoint_used": resume == int(r.measured.get("expected_resume", -1)),
    }
    batch = int(r.measured.get("global_batch", 64))

    def per_step(job: Job) -> dict[int, list[dict[str, Any]]]:
        steps: dict[int, list[dict[str, Any]]] = {}
        for rank in range(job.world):
            for line in log_lines(job, rank):
                steps.setdefault(int(line["step"]), []).append(line)
        return steps

    old_steps, new_steps = per_step(old), per_step(new)
    covered = True
    for steps, world in ((old_steps, old.world), (new_steps, new.world)):
        for step, lines in steps.items():
            # A DP replica's TP ranks (or PP stages) share its slice: each slice once per
            # rank of the copy; EP ranks read their own.
            tp = max(int(ln.get("tp") or 1) * int(ln.get("pp") or 1) for ln in lines)
            shared = Counter(tuple(ln["samples"]) for ln in lines)
            ranges = sorted(shared)
            # The steps a rank finished before the kill may lack its peer's line: a full
            # step has every replica's slice, adjacent, exactly the global batch.
            if len(lines) < world and steps is old_steps and step >= max(steps):
                continue
            want_lo = (step - 1) * batch
            if (
                ranges[0][0] != want_lo
                or ranges[-1][1] != want_lo + batch
                or any(a[1] != b[0] for a, b in itertools.pairwise(ranges))
                or any(n != tp for n in shared.values())
                or len(ranges) * tp != world
            ):
                covered = False
    out["global_batch_per_step_kept"] = covered and bool(new_steps)
    if int(r.measured.get("old_ep", 1)) > 1:  # an MoE: every expert must have had tokens
        routed: Counter[str] = Counter()
        for lines in old_steps.values():
            for ln in lines:
                routed.update(ln.get("routed") or {})
        experts = int(r.measured.get("experts", 0))
        r.measured["old_tokens_per_expert"] = dict(sorted(routed.items()))
        out["every_expert_took_tokens"] = len(routed) == experts and min(routed.values()) > 0
    new_first = min(new_steps, default=0)
    out["no_sample_skipped"] = new_first == resume + 1 and _contiguous(sorted(new_steps))
    replayed = [s for s in new_steps if s <= last]
    out["repeats_only_since_checkpoint"] = len(replayed) == max(0, last - resume)
    restored = [_restored(new, rk) for rk in range(new.world)]
    manifest_cursor_ok = all(
        x and x["manifest_cursor"] == resume * batch == x["state_cursor"] for x in restored
    )
    out["cursor_from_manifest"] = manifest_cursor_ok
    out["checkpoint_maps_onto_new_world"] = all(
        x
        and x["saved_param_sha"] == x["loaded_param_sha"]
        and x["manifest_world"] == old.world
        and all(
            int(x.get(f"manifest_{d}") or 1) == int(r.measured.get(f"old_{d}", 1))
            for d in ("tp", "pp", "ep")
        )
        and x["world"] == new.world
        for x in restored
    )
    diffs = [
        abs(new_steps[s][0]["loss"] - old_steps[s][0]["loss"])
        / max(1e-12, abs(old_steps[s][0]["loss"]))
        for s in replayed
        if s in old_steps
    ]
    r.measured["replayed_loss_max_rel_diff"] = max(diffs, default=None)
    out["replayed_losses_match"] = bool(diffs) and max(diffs) < 1e-4
    out["no_false_finding_after_resize"] = not false_findings and info.get("world_size") == (
        new.world
    )
    return out
