"""Read a PyTorch flight-recorder dump and turn it into contract records (issue 17).

Owns the translation from a flight-recorder dump (the pickle PyTorch's NCCL watchdog
writes on a timeout, or `torch._C._distributed_c10d._dump_nccl_trace()` returns) into the
same `process_groups` and `collective` records `agents.torch` sends, so the console
judges a hang with the recorder's view of every rank when the job ran without the
faultline wrapper. Standard library only. The unpickler accepts plain containers and
scalars and nothing else: a dump is data, and a file that asks to build any object is
refused. It must not import torch or the service. docs/agent.md says how to turn the
recorder on and when to run this.

    python -m agents.flight_recorder --group llama --generation 3 /tmp/nccl_trace_rank_*
"""

from __future__ import annotations

import argparse
import io
import json
import math
import pickle
import re
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

MAX_ENTRIES = 512  # the contract's window
DEFAULT_DESC = "default_pg"
_CODE = re.compile(r"[^A-Za-z0-9_.:\-]")
_SEND = re.compile(r"^(\d+)->(\d+)$")
_RECV = re.compile(r"^(\d+)<-(\d+)$")
_RANK = re.compile(r"(\d+)$")
# c10d ScalarType names as the recorder writes them -> torch dtype names as the wrapper does.
DTYPES = {
    "Float": "float32",
    "Double": "float64",
    "Half": "float16",
    "BFloat16": "bfloat16",
    "Long": "int64",
    "Int": "int32",
    "Short": "int16",
    "Char": "int8",
    "Byte": "uint8",
    "Bool": "bool",
    "ComplexFloat": "complex64",
    "ComplexDouble": "complex128",
}


class _DataOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"flight-recorder dump asks for {module}.{name}: refused")


def loads(data: bytes) -> dict[str, Any]:
    dump = _DataOnly(io.BytesIO(data)).load()
    if not isinstance(dump, dict) or "entries" not in dump:
        raise ValueError("not a flight-recorder dump (no 'entries')")
    return dump


def load(path: str | Path) -> dict[str, Any]:
    return loads(Path(path).read_bytes())


def rank_of(path: str | Path) -> int:
    """The rank a dump file belongs to: the recorder appends it to the file prefix."""
    match = _RANK.search(Path(path).name)
    if match is None:
        raise ValueError(f"{path}: no rank at the end of the file name; pass --rank")
    return int(match.group(1))


def _code(text: Any) -> str:
    return _CODE.sub("_", str(text))[:64] or "unknown"


def _pg_name(name: Any, desc: Any) -> str:
    return "default" if desc == DEFAULT_DESC else str(name)[:64]


def _members(raw: Any) -> list[int]:
    if isinstance(raw, str):
        raw = json.loads(raw)
    return [int(r) for r in raw]


def _numel(sizes: Any) -> int | None:
    if not sizes:
        return None
    return sum(math.prod(int(d) for d in shape) for shape in sizes)


def _dtype(dtypes: Any) -> str | None:
    if not dtypes:
        return None
    name = str(dtypes[0])
    return DTYPES.get(name, _code(name.lower()))


def _iso(ns: Any) -> str | None:
    if not ns:
        return None
    return datetime.fromtimestamp(int(ns) / 1e9, tz=UTC).isoformat().replace("+00:00", "Z")


def process_groups(dump: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for name, cfg in sorted((dump.get("pg_config") or {}).items(), key=lambda kv: str(kv[0])):
        if not cfg.get("name", name):
            continue  # gloo leaves pg_config empty: membership is inferred by the console
        desc = cfg.get("desc")
        ranks = sorted(_members(cfg.get("ranks", [])))  # the recorder's group-rank order
        if not ranks:
            continue
        info: dict[str, Any] = {"pg": _pg_name(cfg.get("name", name), desc), "size": len(ranks)}
        if desc != DEFAULT_DESC:
            info["ranks"] = ranks
        if desc:
            info["desc"] = _code(desc)
        out.append(info)
    return out


def entries(dump: dict[str, Any]) -> list[dict[str, Any]]:
    """The dump's calls as contract collective entries, oldest first (the newest 512)."""
    raw: list[dict[str, Any]] = list(dump.get("entries") or ())
    members = {
        str(cfg.get("name", name)): sorted(_members(cfg.get("ranks", [])))
        for name, cfg in (dump.get("pg_config") or {}).items()
    }
    # Members of a coalesced batch precede its `coalesced` marker and share its seq id.
    batch_of: dict[int, int] = {}
    for i, e in enumerate(raw):
        if _op(e) != "coalesced":
            continue
        marker_pg = tuple(e["process_group"])
        for j in range(i - 1, -1, -1):
            m = raw[j]
            if tuple(m["process_group"]) != marker_pg or j in batch_of or _op(m) == "coalesced":
                continue
            same = (
                m.get("p2p_seq_id") == e.get("p2p_seq_id")
                if m.get("is_p2p")
                else m.get("collective_seq_id") == e.get("collective_seq_id")
            )
            if same:
                batch_of[j] = int(e.get("record_id", i))
    # p2p order per (pg, peer, direction) is exact only if the ring buffer never wrapped.
    whole = bool(raw) and raw[0].get("record_id") == 0
    p2p_count: dict[tuple[str, int, str], int] = {}
    out: list[dict[str, Any]] = []
    for i, e in enumerate(raw):
        op = _op(e)
        if op == "coalesced":
            continue
        name, desc = e["process_group"]
        pg = _pg_name(name, desc)
        entry: dict[str, Any] = {"seq": int(e.get("collective_seq_id") or 0), "pg": pg,
                                 "op": _code(op), "state": _state(e)}  # fmt: skip
        for field, value in (
            ("numel", _numel(e.get("input_sizes"))),
            ("dtype", _dtype(e.get("input_dtypes"))),
            ("out_numel", _numel(e.get("output_sizes"))),
            ("out_dtype", _dtype(e.get("output_dtypes"))),
            ("started_ts", _iso(e.get("time_discovered_started_ns") or e.get("time_created_ns"))),
            ("coalesced", batch_of.get(i)),
        ):
            if value is not None:
                entry[field] = value
        if op in ("send", "recv"):
            entry["seq"] = int(e.get("p2p_seq_id") or 0)
            peer = _peer(e, op, members.get(str(name), []))
            if op == "recv":  # its buffer is what it expects
                entry["numel"] = entry.pop("out_numel", entry.get("numel"))
                entry["dtype"] = entry.pop("out_dtype", entry.get("dtype"))
            if peer is not None:
                entry["peer"] = peer
                if whole:
                    key = (pg, peer, op)
                    p2p_count[key] = p2p_count.get(key, 0) + 1
                    entry["p2p_seq"] = p2p_count[key]
        out.append({k: v for k, v in entry.items() if v is not None})
    return out[-MAX_ENTRIES:]


def _op(e: dict[str, Any]) -> str:
    name = str(e.get("profiling_name", "")).split(":", 1)[-1]
    return name.split(" ", 1)[0] or "unknown"


def _state(e: dict[str, Any]) -> str:
    if e.get("retired"):
        return "completed"  # the watchdog saw the work finish (gloo never moves `state`)
    state = str(e.get("state", "scheduled"))
    return state if state in ("scheduled", "started", "completed") else "scheduled"


def _peer(e: dict[str, Any], op: str, members: list[int]) -> int | None:
    """The other side's global rank: the recorder names group ranks ("0->1", "1<-0")."""
    parts = str(e.get("profiling_name", "")).split(" ", 1)
    if len(parts) < 2:
        return None
    match = (_SEND if op == "send" else _RECV).match(parts[1].strip())
    if match is None:
        return None
    local = int(match.group(2))  # send: "src->dst", recv: "dst<-src"
    return members[local] if 0 <= local < len(members) else local


def to_records(
    dump: dict[str, Any], *, group: str, generation: int, rank: int, ts: str | None = None
) -> list[dict[str, Any]]:
    """[process_groups record, collective record] for one rank's dump."""
    stamp = ts or datetime.now(UTC).isoformat().replace("+00:00", "Z")
    scope = {"ts": stamp, "group": group, "generation": generation, "rank": rank}
    return [
        {"kind": "process_groups", **scope, "groups": process_groups(dump)},
        {"kind": "collective", **scope, "entries": entries(dump)},
    ]


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agents.flight_recorder")
    parser.add_argument("--group", required=True)
    parser.add_argument("--generation", type=int, required=True)
    parser.add_argument("--rank", type=int, default=None, help="default: from the file name")
    parser.add_argument("--socket", default=None, help="the agent's reporter socket")
    parser.add_argument("--print", action="store_true", help="print records, send nothing")
    parser.add_argument("dumps", nargs="+", type=Path)
    args = parser.parse_args(list(argv) if argv is not None else None)
    from agents.reporter import MAX_DATAGRAM, Reporter

    rep = None if args.print else Reporter(socket_path=args.socket, group=args.group)
    for path in args.dumps:
        rank = args.rank if args.rank is not None else rank_of(path)
        groups, window = to_records(load(path), group=args.group, generation=args.generation,
                                    rank=rank)  # fmt: skip
        # One datagram per record: keep the newest calls that fit.
        while window["entries"] and len(json.dumps(window)) > MAX_DATAGRAM - 1024:
            window["entries"] = window["entries"][max(1, len(window["entries"]) // 10) :]
        if rep is None:
            print(json.dumps(groups))
            print(json.dumps(window))
            continue
        scope = {"group": args.group, "generation": args.generation, "rank": rank}
        rep.process_groups(groups["groups"], **scope)
        rep.collective(window["entries"], **scope)
    if rep is not None and rep.dropped:
        print(f"{rep.dropped} record(s) could not reach the agent", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
