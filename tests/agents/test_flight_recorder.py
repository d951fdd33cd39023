"""Flight-recorder dumps become the same records the torch wrapper sends, and are judged."""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from agents import flight_recorder as fr
from console.diagnosis import build_snapshot, diagnose

from .conftest import validate

ROOT = Path(__file__).resolve().parents[2]
T_NS = 1_796_000_000_000_000_000

PG_CONFIG = {
    "0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3, 4, 5]"},
    "1": {"name": "1", "desc": "tp", "ranks": "[0, 1, 2]"},
    "2": {"name": "2", "desc": "tp", "ranks": "[3, 4, 5]"},
}


def _event(
    record_id: int,
    pg: tuple[str, str],
    name: str,
    *,
    seq: int,
    p2p: int = 0,
    sizes=((1024,),),
    out=None,
    dtype="Float",
    state="completed",
    retired=True,
):
    """One entry with every key PyTorch 2.x writes (frames trimmed)."""
    return {
        "record_id": record_id, "pg_id": int(pg[0]), "process_group": pg,
        "thread_name": "python", "thread_id": "1", "collective_seq_id": seq,
        "p2p_seq_id": p2p, "op_id": record_id + 1, "profiling_name": name,
        "time_created_ns": T_NS + record_id * 1000, "input_sizes": [list(s) for s in sizes],
        "input_dtypes": [dtype] * len(sizes),
        "output_sizes": [list(s) for s in (out or sizes)],
        "output_dtypes": [dtype] * len(out or sizes), "state": state,
        "time_discovered_started_ns": T_NS + record_id * 1000 + 10,
        "time_discovered_completed_ns": None, "retired": retired, "timeout_ms": 600000,
        "is_p2p": name.split(":")[1].startswith(("send", "recv")), "frames": [],
    }  # fmt: skip


def _dump(rank: int, *, bad_dtype: bool = False) -> bytes:
    tp = ("1", "tp") if rank < 3 else ("2", "tp")
    world = ("0", "default_pg")
    entries = []
    rid = 0

    def add(*a, **k):
        nonlocal rid
        entries.append(_event(rid, *a, **k))
        rid += 1

    add(world, "nccl:all_reduce", seq=1)
    # TP groups: one all_reduces, the other all_gathers, at the same seq (healthy).
    if rank < 3:
        add(tp, "nccl:all_reduce", seq=1, dtype="Int" if bad_dtype and rank == 1 else "Float")
    else:
        add(tp, "nccl:all_gather_into_tensor", seq=1, sizes=((512,),), out=((1536,),))
    # A coalesced pair of all_reduces on the world.
    add(world, "nccl:all_reduce", seq=2, sizes=((8,),))
    add(world, "nccl:all_reduce", seq=2, sizes=((16,),))
    add(world, "nccl:coalesced", seq=2, sizes=(), out=())
    # Pipeline: stage 0 (ranks 0-2) sends to stage 1 (ranks 3-5), group ranks on the world.
    if rank < 3:
        add(world, f"nccl:send {rank}->{rank + 3}", seq=2, p2p=1)
    else:
        add(world, f"nccl:recv {rank}<-{rank - 3}", seq=2, p2p=1)
    # The hang: every rank but 5 entered the world all_reduce seq 3.
    if rank != 5:
        add(world, "nccl:all_reduce", seq=3, state="started", retired=False)
    return pickle.dumps({"version": "2.10", "pg_config": PG_CONFIG, "pg_status": {},
                         "entries": entries})  # fmt: skip


def _judge(records: list[dict[str, Any]], ranks: int = 6):
    now = datetime.fromtimestamp(T_NS / 1e9, tz=UTC) + timedelta(minutes=5)
    parsed = []
    for r in records:
        rec = dict(r, ts=now - timedelta(seconds=1))
        if rec["kind"] == "collective":
            rec["entries"] = [
                {**e, "started_ts": datetime.fromisoformat(e["started_ts"])} for e in rec["entries"]
            ]
        parsed.append(rec)
    for rk in range(ranks):
        parsed.append({"kind": "process", "ts": now - timedelta(minutes=4), "group": "g",
                       "generation": 1, "rank": rk, "event": "started"})  # fmt: skip
    snap = build_snapshot(group="g", generation=1, state="running", records=parsed,
                          nodes={}, contract_findings=[], now=now)  # fmt: skip
    return snap, diagnose(snap, now)


def _records(tmp_path: Path, **kw) -> list[dict[str, Any]]:
    out = []
    for rank in range(6):
        path = tmp_path / f"nccl_trace_rank_{rank}"
        path.write_bytes(_dump(rank, **kw))
        out += fr.to_records(fr.load(path), group="g", generation=1, rank=fr.rank_of(path))
    return out


def test_it_turns_a_dump_into_contract_records(tmp_path: Path) -> None:
    recs = _records(tmp_path)
    validate(recs)
    groups = recs[0]["groups"]
    assert groups[0] == {"pg": "default", "size": 6, "desc": "default_pg"}
    assert groups[1] == {"pg": "1", "size": 3, "ranks": [0, 1, 2], "desc": "tp"}
    entries = recs[1]["entries"]
    assert [e["op"] for e in entries] == ["all_reduce"] * 4 + ["send", "all_reduce"]
    batch = [e for e in entries if "coalesced" in e]
    assert [(e["seq"], e["numel"]) for e in batch] == [(2, 8), (2, 16)]
    send = entries[4]
    assert (send["peer"], send["p2p_seq"], send["numel"], send["dtype"]) == (3, 1, 1024, "float32")
    recv = _records(tmp_path)[7]["entries"][4]  # rank 3
    assert (recv["op"], recv["peer"], recv["p2p_seq"]) == ("recv", 0, 1)
    assert entries[-1]["state"] == "started" and entries[0]["state"] == "completed"


def test_it_names_the_rank_that_never_entered_from_dumps_alone(tmp_path: Path) -> None:
    _, d = _judge(_records(tmp_path))
    assert [f for f in d.findings if f.kind == "collective_mismatch"] == []
    (suspect,) = [f for f in d.findings if f.kind == "rank_hang"]
    assert suspect.subject == "rank:g/5"


def test_it_names_the_rank_whose_tp_call_differs_in_a_dump(tmp_path: Path) -> None:
    _, d = _judge(_records(tmp_path, bad_dtype=True))
    (m,) = [f for f in d.findings if f.kind == "collective_mismatch"]
    assert (m.subject, m.evidence["pg"], m.evidence["rank_call"]["dtype"]) == (
        "rank:g/1", "1", "int32")  # fmt: skip


def test_it_refuses_a_dump_that_asks_to_build_objects(tmp_path: Path) -> None:
    class Evil:
        def __reduce__(self):
            return (os.system, ("true",))

    with pytest.raises(pickle.UnpicklingError, match="refused"):
        fr.loads(pickle.dumps({"entries": [Evil()]}))


REAL_DUMP = textwrap.dedent("""
    import os, time, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    tp = dist.new_group([0, 1], group_desc="tp")
    dist.all_reduce(torch.ones(10))
    dist.all_reduce(torch.ones(5, dtype=torch.float64), group=tp)
    dist.all_gather_into_tensor(torch.empty(20), torch.ones(10))
    # The recorder retires finished work asynchronously (gloo never moves `state`; the
    # watchdog sets `retired`): under load a fixed sleep was not
    # enough, so poll until every entry is stamped.
    import pickle
    deadline = time.monotonic() + 60
    while True:
        dump = torch._C._distributed_c10d._dump_fr_trace()
        done = [e.get("retired") for e in pickle.loads(dump)["entries"]]
        if (done and all(done)) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    with open(os.environ["DUMP"] + str(dist.get_rank()), "wb") as f:
        f.write(dump)
    dist.destroy_process_group()
""")


@pytest.mark.torch
@pytest.mark.slow
def test_it_reads_a_real_dump_from_a_gloo_job(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [
        subprocess.Popen(
            [sys.executable, "-W", "ignore", "-c", REAL_DUMP], cwd=ROOT, stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "TORCH_FR_BUFFER_SIZE": "64", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(port), "RANK": str(r), "WORLD_SIZE": "2",
                 "DUMP": str(tmp_path / "fr_rank_")},
        )
        for r in range(2)
    ]  # fmt: skip
    for p in procs:
        _, err = p.communicate(timeout=90)
        assert p.returncode == 0, err
    recs = []
    for r in range(2):
        path = tmp_path / f"fr_rank_{r}"
        recs += fr.to_records(fr.load(path), group="g", generation=1, rank=fr.rank_of(path))
    validate(recs)
    entries = recs[1]["entries"]
    shape = [(e["pg"], e["seq"], e["op"], e["dtype"], e["state"]) for e in entries]
    assert shape == [
        ("default", 1, "all_reduce", "float32", "completed"),
        ("1", 1, "all_reduce", "float64", "completed"),
        ("default", 2, "all_gather", "float32", "completed"),
    ], recs
    assert entries[2]["out_numel"] == 20
    _, d = _judge(recs, ranks=2)
    assert [f for f in d.findings if f.kind.startswith("collective")] == []
