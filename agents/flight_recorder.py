"""Read a PyTorch flight-recorder dump and turn it into contract records.

Owns the translation from a flight-recorder dump (the pickle PyTorch's NCCL watchdog
writes on a timeout, or `torch._C._distributed_c10d._dump_nccl_trace()` returns) into the
same `process_groups` and `collective` records `agents.torch` sends, so the console
judges a hang with the recorder's view of every rank when the job ran without the
faultline wrapper. Standard library only. It must not import torch or the service.
docs/agent.md says how to turn the recorder on and when to run this.

A dump is untrusted data, often from a shared temp directory, and reading it is bounded by
construction: the file must be a regular file owned by the job's user (or root), not
writable by others, in a directory others cannot replace it in; at most MAX_DUMP_BYTES are
read; the unpickler builds plain containers and scalars only, executes at most MAX_OPS
opcodes (so memory is bounded too), and refuses anything that asks to build an object;
only the newest MAX_READ_ENTRIES entries are read, each field by its expected type with
bounded sizes, never by walking or printing an arbitrary structure (a few KB of shared
references would expand to gigabytes). A time outside the contract's range is left out.

    python -m agents.flight_recorder --group llama --generation 3 /tmp/nccl_trace_rank_*
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pickle
import pwd
import re
import stat
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from agents.protocol import EARLIEST_TS, LATEST_TS

MAX_ENTRIES = 512  # the contract's window
MAX_DUMP_BYTES = 32 * 1024 * 1024
MAX_OPS = 2_000_000  # pickle opcodes: ~28,000 entries with three frames each; <100 MB
MAX_READ_ENTRIES = 16_384  # the newest entries read; older ones are ignored
MAX_TEXT = 256  # characters kept of a name or profiling name
MAX_SHAPES = 256  # tensors of one call
MAX_DIMS = 16
MAX_DIM = 2**48  # one dimension; a product is bounded by MAX_SHAPES * MAX_DIM**MAX_DIMS
MAX_PGS = 4096
MAX_RANKS = 1_000_000  # group members over all process groups
MAX_RANKS_TEXT = 16 * 1024 * 1024
MAX_INT = 2**63
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


class DumpError(ValueError):
    """A dump this reader refuses; the message names the file or field and why."""


# -- reading the file -----------------------------------------------------------------------


def owner_uid(name: str | None) -> int:
    """The uid whose dumps are trusted: a user name or number, else this process's user."""
    if name is None:
        return os.geteuid()
    if name.isdigit():
        return int(name)
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        raise DumpError(f"--owner {name!r}: no such user") from None


def _who(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _check_dir(directory: Path, owner: int) -> None:
    st = os.stat(directory)
    if st.st_uid not in (owner, 0):
        raise DumpError(f"{directory}: owned by {_who(st.st_uid)}, not by {_who(owner)} or root")
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise DumpError(
            f"{directory}: writable by other users and not sticky, so anyone could replace a "
            "dump in it; write dumps to a directory only the job's user can write "
            "(TORCH_FR_DUMP_TEMP_FILE)"
        )


def read_dump(
    path: str | Path, *, owner: int | None = None, max_bytes: int = MAX_DUMP_BYTES
) -> bytes:
    """The bytes of one dump, refused unless the job's user (`owner`, default: ours) or root
    wrote it and nobody else could have: a regular file, one link, not writable by group or
    others, in a directory others cannot replace it in."""
    path = Path(path)
    want = os.geteuid() if owner is None else owner
    _check_dir(path.parent, want)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise DumpError(
            f"{path}: cannot open ({exc.strerror}; a symbolic link is refused)"
        ) from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)  # the file we read, not whatever the name points at later
        if not stat.S_ISREG(st.st_mode):
            raise DumpError(f"{path}: not a regular file")
        if st.st_uid not in (want, 0):
            raise DumpError(
                f"{path}: owned by {_who(st.st_uid)}, not by {_who(want)}; if that user ran "
                "the job, pass --owner"
            )
        if st.st_mode & 0o022:
            raise DumpError(f"{path}: writable by group or others (mode {st.st_mode & 0o777:o})")
        if st.st_nlink != 1:
            raise DumpError(f"{path}: has {st.st_nlink} links; a dump has one")
        if st.st_size > max_bytes:
            raise DumpError(f"{path}: {st.st_size} bytes; the limit is {max_bytes}")
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise DumpError(f"{path}: more than {max_bytes} bytes")
    return data


class _Counted(pickle._Unpickler):
    """The pure-Python unpickler, counting opcodes, building no objects but containers.

    The C unpickler cannot be stopped midway: its memory grows with whatever the file
    describes. This one stops at `max_ops`, and every opcode makes at most one object.
    """

    max_ops = MAX_OPS

    def __init__(self, file: io.BytesIO, max_ops: int) -> None:
        super().__init__(file)
        self.max_ops = max_ops
        self.ops = 0

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"flight-recorder dump asks for {module}.{name}: refused")


def _counting(op: Callable[[pickle.Unpickler], None]) -> Callable[[pickle.Unpickler], None]:
    def run(self: pickle.Unpickler) -> None:
        counted: Any = self
        counted.ops += 1
        if counted.ops > counted.max_ops:
            raise DumpError(f"dump needs more than {counted.max_ops} pickle operations")
        op(self)

    return run


_Counted.dispatch = {code: _counting(op) for code, op in pickle._Unpickler.dispatch.items()}


def loads(data: bytes, *, max_ops: int = MAX_OPS) -> dict[str, Any]:
    """The dump as plain data; DumpError (or pickle.UnpicklingError) when it is not one."""
    try:
        dump = _Counted(io.BytesIO(data), max_ops).load()
    except (pickle.UnpicklingError, DumpError):
        raise
    except Exception as exc:  # noqa: BLE001 - a malformed pickle raises any of a dozen types
        raise DumpError(f"not a readable pickle: {type(exc).__name__}: {exc}") from None
    if not isinstance(dump, dict) or not isinstance(dump.get("entries"), list | tuple):
        raise DumpError("not a flight-recorder dump (no 'entries' list)")
    return dump


def load(path: str | Path, *, owner: int | None = None) -> dict[str, Any]:
    return loads(read_dump(path, owner=owner))


def rank_of(path: str | Path) -> int:
    """The rank a dump file belongs to: the recorder appends it to the file prefix."""
    match = _RANK.search(Path(path).name)
    if match is None:
        raise ValueError(f"{path}: no rank at the end of the file name; pass --rank")
    return int(match.group(1))


# -- reading fields by type ---------------------------------------------------------------


def _text(value: Any, where: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value[:MAX_TEXT]
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) < MAX_INT:
        return str(value)
    raise DumpError(f"{where} must be text, got {type(value).__name__}")


def _int(value: Any, where: str, default: int = 0) -> int:
    if value is None:
        return default
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) < MAX_INT:
        return value
    raise DumpError(f"{where} must be an integer below 2**63, got {type(value).__name__}")


def _list(value: Any, where: str, limit: int) -> list[Any] | tuple[Any, ...]:
    if not isinstance(value, list | tuple):
        raise DumpError(f"{where} must be a list, got {type(value).__name__}")
    if len(value) > limit:
        raise DumpError(f"{where} has {len(value)} items; at most {limit}")
    return value


def _numel(sizes: Any, where: str) -> int | None:
    if not sizes:
        return None
    total = 0
    for i, shape in enumerate(_list(sizes, where, MAX_SHAPES)):
        n = 1
        for d in _list(shape, f"{where}[{i}]", MAX_DIMS):
            dim = _int(d, f"{where}[{i}]")
            if not 0 <= dim <= MAX_DIM:
                raise DumpError(f"{where}[{i}]: dimension {dim} out of range")
            n *= dim
        total += n
    return total


def _dtype(dtypes: Any, where: str) -> str | None:
    if not dtypes:
        return None
    name = _text(_list(dtypes, where, MAX_SHAPES)[0], f"{where}[0]")
    return DTYPES.get(name, _code(name.lower()))


def _iso(ns: Any, where: str) -> str | None:
    """A time in ns since the epoch as the contract's ISO text; None when absent, zero or
    outside the contract's range (a time the console would refuse is not evidence)."""
    if isinstance(ns, int) and not isinstance(ns, bool) and not 0 < ns < MAX_INT:
        return None  # zero (never started), negative or absurd: no time, not a refusal
    value = _int(ns, where)
    if value <= 0:
        return None
    stamp = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=value // 1000)
    if not EARLIEST_TS <= stamp < LATEST_TS:
        return None
    return stamp.isoformat().replace("+00:00", "Z")


def _code(text: str) -> str:
    return _CODE.sub("_", text)[:64] or "unknown"


def _pg_name(name: str, desc: str) -> str:
    return "default" if desc == DEFAULT_DESC else name[:64]


def _ranks(raw: Any, where: str, budget: list[int]) -> list[int]:
    """A group's members: a list, or the recorder's JSON text of one ("[0, 1, 2]")."""
    if isinstance(raw, str):
        if len(raw) > MAX_RANKS_TEXT:
            raise DumpError(f"{where} is {len(raw)} characters; at most {MAX_RANKS_TEXT}")
        inner = raw.strip()
        if not (inner.startswith("[") and inner.endswith("]")):
            raise DumpError(f"{where} must be a list of ranks")
        inner = inner[1:-1].strip()
        raw = [piece.strip() for piece in inner.split(",")] if inner else []
    items = _list(raw, where, budget[0])
    budget[0] -= len(items)
    out = []
    for item in items:
        if isinstance(item, str) and item.isascii() and item.isdigit() and len(item) <= 9:
            out.append(int(item))
        elif isinstance(item, int) and not isinstance(item, bool) and 0 <= item < 2**31:
            out.append(item)
        else:
            shown = repr(item[:20]) if isinstance(item, str) else type(item).__name__
            raise DumpError(f"{where}: {shown} is not a rank")
    return sorted(out)  # the recorder's group-rank order


@dataclass(frozen=True)
class _Group:
    name: str
    desc: str
    ranks: list[int]


def _groups(dump: dict[str, Any]) -> dict[str, _Group]:
    raw = dump.get("pg_config") or {}
    if not isinstance(raw, dict):
        raise DumpError("pg_config must be a mapping")
    if len(raw) > MAX_PGS:
        raise DumpError(f"pg_config has {len(raw)} process groups; at most {MAX_PGS}")
    budget = [MAX_RANKS]
    out: dict[str, _Group] = {}
    for key, cfg in raw.items():
        where = f"pg_config[{_text(key, 'pg_config key')!r}]"
        if not isinstance(cfg, dict):
            raise DumpError(f"{where} must be a mapping")
        name = _text(cfg.get("name", key), f"{where}.name")
        desc = _text(cfg["desc"], f"{where}.desc") if cfg.get("desc") is not None else ""
        out[name] = _Group(name, desc, _ranks(cfg.get("ranks", []), f"{where}.ranks", budget))
    return out


def process_groups(dump: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for name, group in sorted(_groups(dump).items()):
        if not name or not group.ranks:
            continue  # gloo leaves pg_config empty: membership is inferred by the console
        info: dict[str, Any] = {"pg": _pg_name(name, group.desc), "size": len(group.ranks)}
        if group.desc != DEFAULT_DESC:
            info["ranks"] = group.ranks
        if group.desc:
            info["desc"] = _code(group.desc)
        out.append(info)
    return out


@dataclass(frozen=True)
class _Call:
    """The fields of one recorder entry this reader uses, read by type."""

    record_id: int | None
    pg_name: str
    pg_desc: str
    op: str
    peer_text: str
    seq: int
    p2p_seq: int
    is_p2p: bool
    state: str
    numel: int | None
    dtype: str | None
    out_numel: int | None
    out_dtype: str | None
    started_ts: str | None


def _call(e: Any, i: int) -> _Call:
    where = f"entries[{i}]"
    if not isinstance(e, dict):
        raise DumpError(f"{where} must be a mapping")
    pg = _list(e.get("process_group"), f"{where}.process_group", 2)
    if len(pg) != 2:
        raise DumpError(f"{where}.process_group must be (name, desc)")
    profiling = _text(e.get("profiling_name"), f"{where}.profiling_name")
    head, _, rest = profiling.split(":", 1)[-1].partition(" ")
    raw_state = e.get("state")
    state = "completed" if e.get("retired") is True else raw_state
    started = e.get("time_discovered_started_ns") or e.get("time_created_ns")
    return _Call(
        record_id=_int(e["record_id"], f"{where}.record_id") if "record_id" in e else None,
        pg_name=_text(pg[0], f"{where}.process_group[0]"),
        pg_desc=_text(pg[1], f"{where}.process_group[1]"),
        op=head or "unknown",
        peer_text=rest.strip(),
        seq=_int(e.get("collective_seq_id"), f"{where}.collective_seq_id"),
        p2p_seq=_int(e.get("p2p_seq_id"), f"{where}.p2p_seq_id"),
        is_p2p=e.get("is_p2p") is True,
        # `retired`: the watchdog saw the work finish (gloo never moves `state`).
        state=state if state in ("scheduled", "started", "completed") else "scheduled",
        numel=_numel(e.get("input_sizes"), f"{where}.input_sizes"),
        dtype=_dtype(e.get("input_dtypes"), f"{where}.input_dtypes"),
        out_numel=_numel(e.get("output_sizes"), f"{where}.output_sizes"),
        out_dtype=_dtype(e.get("output_dtypes"), f"{where}.output_dtypes"),
        started_ts=_iso(started, f"{where}.time_created_ns"),
    )


def _batches(calls: list[_Call]) -> dict[int, int]:
    """Members of a coalesced batch precede its `coalesced` marker and share its pg and seq
    id (p2p or collective): index -> the marker's record id. One pass, whatever the shape."""
    pending: dict[tuple[str, bool, int], list[int]] = {}
    batch_of: dict[int, int] = {}
    for i, c in enumerate(calls):
        if c.op != "coalesced":
            key = (c.pg_name, c.is_p2p, c.p2p_seq if c.is_p2p else c.seq)
            pending.setdefault(key, []).append(i)
            continue
        marker = c.record_id if c.record_id is not None else i
        for key in ((c.pg_name, True, c.p2p_seq), (c.pg_name, False, c.seq)):
            for j in pending.pop(key, []):
                batch_of[j] = marker
    return batch_of


def entries(dump: dict[str, Any]) -> list[dict[str, Any]]:
    """The dump's calls as contract collective entries, oldest first (the newest 512)."""
    raw = dump.get("entries") or []
    if not isinstance(raw, list | tuple):
        raise DumpError("entries must be a list")
    start = max(0, len(raw) - MAX_READ_ENTRIES)
    calls = [_call(raw[i], i) for i in range(start, len(raw))]
    members = {name: group.ranks for name, group in _groups(dump).items()}
    batch_of = _batches(calls)
    # p2p order per (pg, peer, direction) is exact only if the ring buffer never wrapped
    # (and this reader saw all of it).
    whole = start == 0 and bool(calls) and calls[0].record_id == 0
    p2p_count: dict[tuple[str, int, str], int] = {}
    out: list[dict[str, Any]] = []
    for i, c in enumerate(calls):
        if c.op == "coalesced":
            continue
        pg = _pg_name(c.pg_name, c.pg_desc)
        entry: dict[str, Any] = {"seq": c.seq, "pg": pg, "op": _code(c.op), "state": c.state}
        for field, value in (
            ("numel", c.numel),
            ("dtype", c.dtype),
            ("out_numel", c.out_numel),
            ("out_dtype", c.out_dtype),
            ("started_ts", c.started_ts),
            ("coalesced", batch_of.get(i)),
        ):
            if value is not None:
                entry[field] = value
        if c.op in ("send", "recv"):
            entry["seq"] = c.p2p_seq
            peer = _peer(c, members.get(c.pg_name, []))
            if c.op == "recv":  # its buffer is what it expects
                entry["numel"] = entry.pop("out_numel", entry.get("numel"))
                entry["dtype"] = entry.pop("out_dtype", entry.get("dtype"))
            if peer is not None:
                entry["peer"] = peer
                if whole:
                    key = (pg, peer, c.op)
                    p2p_count[key] = p2p_count.get(key, 0) + 1
                    entry["p2p_seq"] = p2p_count[key]
        out.append({k: v for k, v in entry.items() if v is not None})
    return out[-MAX_ENTRIES:]


def _peer(c: _Call, members: list[int]) -> int | None:
    """The other side's global rank: the recorder names group ranks ("0->1", "1<-0")."""
    match = (_SEND if c.op == "send" else _RECV).match(c.peer_text)
    if match is None:
        return None
    if len(match.group(2)) > 9:
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
    parser.add_argument(
        "--owner",
        default=None,
        help="the user whose job wrote the dumps (name or uid); default: you. Dumps owned by "
        "anyone else (or root) are refused",
    )
    parser.add_argument("dumps", nargs="+", type=Path)
    args = parser.parse_args(list(argv) if argv is not None else None)
    from agents.reporter import MAX_DATAGRAM, Reporter

    try:
        owner = owner_uid(args.owner)
    except DumpError as exc:
        parser.error(str(exc))
    rep = None if args.print else Reporter(socket_path=args.socket, group=args.group)
    refused = 0
    for path in args.dumps:
        try:
            rank = args.rank if args.rank is not None else rank_of(path)
            groups, window = to_records(
                load(path, owner=owner), group=args.group, generation=args.generation, rank=rank
            )
        except (DumpError, pickle.UnpicklingError, ValueError) as exc:
            print(f"{path}: refused: {exc}", file=sys.stderr)
            refused += 1
            continue
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
    return 1 if refused else 0


if __name__ == "__main__":
    raise SystemExit(main())
