"""What the launcher told a workload (agents.launcher_env), and the reporter's use of it."""

from __future__ import annotations

import os
from unittest import mock

from hypothesis import given
from hypothesis import strategies as st

from agents import launcher_env
from agents.launcher_env import from_environ
from agents.reporter import Reporter

TORCHRUN = {
    "TORCHELASTIC_RUN_ID": "llama-7b",
    "TORCHELASTIC_RESTART_COUNT": "2",
    "TORCHELASTIC_MAX_RESTARTS": "3",
    "RANK": "5",
    "WORLD_SIZE": "8",
    "LOCAL_RANK": "1",
}
SRUN = {
    "SLURM_JOB_ID": "4711",
    "SLURM_PROCID": "3",
    "SLURM_NTASKS": "16",
    "SLURM_LOCALID": "3",
    "SLURM_RESTART_COUNT": "1",
}


def test_it_reads_torchrun_group_generation_rank_and_world() -> None:
    f = from_environ(TORCHRUN)
    assert (f.launcher, f.group, f.generation, f.rank, f.world_size, f.local_rank) == (
        "torchelastic", "llama-7b", 2, 5, 8, 1,
    )  # fmt: skip
    assert f.job is None and f.run_id == "llama-7b" and not f.launcher_reports


def test_it_reads_a_slurm_task_without_torchrun() -> None:
    f = from_environ(SRUN)
    assert (f.launcher, f.group, f.generation, f.rank, f.world_size, f.local_rank, f.job) == (
        "slurm", "4711", 1, 3, 16, 3, "4711",
    )  # fmt: skip


def test_it_names_an_array_task_as_squeue_lists_it() -> None:
    f = from_environ({**SRUN, "SLURM_ARRAY_JOB_ID": "4700", "SLURM_ARRAY_TASK_ID": "11"})
    assert f.group == f.job == "4700_11"


def test_it_keeps_torchrun_ranks_and_slurm_job_when_torchrun_runs_under_srun() -> None:
    f = from_environ({**SRUN, **TORCHRUN})
    assert (f.launcher, f.group, f.rank, f.world_size, f.job) == (
        "torchelastic", "llama-7b", 5, 8, "4711",
    )  # fmt: skip


def test_it_never_moves_the_generation_back_when_slurm_requeues_a_torchrun_job() -> None:
    # torchrun counts from 0 again in the requeued job: each requeue moves past every
    # restart torchrun could make (max_restarts + 1 per requeue).
    seen = []
    for requeue in range(3):
        for restart in range(4):
            env = {**SRUN, **TORCHRUN, "SLURM_RESTART_COUNT": str(requeue),
                   "TORCHELASTIC_RESTART_COUNT": str(restart)}  # fmt: skip
            seen.append(from_environ(env).generation)
    assert seen == sorted(seen) and len(set(seen)) == len(seen)


def test_it_names_no_group_when_torchrun_has_no_run_id_outside_slurm() -> None:
    for run_id in ("none", "", " none "):
        assert from_environ({**TORCHRUN, "TORCHELASTIC_RUN_ID": run_id}).group is None
    with_job = from_environ({**SRUN, **TORCHRUN, "TORCHELASTIC_RUN_ID": "none"})
    assert with_job.group == "4711"


def test_it_reads_plain_rank_variables_with_no_launcher() -> None:
    f = from_environ({"RANK": "2", "WORLD_SIZE": "4"})
    assert (f.launcher, f.group, f.generation, f.rank, f.world_size) == (None, None, None, 2, 4)
    assert from_environ({}) == launcher_env.LaunchFacts()


def test_it_treats_a_malformed_variable_as_absent() -> None:
    f = from_environ({**TORCHRUN, "TORCHELASTIC_RESTART_COUNT": "two", "RANK": "x"})
    assert f.generation is None and f.rank is None and f.group == "llama-7b"


_launchers = st.sampled_from([{}, TORCHRUN, SRUN, {**SRUN, **TORCHRUN}])


@given(
    launcher=_launchers,
    group=st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True),
    generation=st.integers(0, 10_000),
    rank=st.integers(0, 4096),
)
def test_it_lets_faultline_variables_win_over_every_launcher(
    launcher: dict[str, str], group: str, generation: int, rank: int
) -> None:
    env = {**launcher, "FAULTLINE_GROUP": group, "FAULTLINE_GENERATION": str(generation),
           "FAULTLINE_RANK": str(rank), "FAULTLINE_WORLD_SIZE": "9999",
           "FAULTLINE_JOB": "j1"}  # fmt: skip
    f = from_environ(env)
    assert (f.group, f.generation, f.rank, f.world_size, f.job) == (
        group, generation, rank, 9999, "j1",
    )  # fmt: skip


def test_it_gives_the_reporter_its_defaults_and_lets_arguments_win() -> None:
    with mock.patch.dict(os.environ, {**SRUN, **TORCHRUN}, clear=True):
        rep = Reporter(socket_path="/nonexistent/r.sock")
        assert (rep.group, rep.generation, rep.rank, rep.world_size, rep.job) == (
            "llama-7b", 1 * 4 + 2, 5, 8, "4711",
        )  # fmt: skip
        explicit = Reporter(socket_path="/nonexistent/r.sock", group="g", generation=0, rank=0)
        assert (explicit.group, explicit.generation, explicit.rank) == ("g", 0, 0)
        rep.close()
        explicit.close()


def test_it_marks_workers_whose_launcher_reports_their_exits() -> None:
    assert from_environ({**TORCHRUN, "FAULTLINE_LAUNCHER": "torchelastic"}).launcher_reports
