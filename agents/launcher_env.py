"""What a workload's launcher already told it: group, generation, rank, world and job.

Owns the one table of launcher environment variables the reporter reads (DESIGN.md §7,
"Zero glue"): TorchElastic (torchrun) first, then Slurm, each overridden by the
`FAULTLINE_*` variables (and those by the reporter's explicit arguments). Pure: a mapping
in, `LaunchFacts` out; no I/O, no import beyond the standard library. It must not guess a
group: a launcher that names none (torchrun's run id "none" outside a Slurm job) leaves
the group unset, and the reporter stays quiet rather than merge unrelated jobs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

TORCHELASTIC = "torchelastic"
SLURM = "slurm"
# torchrun's --rdzv-id when none was given: the same string for every job, so no group.
UNNAMED_RUN_IDS = frozenset({"", "none"})
# Set by Faultline's launcher wrapper (agents.torchrun) for the workers it starts: the
# launcher reports the group's transitions and every exit it reaps, so its workers do not.
LAUNCHER_REPORTS = "FAULTLINE_LAUNCHER"


@dataclass(frozen=True, slots=True)
class LaunchFacts:
    """The launcher's facts about this process; None where nothing says."""

    launcher: str | None = None  # "torchelastic" | "slurm" | None (FAULTLINE_* or nothing)
    group: str | None = None
    generation: int | None = None
    rank: int | None = None
    world_size: int | None = None
    local_rank: int | None = None
    # The scheduler's job id (Slurm; an array task as `<array job>_<task>`): what the
    # service binds the group to (its owner) and what restart_group requeues.
    job: str | None = None
    run_id: str | None = None  # TorchElastic's run id (its rendezvous id), as given
    max_restarts: int | None = None  # TorchElastic's --max-restarts
    # Faultline's launcher wrapper reports this process's exit and the group's transitions.
    launcher_reports: bool = False


def _int(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name, "").strip()
    try:
        return int(value) if value else None
    except ValueError:
        return None  # a malformed launcher variable is no fact, not a crash in training


def slurm_job(env: Mapping[str, str]) -> str | None:
    """The Slurm job id as `squeue` lists it: `<array job>_<task>` for an array task."""
    array, task = env.get("SLURM_ARRAY_JOB_ID", ""), env.get("SLURM_ARRAY_TASK_ID", "")
    if array and task:
        return f"{array}_{task}"
    return env.get("SLURM_JOB_ID") or None


def from_environ(env: Mapping[str, str] | None = None) -> LaunchFacts:
    """The launcher's facts from `env` (os.environ by default), FAULTLINE_* winning."""
    env = os.environ if env is None else env
    job = slurm_job(env)
    slurm_restarts = _int(env, "SLURM_RESTART_COUNT")
    launcher: str | None = None
    group: str | None = None
    generation: int | None = None
    run_id = env.get("TORCHELASTIC_RUN_ID")
    max_restarts = _int(env, "TORCHELASTIC_MAX_RESTARTS")
    if run_id is not None:
        launcher = TORCHELASTIC
        group = job if run_id.strip() in UNNAMED_RUN_IDS else run_id
        restarts = _int(env, "TORCHELASTIC_RESTART_COUNT")
        if restarts is not None:
            # torchrun counts from 0 again when Slurm requeues the job under the same run
            # id: each requeue moves past every restart torchrun could have made, so the
            # generation never goes back.
            per_requeue = (max_restarts or 0) + 1
            generation = (slurm_restarts or 0) * per_requeue + restarts
        rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE")
        local = _int(env, "LOCAL_RANK")
    elif job is not None:
        launcher = SLURM
        group = job
        generation = slurm_restarts if slurm_restarts is not None else 0
        rank = _int(env, "RANK")
        rank = rank if rank is not None else _int(env, "SLURM_PROCID")
        world = _int(env, "WORLD_SIZE")
        world = world if world is not None else _int(env, "SLURM_NTASKS")
        local = _int(env, "LOCAL_RANK")
        local = local if local is not None else _int(env, "SLURM_LOCALID")
    else:
        rank, world, local = _int(env, "RANK"), _int(env, "WORLD_SIZE"), _int(env, "LOCAL_RANK")
    own_generation = _int(env, "FAULTLINE_GENERATION")
    own_rank = _int(env, "FAULTLINE_RANK")
    own_world = _int(env, "FAULTLINE_WORLD_SIZE")
    return LaunchFacts(
        launcher=launcher,
        group=env.get("FAULTLINE_GROUP") or group,
        generation=own_generation if own_generation is not None else generation,
        rank=own_rank if own_rank is not None else rank,
        world_size=own_world if own_world is not None else world,
        local_rank=local,
        job=env.get("FAULTLINE_JOB") or job,
        run_id=run_id,
        max_restarts=max_restarts,
        launcher_reports=bool(env.get(LAUNCHER_REPORTS)),
    )
