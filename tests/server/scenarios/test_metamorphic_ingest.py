"""Metamorphic harness through real ingest: the same evidence, posted as agents may post
it, settles on the same incidents and proposals.

Each scenario is a fault of the seed's matrix on the fault matrix's job (8 ranks, 2 nodes:
tests/server/scenarios/timeline.py). Its healthy history is posted first; then the fault
window's records are cut into each node's batches (one per send interval, 5 s at most:
agents/wire.py; process exits and device/host events at once) and posted through POST
/api/v1/ingest in the order a *delivery plan* gives, with a diagnosis pass after each
arrival, as the service runs them: nodes interleaved at random latencies, the root cause's
batch held back by up to a send interval, a batch whose first attempt timed out after it
was stored and is posted again (same seq: a duplicate), a node's spool replayed after an
outage; and, apart, with a healthy neighbour's noise (a straggler within tolerance, an
informational Xid, a corrected AER). Each variant runs as its own group on its own nodes
beside the reference (everything in time order). Once the evidence settled (one send
interval after the last arrival) the live incidents — root cause, subject, role, the
symptoms folded under each — and the remediation proposals must equal the reference's.
A failure prints the variant and its posts in order.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pytest

from agents.wire import MAX_SEND_INTERVAL_S
from console import pipeline
from console.models import VERDICT_SETTLES_AFTER, Action, ConsistencyGroup, Incident
from tests.conftest import make_batch
from tests.server.scenarios.timeline import HEALTHY_S, PER_NODE, Timeline, _default_phases

pytestmark = pytest.mark.django_db

FAULT = HEALTHY_S + 1.0
SEND_S = MAX_SEND_INTERVAL_S
URGENT = frozenset({"device_event", "host_event"})
Record = dict[str, Any]


class Variant(Timeline):
    """The scenario's job as its own group on its own nodes (`<tag>-node-<i>`)."""

    tag: str = ""

    def node(self, rank: int) -> str:
        return f"{self.tag}-node-{rank // PER_NODE}"


def _job(post: Any, tag: str) -> Variant:
    """The fault matrix's healthy job (timeline.healthy_job) as group `<tag>-job`."""
    t = Variant(post=post, group=f"{tag}-job")
    t.tag = tag
    t.boot(at=0)
    t.good_checkpoint("ckpt-10", at=10.5, step=10)
    t.steps(first=0, count=HEALTHY_S, at=1)
    t.heartbeats(until=HEALTHY_S + 40)
    return t


def _exit(t: Timeline, rank: int, at: float, **fields: Any) -> None:
    t.add(
        t.node(rank),
        t.at(at),
        {
            "kind": "process",
            "group": t.group,
            "generation": 1,
            "rank": rank,
            "event": "exited",
            "gpu": t.gpu(rank),
            **fields,
        },
    )


def _waits(t: Timeline, missing: set[int], **odd: Any) -> None:
    t.collectives(
        seq=HEALTHY_S,
        at=FAULT + 0.2,
        entered=[r for r in range(t.ranks) if r not in missing],
        **odd,
    )


# -- scenarios: (name, build(t), the root cause's kind and subject) -----------------------


def _kill(t: Timeline) -> None:
    """Rank 5's node lost (the launcher reports the SIGKILL); the survivors' gloo errors are
    stamped before and after it; the rest wait in the collective."""
    _exit(t, 5, FAULT, exit_code=137, signal=9, reason="killed")
    _exit(t, 1, FAULT - 0.4, exit_code=1, reason="exception", error_type="RuntimeError")
    _exit(t, 6, FAULT + 0.3, exit_code=1, reason="exception", error_type="RuntimeError")
    _waits(t, {5, 1, 6})


def _xid(t: Timeline) -> None:
    t.add(
        t.node(5),
        t.at(FAULT),
        {"kind": "device_event", "gpu": t.gpu(5), "event": "xid", "code": 79},
    )
    _waits(t, {5})


def _exception(t: Timeline) -> None:
    _exit(t, 2, FAULT, exit_code=1, reason="exception", error_type="ValueError")
    _waits(t, {2})


def _mismatch(t: Timeline) -> None:
    _waits(t, set(), **{"6": {"dtype": "float32"}})


def _nan(t: Timeline) -> None:
    t.steps(first=HEALTHY_S, count=10, at=FAULT, loss=lambda r, s: "NaN" if r == 4 else 1.9)


def _corrupt(t: Timeline) -> None:
    t.checkpoint("ckpt-10", at=FAULT, step=10, phase="corrupt", detail="shard1 sha256")
    t.steps(first=HEALTHY_S, count=10, at=FAULT)


def _wrong_group(t: Timeline) -> None:
    """TP 2: rank 3 enters its TP group's all_reduce where the others enter the world's."""
    for rk in range(t.ranks):
        tp, members = str(rk // 2 + 1), [rk - rk % 2, rk - rk % 2 + 1]
        t.add(
            t.node(rk),
            t.at(5),
            {
                "kind": "process_groups",
                "group": t.group,
                "generation": 1,
                "rank": rk,
                "groups": [
                    {"pg": "default", "size": t.ranks},
                    {"pg": tp, "size": 2, "ranks": members, "desc": "tp"},
                ],
            },
        )
        entries = []
        for k in range(1, 4):
            for pg in (tp, "default"):
                entries.append(
                    {
                        "seq": k,
                        "pg": pg,
                        "op": "all_reduce",
                        "numel": 4096,
                        "dtype": "bfloat16",
                        "state": "completed",
                        "started_ts": t.at(FAULT - 4 + k).isoformat(),
                    }
                )
        entries.append(
            {
                "seq": 4,
                "pg": tp if rk == 3 else "default",
                "op": "all_reduce",
                "numel": 4096,
                "dtype": "bfloat16",
                "state": "started",
                "started_ts": t.at(FAULT).isoformat(),
            }
        )
        t.add(
            t.node(rk),
            t.at(FAULT + 2),
            {
                "kind": "collective",
                "group": t.group,
                "generation": 1,
                "rank": rk,
                "entries": entries,
            },
        )


def _split_brain(t: Timeline) -> None:
    """The launcher restarts into generation 2 (its transition from node 0) while rank 6 of
    generation 1 (node 1) still writes steps after the fence."""
    t.add(
        t.node(0),
        t.at(FAULT),
        {
            "kind": "transition",
            "group": t.group,
            "generation": 2,
            "from_state": "recovering",
            "to_state": "running",
            "restart_count": 1,
        },
    )
    t.steps(first=HEALTHY_S, count=3, at=FAULT + 0.5, ranks=[6])


def _input_stall(t: Timeline) -> None:
    """Rank 2 waits on its data loader: 800 ms input phases from the fault on."""

    def phases(rank: int, s: int) -> dict[str, float]:
        data = 800.0 if rank == 2 else 40.0
        return {"compute": 650.0, "collective": 250.0, "input": data, "optimizer": 60.0}

    # The job runs on as long as the nodes beat (HEALTHY_S + 40): a straggler, not a stall.
    t.steps(first=HEALTHY_S, count=40, at=FAULT, phases=phases)


def _restart_moved(t: Timeline) -> None:
    """Rank 5's GPU falls off the bus (Xid 79) and stops generation 1; the launcher starts
    generation 2 with rank 5 on a spare node (a new GPU), the other ranks where they were;
    rank 2 of generation 2 then fails. The dead GPU is generation 1's cause, not 2's."""
    _xid(t)
    restart, spare = FAULT + 3, f"{getattr(t, 'tag', '')}-node-spare"
    t.add(
        t.node(0),
        t.at(restart),
        {"kind": "transition", "group": t.group, "generation": 2, "from_state": "recovering",
         "to_state": "running", "restart_count": 1, "world_size": t.ranks},
    )  # fmt: skip
    for i in range(0, int(HEALTHY_S + 40) + 1, 5):
        t.add(spare, t.at(i), {"kind": "heartbeat", "uptime_s": float(i)})
    for rk in range(t.ranks):
        node, gpu = (spare, f"GPU-{t.group}-spare-0") if rk == 5 else (t.node(rk), t.gpu(rk))
        t.add(
            node,
            t.at(restart + 0.5),
            {"kind": "process", "group": t.group, "generation": 2, "rank": rk,
             "event": "started", "pid": 200 + rk, "gpu": gpu},
        )  # fmt: skip
        for k in range(3):
            t.add(
                node,
                t.at(restart + 1 + k),
                {"kind": "step", "group": t.group, "generation": 2, "rank": rk,
                 "step": 100 + k, "tokens": 4096, "duration_ms": 1000.0,
                 "phases": _default_phases(rk, k), "loss": 1.9},
            )  # fmt: skip
    failed = restart + 4
    t.add(
        t.node(2),
        t.at(failed),
        {"kind": "process", "group": t.group, "generation": 2, "rank": 2, "event": "exited",
         "gpu": t.gpu(2), "exit_code": 1, "reason": "exception", "error_type": "ValueError"},
    )  # fmt: skip
    t.generation = 2
    t.collectives(seq=103, at=failed + 0.2, entered=[r for r in range(t.ranks) if r != 2])
    t.generation = 1
    old = t.records[t.node(5)]
    moved = [
        r for r in old if r["kind"] == "collective" and r["generation"] == 2 and r["rank"] == 5
    ]
    t.records[t.node(5)] = [r for r in old if not any(r is m for m in moved)]
    t.records[spare] += moved


SCENARIOS: dict[str, tuple[Callable[[Timeline], None], str, Callable[[Timeline], str]]] = {
    "kill": (_kill, "process_exit", lambda t: f"rank:{t.group}/5"),
    "xid": (_xid, "xid", lambda t: f"gpu:{t.gpu(5)}"),
    "exception": (_exception, "exception", lambda t: f"rank:{t.group}/2"),
    "mismatch": (_mismatch, "collective_mismatch", lambda t: f"rank:{t.group}/6"),
    "nan": (_nan, "nan_loss", lambda t: f"group:{t.group}"),
    "corrupt": (_corrupt, "checkpoint_corrupt", lambda t: f"checkpoint:{t.group}/ckpt-10"),
    "wrong_group": (_wrong_group, "collective_mismatch", lambda t: f"rank:{t.group}/3"),
    "split_brain": (_split_brain, "split_brain", lambda t: f"group:{t.group}"),
    "input_stall": (_input_stall, "input_stall", lambda t: f"rank:{t.group}/2"),
    "restart_moved": (_restart_moved, "exception", lambda t: f"rank:{t.group}/2"),
}

# Scenarios across a restart. A spool replayed after an outage brings generation 1's cause
# after the restart, when the group's proposals for it (restart_group, the node's drain
# through the group) are moot: they may only be fewer (the node's own incident drains
# it). And it brings the launcher's transition after the other nodes' generation-2
# records, which ingest stores "ahead" without applying them to the live rank rows: the
# collective waits of those ranks are then not folded under the root cause as symptoms
# (a known gap: docs/diagnosis.md). The incidents' root causes must be equal.
ACROSS_A_RESTART = frozenset({"restart_moved"})


# -- delivery --------------------------------------------------------------------------------


@dataclass
class Post:
    at: float  # seconds from the job's start
    node: str
    records: list[Record]
    seq: int
    again_at: float | None = None  # a retry of the same batch (same seq) at this time

    def __repr__(self) -> str:
        kinds: dict[str, int] = defaultdict(int)
        for r in self.records:
            kinds[r["kind"]] += 1
        what = ",".join(f"{k}x{n}" for k, n in sorted(kinds.items()))
        again = f" (again at {self.again_at:.2f})" if self.again_at is not None else ""
        return f"{self.at:.2f}s {self.node} seq {self.seq} [{what}]{again}"


@dataclass
class Plan:
    name: str
    latency: Callable[[str, int], float] = lambda node, k: 0.05
    hold: Callable[[Post], float] = lambda p: 0.0
    retry: Callable[[Post], bool] = lambda p: False
    outage: tuple[int, float, float] | None = None  # node index, from, until (seconds)
    noise: bool = False


def _ts(t: Timeline, r: Record) -> float:
    return (datetime.fromisoformat(r["ts"].replace("Z", "+00:00")) - t.start).total_seconds()


def _urgent(r: Record) -> bool:
    return r["kind"] in URGENT or (r["kind"] == "process" and r.get("event") == "exited")


_SEQ = iter(range(10**9, 2 * 10**9))


def _posts(t: Timeline, plan: Plan, is_root: Callable[[Record], bool]) -> list[Post]:
    """The fault window's batches of each node, in its FIFO order, with arrival times."""
    out: list[Post] = []
    for n, (node, recs) in enumerate(sorted(t.records.items())):
        recs = sorted(recs, key=lambda r: _ts(t, r))
        batches: list[tuple[float, list[Record]]] = []
        pending: list[Record] = []
        end: float | None = None
        for r in recs:
            at = _ts(t, r)
            if end is not None and at >= end:
                batches.append((end, pending))
                pending, end = [], None
            if _urgent(r):
                if pending:
                    batches.append((at, pending))
                    pending, end = [], None
                batches.append((at, [r]))
                continue
            if end is None:
                end = at + SEND_S - (at % SEND_S)
            pending.append(r)
        if pending:
            batches.append((end or _ts(t, recs[-1]), pending))
        floor = 0.0
        for k, (at, batch) in enumerate(batches):
            post = Post(at, node, batch, next(_SEQ))
            at += plan.latency(node, k) + (plan.hold(post) if any(map(is_root, batch)) else 0.0)
            if plan.outage and plan.outage[0] == n and plan.outage[1] <= at < plan.outage[2]:
                at = plan.outage[2]
            post.at = floor = max(at, floor)
            if plan.retry(post):
                post.again_at = post.at + 2.0
            out.append(post)
    out.sort(key=lambda p: (p.at, p.node, p.seq))
    return out


def _noise(t: Timeline) -> None:
    """A healthy neighbour on node 0 (the faults are on node 1 or the whole group): an
    informational Xid (63), a corrected AER, rank 1's steps 10 % slower."""
    node = t.node(0)
    t.add(
        node,
        t.at(FAULT + 0.5),
        {"kind": "device_event", "gpu": t.gpu(2), "event": "xid", "code": 63},
    )
    t.add(
        node,
        t.at(FAULT + 0.7),
        {
            "kind": "host_event",
            "event": "aer_corrected",
            "device": "0000:3b:00",
            "severity": "corrected",
        },
    )
    for r in t.records[node]:
        if r["kind"] == "step" and r["rank"] == 1:
            extra = round(0.1 * r["duration_ms"], 3)
            r["duration_ms"] = round(r["duration_ms"] + extra, 3)
            r["phases"] = {**r["phases"], "compute": r["phases"]["compute"] + extra}


# -- the run -----------------------------------------------------------------------------------


@dataclass
class Run:
    t: Timeline
    posts: list[Post] = field(default_factory=list)


def _run(post: Any, name: str, plan: Plan, tag: str) -> Run:
    build, kind, subject = SCENARIOS[name]
    t = _job(post, tag)
    if plan.noise:
        _noise(t)
    history = {n: [r for r in rs if _ts(t, r) < HEALTHY_S] for n, rs in t.records.items()}
    fault_window = {n: [r for r in rs if _ts(t, r) >= HEALTHY_S] for n, rs in t.records.items()}
    t.records = defaultdict(list, history)
    t.send()
    pipeline.diagnose(group_name=t.group, now=t.at(HEALTHY_S))
    ConsistencyGroup.objects.filter(name=t.group).update(scheduler_job="4242")
    t.records = defaultdict(list, fault_window)
    build(t)
    root = subject(t)

    def is_root(r: Record) -> bool:
        return (
            (r.get("rank") is not None and root.endswith(f"/{r['rank']}"))
            or (r.get("gpu") is not None and root.endswith(str(r["gpu"])))
            or (r["kind"] == "checkpoint" and r.get("phase") == "corrupt")
        )

    posts = _posts(t, plan, is_root)
    t.records.clear()
    events: list[tuple[float, int, Post]] = []
    for p in posts:
        events.append((p.at, 0, p))
        if p.again_at is not None:
            events.append((p.again_at, 1, p))
    events.sort(key=lambda e: (e[0], e[1], e[2].node, e[2].seq))
    last = HEALTHY_S
    for at, again, p in events:
        batch = make_batch(
            [dict(r) for r in p.records], node=p.node, seq=p.seq, agent_id=f"agent-{p.node}-0001"
        )
        response = post(batch)
        assert response.status_code == 202, response.content
        assert response.json()["duplicate"] is bool(again)
        last = max(last, at)
        pipeline.diagnose(group_name=t.group, now=t.at(at))
    settled = last + VERDICT_SETTLES_AFTER.total_seconds() + 0.5
    pipeline.diagnose(group_name=t.group, now=t.at(settled))
    got = _verdict(t)
    assert any(k[:2] == (kind, _plain(t, root)) for k in got if k != "proposals"), (
        name,
        plan.name,
        sorted(got),
    )
    if name in ACROSS_A_RESTART:  # the GPU that stopped generation 1 is not generation 2's
        assert not [k for k in got if k != "proposals" and k[0] == "xid"], (plan.name, got)
    return Run(t, posts)


def _plain(t: Timeline, text: str) -> str:
    """A subject or target without the variant's names (its group, nodes and GPUs)."""
    assert isinstance(t, Variant)
    return text.replace(t.group, "JOB").replace(f"{t.tag}-node-", "node-")


def _verdict(t: Timeline) -> dict[Any, Any]:
    """The live incidents (their root cause in the newest diagnosis: not clearing), not
    minor, with their active symptoms; and every proposal ever made for the group, in any
    state (one made from a verdict later revised was made: someone may have approved it)."""
    out: dict[Any, Any] = {}
    for i in Incident.objects.filter(group__name=t.group, clear_since=None).exclude(
        state="resolved"
    ):
        if i.severity in ("minor", "info"):
            continue
        out[(i.kind, _plain(t, i.subject), i.role)] = sorted(
            (a.kind, _plain(t, a.subject), a.role)
            for a in i.alerts.filter(active=True).exclude(finding_id=i.root_cause.get("id"))
        )
    out["proposals"] = sorted(
        f"{a.kind} {_plain(t, a.target)} for {a.incident.kind if a.incident else None}"
        for a in Action.objects.filter(incident__group__name=t.group).select_related("incident")
    )
    return out


def _compare(post: Any, name: str, plans: list[Plan]) -> None:
    ref = _run(post, name, Plan("reference"), f"{name.replace('_', '-')}-ref")
    expected = _verdict(ref.t)
    for k, plan in enumerate(plans):
        run = _run(post, name, plan, f"{name.replace('_', '-')}-v{k}")
        got, want = _verdict(run.t), expected
        if name in ACROSS_A_RESTART and plan.outage is not None:
            made = got.pop("proposals")
            assert set(made) <= set(expected["proposals"]), (name, plan.name, made, expected)
            got, want = sorted(got), sorted(k for k in expected if k != "proposals")
        assert got == want, (
            f"scenario {name}, plan {plan.name}: the settled incidents differ.\nposts:\n  "
            + "\n  ".join(map(repr, run.posts))
            + f"\nexpected {want}\ngot      {got}"
        )


# -- plans ------------------------------------------------------------------------------------


def _interleaved(seed: int) -> Plan:
    rnd = random.Random(seed)
    lat: dict[tuple[str, int], float] = {}
    return Plan(
        f"interleaved(seed={seed})",
        latency=lambda node, k: lat.setdefault((node, k), rnd.uniform(0.0, 1.5)),
    )


def _plans(seed: int) -> list[Plan]:
    rnd = random.Random(seed)
    return [
        _interleaved(seed),
        Plan("root cause's batch held one send interval", hold=lambda p: SEND_S),
        Plan(f"a batch retried after a timeout (seed={seed})", retry=lambda p: rnd.random() < 0.3),
        Plan("node 1's spool replayed after a 12 s outage", outage=(1, HEALTHY_S, HEALTHY_S + 12)),
        Plan("node 0's spool replayed after a 12 s outage", outage=(0, HEALTHY_S, HEALTHY_S + 12)),
        Plan("a healthy neighbour's noise", noise=True),
    ]


@pytest.mark.parametrize("name", ["kill", "xid"])
def test_the_settled_incidents_do_not_depend_on_the_delivery_order(post_batch, name):
    _compare(post_batch, name, _plans(7)[:3])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_every_scenario_settles_alike_in_every_delivery_order(post_batch, name):
    _compare(post_batch, name, _plans(11))
