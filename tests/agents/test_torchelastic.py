"""TorchElastic's error files and the launcher's reports (agents.integrations.torchelastic).

Plain values, no job: the formats are checked against the installed torch package's own
reader and writer (ErrorHandler, ProcessFailure, ChildFailedError) where torch is here.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.integrations import torchelastic as te
from agents.integrations.torchelastic import Failure, LauncherReport

from .conftest import validate


def _raise(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001 -- we want its traceback
        return caught


class Capture:
    """A Reporter stand-in that keeps the records it would send (the real one's encoding)."""

    def __init__(self, **kw: Any) -> None:
        from agents.reporter import Reporter

        self.rep = Reporter(socket_path="/nonexistent/faultline.sock", **kw)
        self.records: list[dict[str, Any]] = []
        self.rep._send = self.records.append  # type: ignore[method-assign]  # captures what the reporter would send

    def kinds(self) -> list[tuple[Any, ...]]:
        return [(r["kind"], r.get("event") or r.get("to_state"), r["generation"])
                for r in self.records]  # fmt: skip


# -- error files -------------------------------------------------------------------------


def test_it_reads_what_record_writes(tmp_path: Path) -> None:
    exc = _raise(ValueError("rank 2 found a malformed batch at /data/alice/shard_7.bin"))
    path = tmp_path / "error.json"
    assert te.record_exception(exc, str(path))
    (parsed, written) = te.read_error_file(str(path)) or (None, None)
    assert parsed is not None and written is not None
    assert parsed.error_type == "ValueError"
    assert parsed.message == "rank 2 found a malformed batch at /data/alice/shard_7.bin"
    assert abs(parsed.timestamp - time.time()) < 5 and abs(written - time.time()) < 5


def test_it_never_overwrites_the_programs_own_error_file(tmp_path: Path) -> None:
    path = tmp_path / "error.json"
    path.write_text('{"message": "theirs"}')
    assert not te.record_exception(_raise(ValueError("ours")), str(path))
    assert path.read_text() == '{"message": "theirs"}'


def test_it_writes_nothing_without_an_error_file_to_write(monkeypatch: Any) -> None:
    monkeypatch.delenv(te.ERROR_FILE_ENV, raising=False)
    assert not te.record_exception(_raise(ValueError("x")))


def test_it_takes_the_qualified_type_from_the_traceback() -> None:
    data = {"message": {"message": "OutOfMemoryError: CUDA out of memory",
                        "extraInfo": {"py_callstack": "Traceback (most recent call last):\n"
                                      '  File "t.py", line 1\ntorch.OutOfMemoryError: CUDA out'
                                      " of memory\n", "timestamp": "1700000000"}}}  # fmt: skip
    parsed = te.parse_error_file(data)
    assert (parsed.error_type, parsed.message, parsed.timestamp) == (
        "torch.OutOfMemoryError", "CUDA out of memory", 1700000000,
    )  # fmt: skip


def test_it_reads_the_string_message_format_too() -> None:
    parsed = te.parse_error_file({"message": "RuntimeError: NCCL timeout", "timestamp": "17"})
    assert (parsed.error_type, parsed.message, parsed.timestamp) == (
        "RuntimeError", "NCCL timeout", 17,
    )  # fmt: skip


@pytest.mark.parametrize(
    "data",
    [None, [], "x", {}, {"message": 3}, {"message": {"extraInfo": "x"}},
     {"message": {"message": None, "extraInfo": {"timestamp": "soon"}}}],
)  # fmt: skip
def test_it_makes_nothing_up_from_a_malformed_error_file(data: Any) -> None:
    parsed = te.parse_error_file(data)
    assert parsed.error_type is None and parsed.timestamp is None


def test_it_reads_no_error_file_where_there_is_none_or_garbage(tmp_path: Path) -> None:
    garbage = tmp_path / "error.json"
    garbage.write_text("{not json")
    assert te.read_error_file(str(garbage)) is None
    assert te.read_error_file(str(tmp_path / "absent.json")) is None
    assert te.read_error_file(te.NOT_AVAILABLE) is None and te.read_error_file(None) is None


@pytest.mark.torch
def test_its_error_files_are_torchs_both_ways(tmp_path: Path, monkeypatch: Any) -> None:
    pytest.importorskip("torch")
    from torch.distributed.elastic.multiprocessing.errors import ErrorHandler, ProcessFailure

    exc = _raise(KeyError("missing key 'input_ids'"))
    ours, theirs = tmp_path / "ours.json", tmp_path / "theirs.json"
    te.record_exception(exc, str(ours))
    monkeypatch.setenv(te.ERROR_FILE_ENV, str(theirs))
    try:
        raise exc
    except KeyError as caught:
        ErrorHandler().record_exception(caught)  # torch's @record writer
    # torch reads ours as it reads its own: the same message and timestamp.
    read_ours = ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file=str(ours))
    read_theirs = ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file=str(theirs))
    assert read_ours.message["message"] == read_theirs.message["message"]
    assert abs(read_ours.timestamp - read_theirs.timestamp) <= 1
    # and we read torch's as we read ours.
    parsed_theirs = te.read_error_file(str(theirs))
    parsed_ours = te.read_error_file(str(ours))
    assert parsed_theirs is not None and parsed_ours is not None
    assert parsed_theirs[0].error_type == parsed_ours[0].error_type == "KeyError"
    assert parsed_theirs[0].message == parsed_ours[0].message == "\"missing key 'input_ids'\""


# -- torchrun's root cause -----------------------------------------------------------------

_failures = st.dictionaries(
    st.integers(0, 63),
    st.tuples(st.integers(1_700_000_000, 1_700_000_003), st.sampled_from([1, -9, -15, -6])),
    min_size=1,
    max_size=8,
)


@pytest.mark.torch
@settings(max_examples=60, deadline=None)
@given(raw=_failures)
def test_it_names_the_rank_torchruns_child_failed_error_names(raw: dict) -> None:
    pytest.importorskip("torch")
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    theirs = {}
    for rank, (stamp, code) in raw.items():
        f = ProcessFailure(local_rank=rank, pid=100 + rank, exitcode=code, error_file="<N/A>")
        f.timestamp = stamp
        theirs[rank] = f
    ours = {r: Failure(rank=r, pid=f.pid, exitcode=f.exitcode, timestamp=f.timestamp,
                       error_file=None, seen_at=0.0) for r, f in theirs.items()}  # fmt: skip
    assert te.first_failure(ours) == ChildFailedError("train.py", theirs).get_first_failure()[0]


# -- the launcher's records ----------------------------------------------------------------


def _failure(rank: int, code: int, *, at: float, error: Path | None = None, **kw: Any) -> Failure:
    return Failure(rank=rank, pid=1000 + rank, exitcode=code, timestamp=int(at),
                   error_file=str(error) if error else None, seen_at=at, **kw)  # fmt: skip


def test_it_reports_a_signal_death_the_worker_could_not() -> None:
    fields = te.exit_fields(_failure(3, -signal.SIGKILL, at=100.5))
    assert fields == {"pid": 1003, "at": 100.5, "sig": 9, "exit_code": 137, "reason": "killed"}


def test_it_reports_an_exit_code_without_an_error_file_as_just_that() -> None:
    assert te.exit_fields(_failure(0, 3, at=5.0))["reason"] == "exit_code"


def test_it_takes_type_message_and_time_from_the_error_file(tmp_path: Path) -> None:
    path = tmp_path / "e.json"
    te.record_exception(_raise(MemoryError("host RAM exhausted")), str(path))
    os.utime(path, (1_800_000_000.25, 1_800_000_000.25))
    fields = te.exit_fields(_failure(1, 1, at=1_800_000_009.0, error=path))
    assert (fields["reason"], fields["error_name"], fields["message"], fields["at"]) == (
        "oom", "MemoryError", "host RAM exhausted", 1_800_000_000.25,
    )  # fmt: skip


def _report(env: dict[str, str] | None = None) -> tuple[LauncherReport, Capture]:
    cap = Capture(group="run-1", rank=0)
    report = LauncherReport(run_id="run-1", max_restarts=2, env=env or {}, reporter=cap.rep)
    return report, cap


def test_it_reports_each_generation_and_its_failures_as_contract_records(tmp_path: Path) -> None:
    report, cap = _report()
    err = tmp_path / "e.json"
    te.record_exception(_raise(ValueError("bad batch")), str(err))
    report.started(restart_count=0, world_size=4)
    report.failed({2: _failure(2, 1, at=time.time(), error=err),
                   0: _failure(0, -15, at=time.time() + 1, teardown=True)},
                  restart_count=0, will_restart=True)  # fmt: skip
    report.started(restart_count=1, world_size=4)
    report.failed({1: _failure(1, -9, at=time.time())}, restart_count=1, will_restart=True)
    report.started(restart_count=2, world_size=4)
    report.finished(restart_count=2)
    validate(cap.records)
    assert cap.kinds() == [
        ("transition", "running", 0),
        ("process", "exited", 0), ("process", "exited", 0), ("transition", "recovering", 0),
        ("transition", "running", 1),
        ("process", "exited", 1), ("transition", "recovering", 1),
        ("transition", "running", 2), ("transition", "completed", 2),
    ]  # fmt: skip
    named = {(r["generation"], r["rank"]) for r in cap.records if r.get("launcher_root_cause")}
    assert named == {(0, 2), (1, 1)}
    failed = next(r for r in cap.records if r.get("rank") == 2)
    assert (failed["error_type"], failed["message"], failed["reason"]) == (
        "ValueError", "bad batch", "exception",
    )  # fmt: skip
    assert [r.get("from_state") for r in cap.records if r.get("to_state") == "running"] == [
        "initializing", "recovering", "recovering",
    ]  # fmt: skip


def test_it_stamps_the_agents_teardown_after_the_failure_it_followed() -> None:
    report, cap = _report()
    now = time.time()
    report.failed({0: _failure(0, -15, at=now + 0.2, teardown=True),
                   1: _failure(1, -9, at=now)}, restart_count=0, will_restart=False)  # fmt: skip
    exits = sorted((r for r in cap.records if r["kind"] == "process"), key=lambda r: r["ts"])
    assert [r["rank"] for r in exits] == [1, 0]
    assert cap.records[-1]["to_state"] == "failed"


def test_only_the_rendezvous_node_0_sends_the_groups_transitions() -> None:
    report, cap = _report()
    report.lead = False  # another node's torchrun: its own workers' exits only
    report.started(restart_count=0, world_size=8)
    report.failed({5: _failure(5, -9, at=time.time())}, restart_count=0, will_restart=True)
    report.finished(restart_count=1)
    assert [(r["kind"], r.get("rank")) for r in cap.records] == [("process", 5)]


def test_it_calls_a_restart_without_a_new_count_a_membership_change() -> None:
    report, cap = _report()
    report.started(restart_count=0, world_size=4)
    report.started(restart_count=0, world_size=8)
    assert [(r["reason"], r["world_size"], r["generation"]) for r in cap.records] == [
        ("launch", 4, 0), ("membership_change", 8, 0),
    ]  # fmt: skip


def test_it_carries_the_slurm_job_and_composes_generations_under_requeue() -> None:
    env = {"SLURM_JOB_ID": "4711", "SLURM_RESTART_COUNT": "1"}
    cap = Capture(group="run-1", rank=0)
    cap.rep.job = "4711"
    report = LauncherReport(run_id="run-1", max_restarts=2, env=env, reporter=cap.rep)
    report.started(restart_count=1, world_size=2)
    (rec,) = cap.records
    assert (rec["generation"], rec["restart_count"], rec["job"]) == (1 * 3 + 1, 4, "4711")


def test_it_reports_nothing_and_says_why_without_a_group(capsys: Any) -> None:
    cap = Capture(rank=0)
    report = LauncherReport(run_id="none", max_restarts=1, env={}, reporter=cap.rep)
    report.started(restart_count=0, world_size=2)
    report.failed({0: _failure(0, 1, at=1.0)}, restart_count=0, will_restart=True)
    report.finished(restart_count=0)
    assert cap.records == []
    assert "--rdzv-id" in capsys.readouterr().err


# -- the worker command ----------------------------------------------------------------------


class _Args:
    def __init__(self, **kw: Any) -> None:
        self.run_path, self.no_python = kw.get("run_path", False), kw.get("no_python", False)


def test_it_runs_python_workers_through_agents_launch() -> None:
    from agents.torchrun import worker_command

    py = "/usr/bin/python3"
    assert worker_command(_Args(), py, ["-u", "train.py", "--lr", "3"]) == (
        py, ["-u", "-m", "agents.launch", "train.py", "--lr", "3"],
    )  # fmt: skip
    assert worker_command(_Args(), py, ["-u", "-m", "pkg.train"]) == (
        py, ["-u", "-m", "agents.launch", "-m", "pkg.train"],
    )  # fmt: skip
    assert worker_command(_Args(no_python=True), "./train.sh", ["a"]) == ("./train.sh", ["a"])
    fn, args = worker_command(_Args(run_path=True), print, ["train.py"])
    assert fn.__module__ == "agents.launch" and args == ["train.py"]


def test_its_records_of_a_failure_are_one_valid_batch(tmp_path: Path) -> None:
    report, cap = _report()
    now = time.time()
    report.failed({r: _failure(r, -9, at=now + r) for r in range(4)}, restart_count=0,
                  will_restart=True)  # fmt: skip
    batch = validate(cap.records)
    assert sum(1 for r in batch.records if getattr(r, "launcher_root_cause", None)) == 1
    assert json.loads(json.dumps(cap.records))  # plain JSON


def test_it_accepts_the_golden_launcher_records_forever() -> None:
    body = (Path(__file__).parent / "fixtures" / "contract" / "launcher_records.json").read_bytes()
    from agents.protocol import decode_batch

    batch = decode_batch(body)
    named = [r for r in batch.records if getattr(r, "launcher_root_cause", None)]
    assert [(r.rank, r.message) for r in named] == [(2, "rank 2 found a malformed batch at step 2")]
    assert [r.topology.dp for r in batch.records if getattr(r, "topology", None)] == [1]
