"""Collective rule family: correctness before timeouts, per process group.

Matches each process group's calls among that group's members only, by (pg, seq): a TP
group and a DP group count their own collectives, and ranks of two TP groups calling
different things at the same seq are not a mismatch. Within a group a rank whose call
(op, dtype, size under the op's size relation) differs from the majority is a
`collective_mismatch` root cause — one per (pg, rank), however many seqs followed; a tie
is `undetermined`. Send/recv pair by (pg, src, dst, p2p_seq); all_to_all is judged by its
split matrix (what i sends to j is what j expects from i) or its totals. Ranks blocked in
a started call that a member never entered get `collective_timeout` symptoms linked to
whatever stopped that member (mismatch, GPU, node, process); with no such evidence they
are `undetermined` and say what is missing. An unexplained wait is judged on what the
nodes delivered: it must outlast the threshold up to the newest record of every lagging
node involved (a member that may have entered since, a waiter that may have left). Must
run after `device`, `nodes` and
`process`, whose findings it links to. Pure: plain data in, findings out.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from itertools import pairwise
from typing import Any

from console.diagnosis.findings import (
    CRITICAL,
    MAJOR,
    ROOT_CAUSE,
    SEVERITY_RANK,
    SYMPTOM,
    UNDETERMINED,
    Finding,
    fingerprint_of,
    gpu_subject,
    group_subject,
    node_subject,
    rank_subject,
)
from console.diagnosis.rules.base import Context
from console.diagnosis.snapshot import CollectiveEntry, CollectiveWindow

ENTERED = frozenset({"started", "completed"})
LINK_KINDS = frozenset({"nvlink_errors", "network_slow", "network_partition"})
DEFAULT_PG = "default"

# Canonical op kinds: torch function names, c10d/flight-recorder names and their aliases.
_KIND = {
    "allreduce": "all_reduce",
    "allreduce_coalesced": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "allgather": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "all_gather_single": "all_gather",
    "all_gather_base": "all_gather",
    "_allgather_base": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all",
    "all_to_all_single": "all_to_all",
    "isend": "send",
    "irecv": "recv",
}
P2P = frozenset({"send", "recv"})
KEY_FIELDS = ("op", "numel", "dtype", "out_dtype", "size_relation")


_KINDS_SEEN: dict[str, str] = {}  # op names are few: memo of op_kind (4,096 ranks x 13 calls)


def op_kind(op: str) -> str:
    """`nccl:all_gather_into_tensor` -> `all_gather`; unknown ops stay as they are."""
    kind = _KINDS_SEEN.get(op)
    if kind is None:
        base = op.rsplit(":", 1)[-1].split(" ", 1)[0]
        kind = _KINDS_SEEN[op] = _KIND.get(base, base)
    return kind


def is_p2p(e: CollectiveEntry) -> bool:
    return op_kind(e.op) in P2P


# -- membership ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Group:
    pg: str
    members: tuple[int, ...]  # group-rank order
    known: bool  # from `process_groups` records (else inferred)
    desc: str | None = None

    @property
    def size(self) -> int | None:
        return len(self.members) if self.known else None


def memberships(ctx: Context, windows: dict[int, CollectiveWindow]) -> dict[str, Group]:
    """pg -> members. Reported groups are exact; others are inferred (see docs/diagnosis.md):
    `default` is every rank of the snapshot, any other pg the ranks that used it plus the
    ranks with no collective record at all (they may be members that never got there)."""
    reported = {g.pg: g for g in ctx.snap.process_groups}
    used: dict[str, set[int]] = defaultdict(set)
    for rank, w in windows.items():
        for e in w.entries:
            used[e.pg].add(rank)
    silent = {rk for rk in ctx.ranks if rk not in windows or not windows[rk].entries}
    out: dict[str, Group] = {}
    for pg in sorted(set(used) | set(reported)):
        g = reported.get(pg)
        if g is not None:
            out[pg] = Group(pg, g.ranks, True, g.desc)
        elif pg == DEFAULT_PG:
            out[pg] = Group(pg, tuple(sorted(ctx.ranks)), False)
        else:
            out[pg] = Group(pg, tuple(sorted(used[pg] | silent)), False)
    return out


# -- call keys -----------------------------------------------------------------------


def _relation(kind: str, e: CollectiveEntry, size: int | None) -> str | None:
    """The size relation of the op broken by this one call, or None (or unknown)."""
    i, o = e.numel, e.out_numel
    if kind == "all_reduce" and i is not None and o is not None and i != o:
        return f"out_numel {o} != numel {i}"
    if size is None:
        return None
    if kind == "all_gather" and i is not None and o is not None and o != size * i:
        return f"out_numel {o} != {size} x numel {i}"
    if kind == "reduce_scatter" and i is not None and o is not None and i != size * o:
        return f"numel {i} != {size} x out_numel {o}"
    if kind == "all_to_all":
        for name, splits, total in (("in", e.in_splits, i), ("out", e.out_splits, o)):
            if splits is None:
                continue
            if len(splits) != size:
                return f"{name}_splits has {len(splits)} parts for a group of {size}"
            if total is not None and sum(splits) != total:
                return f"{name}_splits sum {sum(splits)} != {name} numel {total}"
    return None


def _key(e: CollectiveEntry, size: int | None) -> tuple[Any, ...]:
    """What must agree across a group's members for one call (KEY_FIELDS order)."""
    kind = op_kind(e.op)
    if kind in ("reduce_scatter", "scatter"):
        amount = e.out_numel if e.out_numel is not None else e.numel
    elif kind in ("barrier", "all_to_all"):
        amount = None  # all_to_all sizes differ per rank by design: split matrix, totals
    else:
        amount = e.numel
    broken = _relation(kind, e, size)
    return (kind, amount, e.dtype, e.out_dtype, None if broken is None else "broken")


def call(e: CollectiveEntry) -> dict[str, Any]:
    out: dict[str, Any] = {"pg": e.pg, "op": e.op, "numel": e.numel, "dtype": e.dtype}
    for name in ("out_numel", "out_dtype", "peer", "p2p_seq", "coalesced"):
        value = getattr(e, name)
        if value is not None:
            out[name] = value
    for name in ("in_splits", "out_splits"):
        value = getattr(e, name)
        if value is not None:
            out[name] = list(value[:16])
    out["seq"] = e.seq
    out["state"] = e.state
    return out


# -- desyncs -------------------------------------------------------------------------


@dataclass(slots=True)
class Desync:
    """The first differing call of one rank on one pg (or one send/recv pair) and what followed."""

    pg: str
    rank: int | None  # the culprit; None when no rank can be named (totals only)
    seq: int
    evidence: dict[str, Any]
    tie: bool
    summary: str
    first_seen: datetime | None
    count: int = 1
    last_seq: int = 0
    key: str = ""
    ranks: list[int] = field(default_factory=list)


class Matcher:
    """Walks every pg's seqs and every p2p pair once, collecting desyncs."""

    def __init__(self, ctx: Context, windows: dict[int, CollectiveWindow]) -> None:
        self.ctx = ctx
        self.groups = memberships(ctx, windows)
        # pg -> seq -> rank -> non-p2p entries at that seq, in window order
        self.calls: dict[str, dict[int, dict[int, list[CollectiveEntry]]]] = defaultdict(
            lambda: defaultdict(dict)
        )
        self.top: dict[tuple[str, int], int] = {}  # (pg, rank) -> highest seq seen
        # (pg, src, dst, direction) -> p2p_seq -> entry, and the highest p2p_seq seen
        self.p2p: dict[tuple[str, int, int, str], dict[int, CollectiveEntry]] = defaultdict(dict)
        self.p2p_top: dict[tuple[str, int, int, str], int] = {}
        for rank, w in windows.items():
            for e in w.entries:
                kind = op_kind(e.op)
                if kind in P2P:
                    if e.peer is None or e.p2p_seq is None:
                        continue
                    src, dst = (rank, e.peer) if kind == "send" else (e.peer, rank)
                    pk = (e.pg, src, dst, kind)
                    self.p2p[pk][e.p2p_seq] = e
                    self.p2p_top[pk] = max(self.p2p_top.get(pk, 0), e.p2p_seq)
                    continue
                self.calls[e.pg][e.seq].setdefault(rank, []).append(e)
                self.top[(e.pg, rank)] = max(self.top.get((e.pg, rank), 0), e.seq)
        self.desyncs: dict[tuple[str, str], Desync] = {}

    # -- collectives -------------------------------------------------------------
    def run(self) -> list[Desync]:
        for pg in sorted(self.calls):
            group = self.groups[pg]
            member = set(group.members)
            for seq in sorted(self.calls[pg]):
                present = {rk: es for rk, es in self.calls[pg][seq].items() if rk in member}
                if len(present) >= 2:
                    self._judge(group, seq, present)
        self._pairs()
        return sorted(self.desyncs.values(), key=lambda d: (d.pg, d.seq, d.key))

    def _note(self, dkey: tuple[str, str], make: Any, seq: int) -> None:
        d = self.desyncs.get(dkey)
        if d is None:
            d = make()
            d.last_seq = seq
            self.desyncs[dkey] = d
        elif seq != d.last_seq:
            d.count += 1
            d.last_seq = seq

    def _judge(self, group: Group, seq: int, present: dict[int, list[CollectiveEntry]]) -> None:
        # Fast path (the healthy common case): every member made the very same call(s).
        raw = {
            tuple((e.op, e.numel, e.dtype, e.out_numel, e.out_dtype) for e in es)
            for es in present.values()
        }
        # Identical calls share one key, so no majority can differ; only all_to_all's split
        # matrix is left to check.
        if len(raw) == 1 and all(op_kind(c[0]) != "all_to_all" for c in next(iter(raw))):
            return
        keys = {rk: tuple(_key(e, group.size) for e in es) for rk, es in present.items()}
        counts = Counter(keys.values())
        if len(counts) > 1:
            ranked = sorted(counts.items(), key=lambda kv: (-kv[1], repr(kv[0])))
            (major, major_n), second = ranked[0], ranked[1]
            tie = second[1] == major_n
            model = min(rk for rk, k in keys.items() if k == major)
            for rk in sorted(present):
                if keys[rk] == major:
                    continue
                self._deviation(group, seq, rk, present, keys, model, major_n, tie)
        self._all_to_all(group, seq, present)

    def _deviation(
        self,
        group: Group,
        seq: int,
        rank: int,
        present: dict[int, list[CollectiveEntry]],
        keys: dict[int, tuple[tuple[Any, ...], ...]],
        model: int,
        major_n: int,
        tie: bool,
    ) -> None:
        mine, theirs = keys[rank], keys[model]
        if len(mine) != len(theirs):
            index, diff = 0, ["coalesced"]
        else:
            index = next(i for i, (a, b) in enumerate(zip(mine, theirs, strict=True)) if a != b)
            diff = [
                k for k, a, b in zip(KEY_FIELDS, mine[index], theirs[index], strict=True) if a != b
            ]
        e, m = present[rank][index], present[model][index]
        relation = _relation(op_kind(e.op), e, group.size)

        def make() -> Desync:
            r = self.ctx.ranks.get(rank)
            evidence: dict[str, Any] = {
                "rank": rank,
                "node": r.node if r else None,
                "gpu": r.gpu if r else None,
                "pg": group.pg,
                "pg_desc": group.desc,
                "pg_size": len(group.members),
                "pg_members_known": group.known,
                "seq": seq,
                "rank_call": call(e),
                "majority_call": call(m),
                "majority_ranks": major_n,
                "ranks_at_seq": len(present),
                "differs_in": diff,
                "tie": tie,
            }
            if relation:
                evidence["size_relation"] = relation
            if len(present[rank]) > 1 or len(present[model]) > 1:
                evidence["coalesced_members"] = {
                    "rank": len(present[rank]),
                    "majority": len(present[model]),
                    "index": index,
                }
            where = f"pg {group.pg}" + (f" ({group.desc})" if group.desc else "")
            return Desync(
                pg=group.pg,
                rank=rank,
                seq=seq,
                evidence=evidence,
                tie=tie,
                summary=f"Collective mismatch on rank {rank}, {where} seq {seq}: "
                f"{e.op}({e.numel:,} x {e.dtype}) where {major_n} rank(s) called "
                f"{m.op}({m.numel:,} x {m.dtype})" + (f"; {relation}" if relation else ""),
                first_seen=e.started_ts,
                key=group.pg,
                ranks=[rank],
            )

        self._note((group.pg, f"rank:{rank}"), make, seq)

    def _all_to_all(
        self, group: Group, seq: int, present: dict[int, list[CollectiveEntry]]
    ) -> None:
        single = {rk: es[0] for rk, es in present.items() if len(es) == 1}
        a2a = {rk: e for rk, e in single.items() if op_kind(e.op) == "all_to_all"}
        if len(a2a) < 2:
            return
        index = {rk: i for i, rk in enumerate(group.members)}
        n = len(group.members)
        bad: Counter[int] = Counter()
        pairs: list[dict[str, Any]] = []
        for a, ea in sorted(a2a.items()):
            for b, eb in sorted(a2a.items()):
                if a == b or ea.in_splits is None or eb.out_splits is None:
                    continue
                if len(ea.in_splits) != n or len(eb.out_splits) != n:
                    continue  # the size relation already blames this rank
                sent, expected = ea.in_splits[index[b]], eb.out_splits[index[a]]
                if sent != expected:
                    bad[a] += 1
                    bad[b] += 1
                    pairs.append({"src": a, "dst": b, "sent": sent, "expected": expected})
        if bad:
            top = max(bad.values())
            culprits = sorted(rk for rk, c in bad.items() if c == top)
            tie = len(culprits) > 1
            for rk in culprits:
                self._a2a(group, seq, rk, a2a[rk], pairs, tie, len(a2a))
            return
        # No splits to compare: the totals must still balance once every member is here.
        if len(a2a) == n and all(
            e.numel is not None and e.out_numel is not None and e.in_splits is None
            for e in a2a.values()
        ):
            sent_total = sum(e.numel or 0 for e in a2a.values())
            received = sum(e.out_numel or 0 for e in a2a.values())
            if sent_total != received:

                def make() -> Desync:
                    return Desync(
                        pg=group.pg,
                        rank=None,
                        seq=seq,
                        evidence={
                            "pg": group.pg,
                            "pg_desc": group.desc,
                            "seq": seq,
                            "input_total": sent_total,
                            "output_total": received,
                            "missing_evidence": "per-destination split sizes",
                        },
                        tie=True,
                        summary=f"all_to_all on pg {group.pg} seq {seq} sends {sent_total} "
                        f"elements in all and receives {received}: some rank's splits are wrong",
                        first_seen=min(
                            (e.started_ts for e in a2a.values() if e.started_ts), default=None
                        ),
                        key=group.pg,
                        ranks=sorted(a2a),
                    )

                self._note((group.pg, "totals"), make, seq)

    def _a2a(
        self,
        group: Group,
        seq: int,
        rank: int,
        e: CollectiveEntry,
        pairs: list[dict[str, Any]],
        tie: bool,
        present: int,
    ) -> None:
        mine = [p for p in pairs if rank in (p["src"], p["dst"])]

        def make() -> Desync:
            r = self.ctx.ranks.get(rank)
            return Desync(
                pg=group.pg,
                rank=rank,
                seq=seq,
                evidence={
                    "rank": rank,
                    "node": r.node if r else None,
                    "gpu": r.gpu if r else None,
                    "pg": group.pg,
                    "pg_desc": group.desc,
                    "pg_size": len(group.members),
                    "pg_members_known": group.known,
                    "seq": seq,
                    "rank_call": call(e),
                    "differs_in": ["splits"],
                    "split_disagreements": mine[:16],
                    "peers_disagreeing": len(mine),
                    "ranks_at_seq": present,
                    "tie": tie,
                },
                tie=tie,
                summary=f"all_to_all split mismatch on rank {rank}, pg {group.pg} seq {seq}: "
                f"{len(mine)} peer(s) disagree with what it sends or expects",
                first_seen=e.started_ts,
                key=group.pg,
                ranks=[rank],
            )

        self._note((group.pg, f"rank:{rank}"), make, seq)

    # -- point to point ---------------------------------------------------------
    def _pairs(self) -> None:
        sends = {k[:3] for k in self.p2p if k[3] == "send"}
        for pg, src, dst in sorted(sends):
            out, into = self.p2p[(pg, src, dst, "send")], self.p2p.get((pg, src, dst, "recv"), {})
            last_ok: tuple[Any, ...] | None = None
            for k in sorted(set(out) & set(into)):
                s, r = out[k], into[k]
                sv, rv = (s.numel, s.dtype), (r.numel, r.dtype)
                if sv == rv:
                    last_ok = sv
                    continue
                # The side that changed from the pair's last matched call is the culprit.
                if last_ok is not None and rv == last_ok:
                    culprit, tie = src, False
                elif last_ok is not None and sv == last_ok:
                    culprit, tie = dst, False
                else:
                    culprit, tie = src, True
                self._p2p_desync(pg, src, dst, k, s, r, culprit, tie)

    def _p2p_desync(
        self,
        pg: str,
        src: int,
        dst: int,
        k: int,
        s: CollectiveEntry,
        r: CollectiveEntry,
        culprit: int,
        tie: bool,
    ) -> None:
        diff = [
            n for n, a, b in (("numel", s.numel, r.numel), ("dtype", s.dtype, r.dtype)) if a != b
        ]

        def make() -> Desync:
            rk = self.ctx.ranks.get(culprit)
            return Desync(
                pg=pg,
                rank=culprit,
                seq=k,
                evidence={
                    "rank": culprit,
                    "node": rk.node if rk else None,
                    "gpu": rk.gpu if rk else None,
                    "pg": pg,
                    "pg_desc": self.groups[pg].desc if pg in self.groups else None,
                    "p2p_seq": k,
                    "src": src,
                    "dst": dst,
                    "send_call": call(s),
                    "recv_call": call(r),
                    "differs_in": diff,
                    "tie": tie,
                },
                tie=tie,
                summary=f"Send/recv mismatch on pg {pg}, {src} -> {dst} #{k}: sent "
                f"{s.numel} {s.dtype}, receiver expected {r.numel} {r.dtype}"
                + ("" if tie else f" (rank {culprit} changed)"),
                first_seen=s.started_ts or r.started_ts,
                key=f"{pg}/p2p/{src}->{dst}",
                ranks=[src, dst],
            )

        self._note((pg, f"p2p:{src}->{dst}"), make, k)

    # -- entered? ---------------------------------------------------------------
    def entered(self, rank: int, pg: str, seq: int) -> bool:
        es = self.calls.get(pg, {}).get(seq, {}).get(rank)
        if es and any(e.state in ENTERED for e in es):
            return True
        return self.top.get((pg, rank), 0) > seq  # it moved past (the entry scrolled away)

    def p2p_entered(self, pk: tuple[str, int, int, str], k: int) -> bool:
        e = self.p2p.get(pk, {}).get(k)
        return (e is not None and e.state in ENTERED) or self.p2p_top.get(pk, 0) > k


# -- findings ------------------------------------------------------------------------


def _report(ctx: Context, desyncs: Iterable[Desync]) -> dict[tuple[str, str], Finding]:
    out: dict[tuple[str, str], Finding] = {}
    for d in desyncs:
        subject = (
            rank_subject(ctx.snap.group, d.rank)
            if d.rank is not None
            else group_subject(ctx.snap.group)
        )
        evidence = {**d.evidence, "differing_calls": d.count, "last_differing_seq": d.last_seq}
        f = ctx.put(
            ctx.new(
                kind="collective_mismatch",
                subject=subject,
                role=UNDETERMINED if d.tie else ROOT_CAUSE,
                severity=CRITICAL,
                summary=d.summary
                + (f" ({d.count - 1} later call(s) differ too)" if d.count > 1 else ""),
                first_seen=d.first_seen or ctx.now,
                evidence=evidence,
                key=d.key,
            )
        )
        ctx.unsafe_reasons[f.id] = (
            "collective mismatch: a restart replays the same program and hangs again"
        )
        out[(d.key, str(d.rank))] = f
    return out


def _link_cause(ctx: Context, ranks: list[int]) -> Finding | None:
    for rk in ranks:
        r = ctx.ranks[rk]
        subjects = [gpu_subject(r.gpu)] if r.gpu else []
        subjects += [node_subject(r.node)] if r.node else []
        for s in subjects:
            for f in ctx.on(s):
                if f.kind in LINK_KINDS:
                    return f
    # A partition anywhere in the group stalls every rank's collective, on both sides.
    for node in sorted(ctx.ranks_on_node):
        for f in ctx.on(node_subject(node)):
            if f.kind == "network_partition":
                return f
    return None


def _blocked_in(windows: dict[int, CollectiveWindow], rank: int) -> str | None:
    """What a missing rank is itself waiting in, if it reports a started call."""
    w = windows.get(rank)
    if w is None:
        return None
    waits = [e for e in w.entries if e.state == "started"]
    if not waits:
        return None
    e = min(waits, key=_wait_order)
    where = f" to/from {e.peer}" if e.peer is not None else ""
    return f"{e.op}{where} on pg {e.pg} seq {e.p2p_seq if e.p2p_seq is not None else e.seq}"


def _suspect(ctx: Context, rank: int, what: str, waiters: int, blocked: str | None) -> Finding:
    r = ctx.ranks.get(rank)
    node = r.node if r else None
    return ctx.put(
        ctx.new(
            kind="rank_hang",
            subject=rank_subject(ctx.snap.group, rank),
            role=UNDETERMINED,
            severity=CRITICAL,
            summary=f"Rank {rank} on {node or '?'} never entered {what} "
            f"({waiters} rank(s) wait): no exit, device or node evidence"
            + (f"; it is blocked in {blocked}" if blocked else ""),
            first_seen=(ctx.last_progress(r) if r else None) or ctx.now,
            last_seen=ctx.now,
            evidence={
                "rank": rank,
                "node": node,
                "gpu": r.gpu if r else None,
                "never_entered": what,
                "blocked_in": blocked,
                "reported": r is not None,
                "last_progress": ctx.last_progress(r) if r else None,
                "missing_evidence": "no process exit, device fault or node loss reported "
                "for this rank; collect a stack dump (py-spy) or flight recorder",
            },
        )
    )


def _wait_order(e: CollectiveEntry) -> tuple[Any, ...]:
    return (e.started_ts is None, e.started_ts.timestamp() if e.started_ts else 0.0, e.seq)


class Wait:
    """One rank's oldest started call and what a `collective_timeout` about it says that
    does not change from pass to pass (its subject, fingerprint, the evidence about the
    call): derived once per matching (`_Matched.waiters`), emitted every pass."""

    __slots__ = (
        "entry",
        "fingerprint",
        "head",
        "id",
        "key",
        "prefix",
        "rank",
        "since",
        "subject",
        "suffix",
    )

    def __init__(self, ctx: Context, rank: int, e: CollectiveEntry, since: datetime) -> None:
        r = ctx.ranks[rank]
        self.rank, self.entry, self.since = rank, e, since
        self.key = _target_key(rank, e)
        self.subject = rank_subject(ctx.snap.group, rank)
        self.fingerprint = fingerprint_of(
            ctx.snap.group, ctx.snap.generation, "collective_timeout", self.subject, self.key
        )
        self.id = self.fingerprint[:16]  # as make_finding derives it
        self.head: dict[str, Any] = {
            "rank": rank,
            "node": r.node,
            "gpu": r.gpu,
            "seq": e.seq,
            "pg": e.pg,
            "op": e.op,
            "numel": e.numel,
            "dtype": e.dtype,
            **({"peer": e.peer, "p2p_seq": e.p2p_seq} if e.peer is not None else {}),
            "started_ts": e.started_ts,
        }
        seq = e.p2p_seq if is_p2p(e) and e.p2p_seq is not None else e.seq
        self.prefix = f"Rank {rank} waiting "  # the summary around the seconds waited
        self.suffix = f"s in {e.op} on pg {e.pg} seq {seq}: "


def _target_key(rank: int, e: CollectiveEntry) -> str:
    kind = op_kind(e.op)
    if kind not in P2P:
        return f"{e.pg}/{e.seq}"
    if e.peer is None:
        return f"{e.pg}/p2p/{rank}/{e.seq}"
    src, dst = (rank, e.peer) if kind == "send" else (e.peer, rank)
    return f"{e.pg}/p2p/{src}->{dst}/{e.p2p_seq}"


def _target(m: Matcher, rank: int, e: CollectiveEntry) -> tuple[str, str, list[int]]:
    """(key, what, the members that never entered) of one rank's wait."""
    kind = op_kind(e.op)
    if kind in P2P:
        if e.peer is None:
            return (f"{e.pg}/p2p/{rank}/{e.seq}", f"{e.op} on pg {e.pg}", [])
        src, dst = (rank, e.peer) if kind == "send" else (e.peer, rank)
        other = "recv" if kind == "send" else "send"
        k = e.p2p_seq
        what = (
            f"the {other} {src} -> {dst}" + (f" #{k}" if k is not None else "") + f" on pg {e.pg}"
        )
        if k is None:
            peer_waits = any(
                x.state in ENTERED and x.peer == rank
                for x in m.p2p.get((e.pg, src, dst, other), {}).values()
            )
            missing = [] if peer_waits else [e.peer]
        else:
            missing = [] if m.p2p_entered((e.pg, src, dst, other), k) else [e.peer]
        return (f"{e.pg}/p2p/{src}->{dst}/{k}", what, missing)
    group = m.groups.get(e.pg)
    members = group.members if group else ()
    missing = [rk for rk in members if rk != rank and not m.entered(rk, e.pg, e.seq)]
    return (f"{e.pg}/{e.seq}", f"{e.op} on pg {e.pg} seq {e.seq}", missing)


@dataclass(frozen=True, slots=True)
class _Matched:
    """What matching concluded from the windows alone (kept between passes)."""

    matcher: Matcher
    desyncs: list[Desync]
    waits: list[tuple[int, CollectiveEntry, datetime]]  # each rank's oldest started call
    # Derived from the above (and the group's name and generation) on first use, kept with
    # it: each wait's `Wait`, and `_target` per (first waiter, target key). Read-only.
    cache: dict[str, Any] = field(default_factory=dict)

    def waiters(self, ctx: Context) -> list[Wait]:
        key = (ctx.snap.group, ctx.snap.generation)
        hit = self.cache.get("waiters")
        if hit is None or hit[0] != key:
            hit = self.cache["waiters"] = (key, [Wait(ctx, *w) for w in self.waits])
        out: list[Wait] = hit[1]
        return out

    def target(self, rank: int, e: CollectiveEntry) -> tuple[str, str, list[int]]:
        """`_target(self.matcher, rank, e)`, a function of the windows: computed once."""
        got: dict[tuple[int, int], tuple[str, str, list[int]]]
        got = self.cache.setdefault("targets", {})
        k = (rank, id(e))  # `e` is held by `waits`: its id is not reused
        hit = got.get(k)
        if hit is None:
            hit = got[k] = _target(self.matcher, rank, e)
        return hit


def _match(ctx: Context, windows: dict[int, CollectiveWindow]) -> _Matched:
    m = Matcher(ctx, windows)
    desyncs = m.run()
    waits: list[tuple[int, CollectiveEntry, datetime]] = []
    for rank, w in sorted(windows.items()):
        started = [(e, e.started_ts) for e in w.entries if e.state == "started" and e.started_ts]
        if started:
            e, since = min(started, key=lambda pair: _wait_order(pair[0]))
            waits.append((rank, e, since))
    return _Matched(m, desyncs, waits)


def run(ctx: Context) -> None:
    windows = ctx.windows
    if not windows:
        return
    # Matching is a function of the windows, the membership (reported groups, the ranks)
    # and the node/GPU a desync names: a pass in which no window changed (every pass
    # between two flight-recorder dumps, however many steps) reuses last pass's.
    match_key = (ctx.windows_key, ctx.snap.process_groups)
    matched: _Matched = ctx.keyed("collectives", match_key, partial(_match, ctx, windows))
    desyncs = matched.desyncs
    found = _report(ctx, desyncs)
    if ctx.quiet:
        return  # ranks wait in barriers while a checkpoint is written: not a timeout
    threshold = ctx.stall_threshold_s or ctx.cfg.hang_floor_s
    # A pg's desync explains every later wait on that pg; a pair's, every later wait on it.
    pg_desync: dict[str, tuple[int, Finding]] = {}
    pair_desync: dict[str, tuple[int, Finding]] = {}
    for d in desyncs:
        f = found[(d.key, str(d.rank))]
        table = pair_desync if "/p2p/" in d.key else pg_desync
        if d.key not in table or d.seq < table[d.key][0]:
            table[d.key] = (d.seq, f)
    pending: dict[str, list[Wait]] = defaultdict(list)
    targets: dict[str, tuple[str, list[int], Finding | None]] = {}
    covered = ctx.covered_ranks()  # no finding is added until the timeouts below
    for w in matched.waiters(ctx):
        if w.rank in covered:
            continue
        key = w.key
        pending[key].append(w)
        if key in targets:
            continue  # the members that never entered are the same for every waiter
        rank, e = w.rank, w.entry
        _, what, missing = matched.target(rank, e)
        cause = None
        if is_p2p(e) and e.peer is not None and e.p2p_seq is not None:
            kind = op_kind(e.op)
            src, dst = (rank, e.peer) if kind == "send" else (e.peer, rank)
            hit = pair_desync.get(f"{e.pg}/p2p/{src}->{dst}")
            cause = hit[1] if hit and hit[0] <= e.p2p_seq else None
        elif not is_p2p(e):
            hit = pg_desync.get(e.pg)
            cause = hit[1] if hit and hit[0] <= e.seq else None
        targets[key] = (what, missing, cause)
    waiter_of = {wt.rank: key for key, ws in pending.items() for wt in ws}
    # Ranks waiting on each other across groups: the rank whose call order left its groups'
    # majority is a mismatch, and every wait of the circle is its symptom (its own is not).
    culprits = _order_divergences(ctx, matched, pending, targets, waiter_of, threshold)
    for key in list(pending):
        pending[key] = [wt for wt in pending[key] if wt.rank not in culprits]
        if not pending[key]:
            del pending[key]
    for key, all_waiting in sorted(pending.items()):
        what, direct, mismatch = targets[key]
        waiting_ranks = {wt.rank for wt in all_waiting}
        direct = [rk for rk in direct if rk not in waiting_ranks]
        # A missing rank that is itself blocked in another call is not the culprit: follow
        # it to the ranks that block the whole chain (and any mismatch on the way).
        missing, chained = _chain(direct, waiter_of, targets, key)
        if mismatch is None and chained:
            mismatch = chained[0]
        cycle = bool(direct) and not missing and mismatch is None
        # A wait already explained by a root cause (the rank it waits for lost its GPU, exited,
        # or mismatched) is a symptom at once: the page names the cause within a second
        # instead of after a timeout. An unexplained wait must outlast the stall threshold.
        explained = mismatch is not None or any(ctx.rank_cause(rk) for rk in missing)
        now = ctx.now
        waiting = [(wt, (now - wt.since).total_seconds()) for wt in all_waiting]
        if not explained:
            # Judged on what was delivered: a member whose node lags (an agent between
            # sends) may have entered the call since, and a waiter on such a node may have
            # left it. The wait seen is up to the earliest of those deliveries.
            seen = min((_known_at(ctx, rk) for rk in missing), default=now)
            waiting = [
                (wt, waited)
                for wt, waited in waiting
                if (min(seen, _known_at(ctx, wt.rank)) - wt.since).total_seconds() > threshold
            ]
        if not waiting:
            continue
        causes: list[Finding] = []
        if mismatch is not None:
            causes.append(mismatch)
        else:
            for rk in missing:
                c = ctx.rank_cause(rk)
                if c is not None and c.id not in {x.id for x in causes}:
                    causes.append(c)
        unexplained = [rk for rk in missing if ctx.rank_cause(rk) is None]
        role = SYMPTOM
        note = None
        if cycle:
            role = UNDETERMINED
            missing = direct
            sides = "; ".join(f"rank {rk} in {_blocked_in(windows, rk)}" for rk in direct[:4])
            note = (
                f"rank(s) {', '.join(map(str, direct[:8]))} wait in other calls that wait "
                f"on these ranks in turn ({sides}): an ordering deadlock across process "
                "groups, and no other rank's call order says which side diverged"
            )
        elif not causes and missing:
            causes = [
                _suspect(ctx, rk, what, len(waiting), _blocked_in(windows, rk))
                for rk in unexplained[:16]
            ]
            role = UNDETERMINED
        elif not causes:
            link = _link_cause(ctx, [wt.rank for wt, _ in waiting])
            if link is not None:
                causes = [link]
            else:
                role = UNDETERMINED
                note = (
                    "every rank entered this collective and none mismatched, exited or lost "
                    "its GPU: suspect links or congestion; missing network counters"
                )
        causes.sort(key=lambda f: (SEVERITY_RANK[f.severity], f.id))
        head = causes[0].summary if causes else None
        _timeouts(ctx, waiting, role, head, missing, unexplained, note, causes, threshold, direct)


# -- order across groups ---------------------------------------------------------------


def _role(group: Group | None) -> Any:
    """What makes two process groups the same group for different ranks: the world, or a
    reported group's description, size and member spacing (rank 3's TP group [2, 3] and
    rank 5's [4, 5] are both ("tp", 2, (1,))). None for an inferred group: only its own
    members can speak for it."""
    if group is None:
        return None
    if group.pg == DEFAULT_PG:
        return DEFAULT_PG
    if not group.known:
        return None
    ranks = sorted(group.members)
    return (group.desc or "", len(ranks), tuple(b - a for a, b in pairwise(ranks)))


def _instances(m: Matcher) -> dict[Any, dict[int, str]]:
    """role -> rank -> that rank's pg of the role (a rank with two pgs of one role has none:
    its order between them says nothing)."""
    out: dict[Any, dict[int, str | None]] = defaultdict(dict)
    for g in m.groups.values():
        role = _role(g)
        if role is None:
            continue
        for rk in g.members:
            out[role][rk] = None if rk in out[role] else g.pg
    return {role: {rk: pg for rk, pg in got.items() if pg} for role, got in out.items()}


def _positions(
    w: CollectiveWindow | None, calls: tuple[tuple[str, int], tuple[str, int]]
) -> tuple[int | None, int | None]:
    """Where in a rank's window (its call order) it entered each of two calls (pg, seq), or
    moved past it (the first entered call on that pg at that seq or later); None if not."""
    found: list[int | None] = [None, None]
    if w is not None:
        for i, e in enumerate(w.entries):
            if e.state not in ENTERED:
                continue
            for j, (pg, seq) in enumerate(calls):
                if found[j] is None and e.pg == pg and e.seq >= seq and not is_p2p(e):
                    found[j] = i
            if found[0] is not None and found[1] is not None:
                break
    return found[0], found[1]


# The order of two groups' calls is read from at most this many ranks (every k-th in rank
# order): a synchronous job's ranks share one program, and at 16k ranks each vote walks
# every window.
ORDER_VOTERS = 1024


def _order_votes(
    matched: _Matched,
    windows: dict[int, CollectiveWindow],
    x: CollectiveEntry,
    y: CollectiveEntry,
) -> tuple[int, int]:
    """How many ranks called (their instance of) `x`'s call before `y`'s, and how many
    `y`'s first: each rank's own window is the evidence of its order. A rank counts for x
    first when it entered x and not y, or both with x earlier in its window."""
    m = matched.matcher
    gx, gy = m.groups.get(x.pg), m.groups.get(y.pg)
    rx, ry = _role(gx), _role(gy)
    key = ("order", rx if rx is not None else x.pg, x.seq, ry if ry is not None else y.pg, y.seq)
    done: dict[tuple[Any, ...], tuple[int, int]] = matched.cache.setdefault("order", {})
    hit = done.get(key)
    if hit is not None:
        return hit
    roles = matched.cache.get("roles")
    if roles is None:
        roles = matched.cache["roles"] = _instances(m)

    def instances(role: Any, g: Group | None, pg: str) -> dict[int, str]:
        if role is not None:
            got: dict[int, str] = roles.get(role, {})
            return got
        return {rk: pg for rk in g.members} if g is not None else {}

    own_x, own_y = instances(rx, gx, x.pg), instances(ry, gy, y.pg)
    voters = sorted(own_x.keys() & own_y.keys())
    first_x = first_y = 0
    for rk in voters[:: -(-len(voters) // ORDER_VOTERS) or 1]:
        px, py = _positions(windows.get(rk), ((own_x[rk], x.seq), (own_y[rk], y.seq)))
        if px is None and py is None:
            continue
        if py is None or (px is not None and px < py):
            first_x += 1
        else:
            first_y += 1
    done[key] = (first_x, first_y)
    return first_x, first_y


def _order_divergences(
    ctx: Context,
    matched: _Matched,
    pending: dict[str, list[Wait]],
    targets: dict[str, tuple[str, list[int], Finding | None]],
    waiter_of: dict[int, str],
    threshold: float,
) -> set[int]:
    """Ranks blocked in collectives of different groups, each waiting for the other (rank 3
    in its TP group's all_reduce, rank 2 and the world in the world's): the rank that called
    its groups' collectives in an order the majority of ranks did not is the culprit. The
    order is read from every rank that holds both groups' calls (its own instance of each,
    as `_role` matches them): if most entered the waiters' call before the other, the rank
    that went to the other one first diverged. Judged only once the circle has lasted past
    the threshold on both sides (ranks may legitimately sit in different groups' calls for
    a moment: a pipeline's stages, an async op issued early). A tie (two ranks, no other
    rank to say the order) names nobody: the circle stays an undetermined deadlock.
    Records each culprit's `collective_mismatch` and makes it the cause of the circle's
    waits (`targets`); returns the culprits."""
    waits = {wt.rank: wt for ws in pending.values() for wt in ws}
    windows = ctx.windows

    def stuck(a: Wait, b: Wait) -> bool:
        seen = min(_known_at(ctx, a.rank), _known_at(ctx, b.rank))
        return (seen - a.since).total_seconds() > threshold

    out: dict[int, Finding] = {}
    # Whether a call's waiters wait on a rank that waits on nothing (per call and the call
    # the chain started from: the same for every rank blocked in it; 16k ranks may be).
    chains: dict[tuple[str, str], bool] = {}
    for key in sorted(pending):
        what, missing, cause = targets[key]
        if cause is not None or "/p2p/" in key:
            continue
        waiting = [wt for wt in pending[key] if wt.rank not in out]
        if not waiting:
            continue
        x = min(waiting, key=lambda wt: (wt.since, wt.rank))  # the longest wait
        for rk in missing:
            other = waiter_of.get(rk)
            if rk in out or other is None or other == key or "/p2p/" in other:
                continue
            if targets[other][2] is not None:
                continue
            if (other, key) not in chains:
                roots, found = _chain([rk], waiter_of, targets, key)
                chains[(other, key)] = bool(roots or found)
            if chains[(other, key)]:
                continue  # it waits for a rank that waits on nothing: that one is the story
            y = waits[rk]
            if not (stuck(x, y) and stuck(y, x)):
                continue
            first_x, first_y = _order_votes(matched, windows, x.entry, y.entry)
            if first_x <= first_y:
                continue
            blocked = sorted(wt.rank for wt in pending[key])
            out[rk] = _order_mismatch(ctx, matched, y, x, blocked, (first_x, first_y))
    for rank, f in out.items():
        for key in (waiter_of[rank], *(k for k, (_, miss, _) in targets.items() if rank in miss)):
            what, missing, cause = targets[key]
            if cause is None:
                targets[key] = (what, missing, f)
    return set(out)


def _order_mismatch(
    ctx: Context, matched: _Matched, y: Wait, x: Wait, blocked: list[int], votes: tuple[int, int]
) -> Finding:
    """The `collective_mismatch` of rank `y.rank`, blocked in `y.entry` while `blocked`
    ranks wait for it in `x.entry` (which most ranks called first)."""
    e, m = y.entry, x.entry
    groups = matched.matcher.groups
    gy, gx = groups.get(e.pg), groups.get(m.pg)

    def where(c: CollectiveEntry, g: Group | None) -> str:
        desc = f" ({g.desc})" if g is not None and g.desc else ""
        return f"{c.op} on pg {c.pg}{desc} seq {c.seq}"

    r = ctx.ranks.get(y.rank)
    evidence: dict[str, Any] = {
        "rank": y.rank,
        "node": r.node if r else None,
        "gpu": r.gpu if r else None,
        "pg": m.pg,
        "pg_desc": gx.desc if gx else None,
        "pg_size": len(gx.members) if gx else None,
        "pg_members_known": bool(gx and gx.known),
        "seq": m.seq,
        "rank_call": call(e),
        "majority_call": call(m),
        "differs_in": ["order"],
        "blocked_in": {"rank": where(e, gy), "waiting": where(m, gx)},
        "waiting_ranks": ctx.capped(blocked),
        "waiting_count": len(blocked),
        "order_votes": {"waiting_call_first": votes[0], "rank_call_first": votes[1]},
        "tie": False,
    }
    d = Desync(
        pg=m.pg,
        rank=y.rank,
        seq=m.seq,
        evidence=evidence,
        tie=False,
        summary=f"Collective order diverged on rank {y.rank}: it is blocked in {where(e, gy)} "
        f"while {len(blocked)} rank(s) wait for it in {where(m, gx)}, which {votes[0]} of "
        f"{sum(votes)} ranks called first",
        first_seen=e.started_ts,
        key=f"{m.pg}/order",
        ranks=[y.rank],
    )
    return _report(ctx, [d])[(d.key, str(y.rank))]


def _known_at(ctx: Context, rank: int) -> datetime:
    """Up to when the rank's node has delivered its evidence (Context.known_at)."""
    r = ctx.ranks.get(rank)
    return ctx.known_at(r.node if r is not None else None)


def _chain(
    direct: list[int],
    waiter_of: dict[int, str],
    targets: dict[str, tuple[str, list[int], Finding | None]],
    key: str,
) -> tuple[list[int], list[Finding]]:
    """(ranks that block `direct` without waiting themselves, mismatches on the way)."""
    roots: set[int] = set()
    found: list[Finding] = []
    seen_keys, seen = {key}, set()
    stack = list(direct)
    while stack:
        rk = stack.pop()
        if rk in seen:
            continue
        seen.add(rk)
        k = waiter_of.get(rk)
        if k is None:
            roots.add(rk)
            continue
        if k in seen_keys:
            continue
        seen_keys.add(k)
        _, miss, cause = targets[k]
        if cause is not None:
            found.append(cause)
        stack.extend(miss)
    return sorted(roots), found


def _timeouts(
    ctx: Context,
    waiting: list[tuple[Wait, float]],
    role: str,
    head: str | None,
    missing: list[int],
    unexplained: list[int],
    note: str | None,
    causes: list[Finding],
    threshold: float,
    direct: list[int],
) -> None:
    """One `collective_timeout` per (waiter, seconds waited) of one target. What every
    waiter shares is worked out once, what a waiter's call says comes from its `Wait`: 16k
    ranks waiting on one Xid'd rank are 16k findings a pass."""
    why = (
        f"caused by {head}"
        if role == SYMPTOM and head
        else (
            f"rank(s) {', '.join(map(str, missing[:4]))} never entered"
            if missing
            else "cause undetermined"
        )
    )
    thr = round(threshold, 3)
    shown = ctx.capped(direct), ctx.capped(missing), ctx.capped(unexplained)
    extra = {"missing_evidence": note} if note else {}
    caused_by = tuple([c.id for c in causes[: ctx.cfg.max_evidence_items]])
    now = ctx.now
    for wt, waited in waiting:
        evidence = {
            **wt.head,
            "waiting_s": round(waited, 3),
            "threshold_s": thr,
            "missing_ranks": list(shown[0]),
            "blocking_ranks": list(shown[1]),
            "unexplained_missing": list(shown[2]),
            **extra,
        }
        # `ctx.new` spelled out (positional, in Finding's field order): the id and the
        # fingerprint are the wait's, made once.
        summary = f"{wt.prefix}{waited:.0f}{wt.suffix}{why}"
        ctx.put(
            Finding(
                wt.id,
                "collective_timeout",
                wt.subject,
                role,
                MAJOR,
                summary,
                wt.since,
                now,
                wt.fingerprint,
                evidence,
                caused_by,
            )
        )
