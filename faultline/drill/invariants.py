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
