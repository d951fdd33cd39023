"""A flight-recorder dump is untrusted: reading one is bounded in time and memory whatever
it holds, and only a file the job's user wrote (in a directory nobody else can replace it
in) is read at all."""

from __future__ import annotations

import copy
import os
import pickle
import resource
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents import flight_recorder as fr
from agents.protocol import ContractError

from .conftest import validate
from .test_flight_recorder import _dump

ROOT = Path(__file__).resolve().parents[2]
OTHER_UID = 54_321  # a user that is not us (nor root)


def _run_capped(path: Path, *extra: str, cpu_s: int = 10, mem: int = 768 << 20):
    """The reader as an operator runs it, under a CPU and an address-space cap: a reader that
    needs more is killed, which the test reports as a failure (the review saw 20 s, 1 GiB)."""

    def caps() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))

    return subprocess.run(
        [sys.executable, "-m", "agents.flight_recorder", "--group", "g", "--generation", "1",
         "--rank", "0", "--print", *extra, str(path)],
        cwd=ROOT, capture_output=True, text=True, preexec_fn=caps, timeout=120, check=False,
    )  # fmt: skip


FIRST = fr.loads(_dump(0))["entries"][0]


def _entry(**changes: Any) -> dict[str, Any]:
    return {**FIRST, **changes}


def _write(path: Path, dump: Any) -> Path:
    path.write_bytes(dump if isinstance(dump, bytes) else pickle.dumps(dump, protocol=4))
    return path


def _shared_tree(depth: int) -> list[Any]:
    node: list[Any] = []
    for _ in range(depth):
        node = [node, node]  # pickled once per level (memo): 2**depth leaves when walked
    return node


# -- bounded work and memory ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("what", "dump"),
    [
        # A few KB: a group name made of shared references, 2**40 leaves if printed.
        ("shared name", {"entries": [_entry(process_group=(_shared_tree(40), "tp"))]}),
        ("shared sizes", {"entries": [_entry(input_sizes=[_shared_tree(40)])]}),
        ("shared ranks", {"pg_config": {"0": {"name": "0", "ranks": _shared_tree(40)}},
                          "entries": []}),
        # ~4 MB: two million references to one entry (each would become a record).
        ("two million entries", {"entries": [_entry()] * 2_000_000}),
        ("huge dimension", {"entries": [_entry(input_sizes=[[10**4000, 10**4000]])]}),
        ("many dimensions", {"entries": [_entry(input_sizes=[[2**40] * 10_000])]}),
        ("a deep ranks text", {"pg_config": {"0": {"name": "0", "ranks": "[" * 200_000}},
                               "entries": []}),
    ],
)  # fmt: skip
def test_a_hostile_dump_is_refused_or_read_within_bounds(
    tmp_path: Path, what: str, dump: dict[str, Any]
) -> None:
    path = _write(tmp_path / "nccl_trace_rank_0", dump)
    done = _run_capped(path)
    assert done.returncode in (0, 1), (what, done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr, (what, done.stderr[-2000:])


def test_a_pickle_needing_more_operations_than_the_bound_is_refused(tmp_path: Path) -> None:
    data = b"\x80\x04]" + b"]a" * (fr.MAX_OPS // 2 + 1) + b"."  # ~2 MB: a million lists
    with pytest.raises(fr.DumpError, match="more than 2000000 pickle operations"):
        fr.loads(data)


def test_a_huge_timestamp_is_left_out_not_a_crash(tmp_path: Path) -> None:
    for ns in (10**30, 10**80, 2**63, 2**63 - 1, -5, 0, 1, 4_200_000_000 * 10**9):
        path = _write(tmp_path / "nccl_trace_rank_0", {"entries": [
            _entry(time_created_ns=ns, time_discovered_started_ns=None)]})  # fmt: skip
        (_, window) = fr.to_records(fr.load(path), group="g", generation=1, rank=0)
        assert "started_ts" not in window["entries"][0], ns
    text = _entry(time_created_ns="1e30", time_discovered_started_ns=None)
    path = _write(tmp_path / "nccl_trace_rank_0", {"entries": [text]})
    with pytest.raises(fr.DumpError, match="time_created_ns must be an integer"):
        fr.to_records(fr.load(path), group="g", generation=1, rank=0)


def test_it_reads_only_the_newest_entries_of_a_long_dump(tmp_path: Path) -> None:
    entries = []
    for i in range(fr.MAX_READ_ENTRIES + 100):
        entries.append(_entry(record_id=i, collective_seq_id=i + 1))
    path = _write(tmp_path / "nccl_trace_rank_0", {"entries": entries})
    (_, window) = fr.to_records(fr.load(path), group="g", generation=1, rank=0)
    seqs = [e["seq"] for e in window["entries"]]
    assert seqs == list(range(len(entries) - 511, len(entries) + 1))


# Any plain value a pickle can hold, nested a little.
PLAIN = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40)
    | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                               max_size=4)
    | st.tuples(inner, inner),
    max_leaves=12,
)  # fmt: skip
FIELDS = ["process_group", "profiling_name", "collective_seq_id", "p2p_seq_id", "record_id",
          "input_sizes", "output_sizes", "input_dtypes", "output_dtypes", "state", "retired",
          "time_created_ns", "time_discovered_started_ns", "is_p2p"]  # fmt: skip
BASE = fr.loads(_dump(3))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    index=st.integers(min_value=0, max_value=len(BASE["entries"]) - 1),
    field=st.sampled_from([*FIELDS, "pg_config", "ranks", "entries"]),
    value=PLAIN,
)
def test_any_field_of_any_type_gives_contract_records_or_a_named_refusal(
    index: int, field: str, value: Any
) -> None:
    dump = copy.deepcopy(BASE)
    if field == "pg_config":
        dump["pg_config"] = value
    elif field == "ranks":
        dump["pg_config"]["1"]["ranks"] = value
    elif field == "entries":
        dump["entries"] = value
    else:
        dump["entries"][index][field] = value
    try:
        records = fr.to_records(fr.loads(pickle.dumps(dump)), group="g", generation=1, rank=3,
                                ts="2026-12-03T10:00:00Z")  # fmt: skip
    except fr.DumpError:
        return
    try:
        validate(records)
    except ContractError as exc:
        # The reader passes names and numbers through; the contract may still refuse a
        # value it read correctly (an op name the wrapper would never send), never a crash.
        assert exc.as_dict()["error"], exc


# -- who wrote the file ---------------------------------------------------------------------


def _someone_elses(path: Path) -> int:
    """Make `path` another user's file; returns the uid the reader should be told to trust
    for it to be read."""
    if os.geteuid() == 0:
        os.chown(path, OTHER_UID, -1)
        return OTHER_UID
    pytest.skip("needs root to give a file to another user")


def test_it_refuses_a_dump_another_user_planted_and_reads_it_when_told_that_user_ran_the_job(
    tmp_path: Path,
) -> None:
    path = _write(tmp_path / "nccl_trace_rank_5", _dump(5))
    uid = _someone_elses(path)
    with pytest.raises(fr.DumpError, match=f"owned by uid {uid}.*pass --owner"):
        fr.load(path)
    assert fr.load(path, owner=uid)["entries"]
    done = _run_capped(path)
    assert done.returncode == 1 and "refused: " in done.stderr and done.stdout == ""
    assert _run_capped(path, "--owner", str(uid)).returncode == 0


@pytest.mark.parametrize("mode", [0o664, 0o646, 0o666])
def test_it_refuses_a_dump_others_may_write(tmp_path: Path, mode: int) -> None:
    path = _write(tmp_path / "nccl_trace_rank_0", _dump(0))
    path.chmod(mode)
    with pytest.raises(fr.DumpError, match="writable by group or others"):
        fr.load(path)


def test_it_refuses_a_symbolic_link_a_hard_link_and_a_fifo(tmp_path: Path) -> None:
    real = _write(tmp_path / "real", _dump(0))
    (tmp_path / "nccl_trace_rank_0").symlink_to(real)
    with pytest.raises(fr.DumpError, match="symbolic link is refused"):
        fr.load(tmp_path / "nccl_trace_rank_0")
    os.link(real, tmp_path / "nccl_trace_rank_1")
    with pytest.raises(fr.DumpError, match="has 2 links"):
        fr.load(tmp_path / "nccl_trace_rank_1")
    os.mkfifo(tmp_path / "nccl_trace_rank_2")
    with pytest.raises(fr.DumpError, match="not a regular file"):
        fr.load(tmp_path / "nccl_trace_rank_2")


def test_it_refuses_a_shared_directory_unless_it_is_sticky(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    path = _write(shared / "nccl_trace_rank_0", _dump(0))
    shared.chmod(0o777)
    with pytest.raises(fr.DumpError, match="writable by other users and not sticky"):
        fr.load(path)
    shared.chmod(0o777 | stat.S_ISVTX)  # like /tmp: others cannot replace our file
    assert fr.load(path)["entries"]
    shared.chmod(0o700)
    assert fr.load(path)["entries"]


def test_it_refuses_a_file_over_the_size_bound(tmp_path: Path) -> None:
    path = _write(tmp_path / "nccl_trace_rank_0", b"\x80\x04N." + b" " * 64)
    with pytest.raises(fr.DumpError, match="the limit is 16"):
        fr.read_dump(path, max_bytes=16)
