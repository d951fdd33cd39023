"""Metamorphic harness for the pure engine: the same evidence, delivered as the transport
may deliver it, or beside a healthy neighbour's noise, must settle on the same verdict.

Each scenario is one fault of the seed's matrix (faultline/drill/matrix.py), on 16 ranks
over two nodes (factory.py's layout), with the nodes' heartbeats; four cross a restart (a
GPU's Xid stops generation 1; generation 2 restarts onto it, naming it or only its node, or
rank 5 moves to a spare naming its new GPU or only its node, and a rank of generation 2
fails): the dead GPU heads generation 2's verdict only when rank 5 is back on it. A
*delivery plan* is how those records reach the service: each node's agent sends a batch
every send interval (at most 5 s, agents/wire.py), process exits and device/host events at
once, one node's batches in order (its spool is FIFO) but nodes interleaved; the plans vary
that: random latencies (nodes interleaved), the root cause's batch held back by up to a send
interval, a batch retried after a timeout (its first attempt lost), a node's spool replayed
after an outage. A *noise* variant adds what a healthy neighbour says: a straggler within
the tolerance, an informational Xid, a corrected AER. A *stamping* variant stamps a death up
to the ordering tolerance after its peers' errors (the launcher reaps the dead process after
its sockets closed).

Each plan is replayed through `LiveGroup` with a pass (and its memo) after every delivery,
as the service runs them; once the evidence settled (one send interval after the last
delivery) the verdict — every head that is not minor, the findings folded under it and
what the remediation policy proposes for it — must equal the verdict of a full rebuild of
the base evidence. A failure prints the scenario, the plan and its deliveries in order.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.wire import MAX_SEND_INTERVAL_S
from console.diagnosis import SYMPTOM, build_snapshot, diagnose
from console.diagnosis.config import DiagnosisConfig
from console.diagnosis.findings import INFO, MINOR
from console.diagnosis.live import LiveGroup
from console.policy import remediation as rp
from tests.diagnosis.factory import (
    GROUP,
    T0,
    checkpoint,
    collective,
    device_event,
    gpu_of,
    node_of,
    process,
    sample,
    step,
    training,
    transition,
)

RANKS = 16
NODES = ("node-01", "node-02")
FAULT_AT = T0 + timedelta(seconds=1)
WAIT_AT = FAULT_AT + timedelta(seconds=0.2)
END = T0 + timedelta(seconds=30)  # a running job steps (and nodes beat) until then
SEND_S = MAX_SEND_INTERVAL_S
TOLERANCE_S = DiagnosisConfig().ordering_tolerance_s
URGENT = frozenset({"device_event", "host_event"})
Record = dict[str, Any]


# -- scenarios ------------------------------------------------------------------------------


@dataclass
class Scenario:
    name: str
    records: list[Record]
    expect: tuple[str, str]  # (kind, subject) of the one root cause the scenario is about
    fault: Callable[[Record], bool]  # the root cause's own record(s)
    silent: frozenset[str] = frozenset()  # nodes that stop reporting at the fault
    state: str = "running"
    death: Callable[[Record], bool] | None = None  # a death its peers' errors precede
    generation: int = 1  # the group's generation when the evidence settled
    spares: tuple[str, ...] = ()  # nodes beside NODES that beat (a restart's spare)
    absent: tuple[str, str] | None = None  # (kind, subject) that must head nothing

    def __str__(self) -> str:
        return self.name


def _rank(r: int) -> str:
    return f"rank:{GROUP}/{r}"


def _base(
    *, steps_until: dict[int, datetime] | None = None, slow: dict[int, float] | None = None
) -> list[Record]:
    """Healthy training up to T0 (20 steps a rank, samples, a committed checkpoint)."""
    recs = training(ranks=RANKS, steps=20, end=T0)
    if slow:
        for r in recs:
            if r["kind"] == "step" and r["rank"] in slow:
                f = slow[r["rank"]]
                r["duration_ms"] *= f
                r["phases"] = {**r["phases"], "compute": r["phases"]["compute"] * f}
    return recs


def _waits(
    ranks: list[int], seq: int = 45, *, at: datetime = WAIT_AT, gen: int = 1, **odd: Any
) -> list[Record]:
    """Ranks in `ranks` entered all_reduce `seq` at `at` and wait there; their watchdog sends
    the window 2 s later (agents/torch.py). `odd`: rank -> fields of its call."""
    out = []
    for rk in ranks:
        done = [
            {
                "seq": seq - i,
                "pg": "default",
                "op": "all_reduce",
                "numel": 1 << 20,
                "dtype": "bfloat16",
                "state": "completed",
                "started_ts": at - timedelta(seconds=i),
            }
            for i in range(3, 0, -1)
        ]
        last = {**done[-1], "seq": seq, "state": "started", "started_ts": at}
        last.update(odd.get(str(rk), {}))
        out.append(collective(rk, at + timedelta(seconds=2), [*done, last], gen=gen))
    return out


def _exit(rank: int, at: datetime, **fields: Any) -> Record:
    return process(rank, at, "exited", **fields)


def _is(kind: str, **match: Any) -> Callable[[Record], bool]:
    return lambda r: r["kind"] == kind and all(r.get(k) == v for k, v in match.items())


def _kill(victim: int = 11) -> Scenario:
    """Rank 11's node lost (SIGKILL, reported by its launcher); the survivors' gloo errors
    are stamped just before and after it; the rest wait in the collective."""
    errors = [
        _exit(
            rk,
            FAULT_AT + timedelta(seconds=dt),
            exit_code=1,
            reason="exception",
            error_type="RuntimeError",
        )
        for rk, dt in ((3, -0.4), (12, 0.3), (1, 1.5))
    ]
    death = _exit(victim, FAULT_AT, exit_code=137, signal=9, reason="killed")
    waiting = [rk for rk in range(RANKS) if rk not in (victim, 3, 12, 1)]
    return Scenario(
        "kill",
        [*_base(), death, *errors, *_waits(waiting)],
        ("process_exit", _rank(victim)),
        _is("process", rank=victim, event="exited"),
        death=_is("process", rank=victim, event="exited"),
    )


def _running(nan: Collection[tuple[int, int]] = frozenset()) -> list[Record]:
    """Every rank steps on, once a second from FAULT_AT until END (steps 120, 121, ...);
    (rank, step) in `nan` reports a NaN loss."""
    out = []
    t, n = FAULT_AT, 120
    while t <= END:
        for rk in range(RANKS):
            out.append(step(rk, n, t, **({"loss": float("nan")} if (rk, n) in nan else {})))
        t, n = t + timedelta(seconds=1), n + 1
    return out


def _wrong_group(culprit: int = 3) -> list[Record]:
    """TP 2 over 16 ranks (pg "1" .. "8", as torch names them, `process_groups` as
    agents.torch sends them): rank 3 enters its TP group's all_reduce where every other rank
    enters the world's (the flight-recorder case)."""
    out = []
    for rk in range(RANKS):
        tp = str(rk // 2 + 1)
        members = [rk - rk % 2, rk - rk % 2 + 1]
        out.append(
            {
                "kind": "process_groups",
                "ts": T0 - timedelta(seconds=20),
                "group": GROUP,
                "generation": 1,
                "rank": rk,
                "groups": [
                    {"pg": "default", "size": RANKS},
                    {"pg": tp, "size": 2, "ranks": members, "desc": "tp"},
                ],
            }
        )
        entries = []
        for k in range(1, 6):
            for pg in (tp, "default"):
                entries.append(
                    {
                        "seq": k,
                        "pg": pg,
                        "op": "all_reduce",
                        "numel": 4096,
                        "dtype": "bfloat16",
                        "state": "completed",
                        "started_ts": WAIT_AT - timedelta(seconds=6 - k),
                    }
                )
        pg = tp if rk == culprit else "default"
        entries.append(
            {
                "seq": 6,
                "pg": pg,
                "op": "all_reduce",
                "numel": 4096,
                "dtype": "bfloat16",
                "state": "started",
                "started_ts": WAIT_AT,
            }
        )
        out.append(collective(rk, WAIT_AT + timedelta(seconds=2), entries))
    return out


def _probed() -> list[Record]:
    """Every rank answers the fixed-batch probe each 2 s; rank 5's answer drifts from the
    fault on (its weights silently perturbed)."""
    out = _running()
    t, n = FAULT_AT, 120
    while t <= END:
        for rk in range(RANKS):
            value = 2.5 + (0.2 if rk == 5 else 0.0)
            out.append(
                {
                    "kind": "probe",
                    "ts": t + timedelta(seconds=0.1),
                    "group": GROUP,
                    "generation": 1,
                    "probe": "fixed_batch_loss",
                    "rank": rk,
                    "step": n,
                    "value": value,
                }
            )
        t, n = t + timedelta(seconds=2), n + 2
    return out


def _input_stalled() -> list[Record]:
    """Rank 5 waits on its data loader from the fault on (800 ms input phases)."""
    out = _base()
    t, n = FAULT_AT, 120
    while t <= END:
        for rk in range(RANKS):
            data = 800.0 if rk == 5 else 50.0
            ph = {
                "compute": 600.0,
                "collective": 250.0,
                "input": data,
                "checkpoint": 0.0,
                "optimizer": 100.0,
            }
            out.append(step(rk, n, t, duration_ms=sum(ph.values()), phases=ph))
        t, n = t + timedelta(seconds=1.8), n + 1
    return out


def _serving(*, lost: bool) -> list[Record]:
    """Three workers (w0, w1 on node-01, w2 on node-02) report a 1 s window each second.
    `lost`: w2 stops reporting at the fault with requests in flight; else w0 and w1 move to
    KV schema kv4 at the fault and w2 stays on kv3."""
    out = []
    t = T0 - timedelta(seconds=20)
    while t <= END:
        for w, node in (("w0", NODES[0]), ("w1", NODES[0]), ("w2", NODES[1])):
            if lost and w == "w2" and t >= FAULT_AT:
                continue
            kv = "kv4" if not lost and w != "w2" and t >= FAULT_AT else "kv3"
            out.append(
                {
                    "kind": "serving",
                    "ts": t,
                    "group": GROUP,
                    "worker": w,
                    "node": node,
                    "model_version": "m2",
                    "adapter_version": None,
                    "kv_schema": kv,
                    "ready": True,
                    "draining": False,
                    "window": {"seconds": 1.0, "requests": 5, "slo_met": 5, "active": 3},
                }
            )
        t += timedelta(seconds=1)
    return out


def _throttled() -> list[Record]:
    """Rank 5's GPU throttles from T0: its compute takes 2.4 s of a 2.8 s step, the other
    ranks wait for it in the collective phase; throttled samples every 2 s."""
    out = _base()
    t, n = T0 + timedelta(seconds=1), 120
    while t <= END:
        for rk in range(RANKS):
            busy = 2400.0 if rk == 5 else 600.0
            ph = {
                "compute": busy,
                "collective": 2650.0 - busy,
                "input": 50.0,
                "checkpoint": 0.0,
                "optimizer": 100.0,
            }
            out.append(step(rk, n, t, duration_ms=2800.0, phases=ph))
        t, n = t + timedelta(seconds=2.8), n + 1
    for k in range(8):
        out.append(
            sample(
                5,
                T0 + timedelta(seconds=2 * k),
                temp_c=92.0,
                sm_clock_mhz=1100.0,
                throttle_reasons=["hw_thermal_slowdown"],
            )
        )
    return out


RESTART_AT = FAULT_AT + timedelta(seconds=3)
FAULT2_AT = RESTART_AT + timedelta(seconds=4)
SPARE = "node-03"


def _restarted(moved: dict[str, Any] | None) -> list[Record]:
    """Generation 1 stops on an Xid 79 on rank 5's GPU (its peers wait in all_reduce);
    generation 2 starts at RESTART_AT on the same GPUs, except that with `moved` rank 5
    starts elsewhere (`moved`: the fields its generation-2 records carry, a node and maybe a
    GPU); every rank of generation 2 steps each second."""
    out = [
        *_base(),
        device_event(5, FAULT_AT, "xid", 79),
        *_waits([rk for rk in range(RANKS) if rk != 5]),
        transition(FAULT_AT + timedelta(seconds=2), "running", "recovering"),
        transition(RESTART_AT, "recovering", "running", gen=2, restart_count=1),
    ]
    for rk in range(RANKS):
        placed = moved if moved is not None and rk == 5 else {}
        start = RESTART_AT + timedelta(seconds=0.5)
        out.append({**process(rk, start, "started", gen=2), **placed})
        t, n = RESTART_AT + timedelta(seconds=1), 100
        while t < FAULT2_AT:
            out.append({**step(rk, n, t, gen=2), **({"node": placed["node"]} if placed else {})})
            t, n = t + timedelta(seconds=1), n + 1
    return out


def _restart_scenarios() -> list[Scenario]:
    """Evidence across a restart, in any order: the GPU that stopped generation 1 is
    generation 2's root cause only while a rank of generation 2 still runs on it."""
    waiting = _waits([rk for rk in range(RANKS) if rk != 5], at=FAULT2_AT, gen=2)
    out = [
        Scenario(
            name,
            [*_restarted(placed), *waiting],
            ("xid", f"gpu:{gpu_of(5)}"),
            _is("device_event", gpu=gpu_of(5)),
            generation=2,
        )
        # Back in place: its start names the GPU, or (lost, or stored ahead of the
        # transition) only its records' node, the same as before.
        for name, placed in (
            ("restart_onto_the_dead_gpu", None),
            ("restart_in_place_naming_only_its_node", {"node": node_of(5), "gpu": None}),
        )
    ]
    for name, moved in (
        ("restart_moved_off_the_dead_gpu", {"node": SPARE, "gpu": "GPU-0003-0"}),
        ("restart_moved_naming_only_its_node", {"node": SPARE, "gpu": None}),
    ):
        others = [rk for rk in range(RANKS) if rk != 9]
        recs = [
            *_restarted(moved),
            {**_exit(9, FAULT2_AT, exit_code=1, reason="exception", error_type="ValueError"),
             "generation": 2},
            *[{**w, "node": SPARE} if w["rank"] == 5 else w
              for w in _waits(others, at=FAULT2_AT + timedelta(seconds=0.2), gen=2)],
        ]  # fmt: skip
        out.append(
            Scenario(
                name,
                recs,
                ("exception", _rank(9)),
                lambda r: r["kind"] == "process" and r["rank"] == 9 and r["generation"] == 2,
                generation=2,
                spares=(SPARE,),
                absent=("xid", f"gpu:{gpu_of(5)}"),
            )
        )
    return out


def _scenarios() -> list[Scenario]:
    others = [rk for rk in range(RANKS) if rk != 5]
    hung_steps = [
        step(rk, 120 + i, T0 + timedelta(seconds=1 + i)) for rk in others for i in range(3)
    ]
    out = [
        _kill(),
        Scenario(
            "clean_exit",
            [*_base(), _exit(5, FAULT_AT, exit_code=0, reason="clean"), *_waits(others)],
            ("process_exit", _rank(5)),
            _is("process", rank=5, event="exited"),
        ),
        Scenario(
            "oom",
            [
                *_base(),
                _exit(5, FAULT_AT, exit_code=1, reason="oom", error_type="torch.OutOfMemoryError"),
                *_waits(others),
            ],
            ("oom", _rank(5)),
            _is("process", rank=5, event="exited"),
        ),
        Scenario(
            "exception",
            [
                *_base(),
                _exit(5, FAULT_AT, exit_code=1, reason="exception", error_type="ValueError"),
                *_waits(others),
            ],
            ("exception", _rank(5)),
            _is("process", rank=5, event="exited"),
        ),
        Scenario(
            "hang",
            [*_base(), *hung_steps, *_waits(others, seq=48, at=T0 + timedelta(seconds=3.5))],
            ("rank_hang", _rank(5)),
            _is("step", rank=5),  # its absence is the fault: the last steps it made
        ),
        *(
            Scenario(
                f"device_{event}",
                [*_base(), device_event(5, FAULT_AT, event, code), *_waits(others)],
                (event, f"gpu:{gpu_of(5)}"),
                _is("device_event", gpu=gpu_of(5)),
            )
            for event, code in (("xid", 79), ("gpu_lost", None), ("ecc_dbe", None))
        ),
        Scenario(
            "nan_loss",
            [*_base(), *_running(nan={(5, 120)})],
            ("nan_loss", f"group:{GROUP}"),
            _is("step", rank=5, step=120),
        ),
        Scenario(
            "collective_mismatch",
            [*_base(), *_waits(list(range(RANKS)), **{"5": {"dtype": "float32"}})],
            ("collective_mismatch", _rank(5)),
            _is("collective", rank=5),
        ),
        Scenario(
            "collective_order",
            [*_base(), *_wrong_group()],
            ("collective_mismatch", _rank(3)),
            _is("collective", rank=3),
        ),
        Scenario(
            "probe_divergence",
            _probed(),
            ("probe_divergence", _rank(5)),
            _is("probe", rank=5),
        ),
        Scenario(
            "input_stall",
            _input_stalled(),
            ("input_stall", _rank(5)),
            _is("step", rank=5),
        ),
        Scenario(
            "serving_worker_lost",
            _serving(lost=True),
            ("worker_lost", f"worker:{GROUP}/w2"),
            lambda r: False,  # its silence is the fault
        ),
        Scenario(
            "serving_stale_version",
            _serving(lost=False),
            ("stale_version", f"worker:{GROUP}/w2"),
            _is("serving", worker="w2"),
        ),
        Scenario(
            "checkpoint_corrupt",
            [*_base(), checkpoint(FAULT_AT, "ckpt-100", 100, "corrupt"), *_running()],
            ("checkpoint_corrupt", f"checkpoint:{GROUP}/ckpt-100"),
            _is("checkpoint", phase="corrupt"),
        ),
        Scenario(
            "nvlink_errors",
            [*_base(), sample(5, FAULT_AT, nvlink_errors=500), *_waits(list(range(RANKS)))],
            ("nvlink_errors", f"gpu:{gpu_of(5)}"),
            _is("device_sample", gpu=gpu_of(5)),
        ),
        Scenario(
            "thermal_throttle",
            _throttled(),
            ("thermal_throttle", f"gpu:{gpu_of(5)}"),
            _is("device_sample", gpu=gpu_of(5)),
        ),
        Scenario(
            "node_down",
            [*_base()]
            + [
                step(rk, 120 + i, T0 + timedelta(seconds=1 + i))
                for rk in range(8)
                for i in range(60)
            ],
            ("node_down", "node:node-02"),
            lambda r: False,  # its silence is the fault
            silent=frozenset({"node-02"}),
        ),
        *_restart_scenarios(),
    ]
    return out


SCENARIOS = _scenarios()


# -- delivery ---------------------------------------------------------------------------------


def _node(r: Record) -> str:
    if r.get("node"):
        return str(r["node"])
    if r.get("rank") is not None:
        return node_of(int(r["rank"]))
    return NODES[0]  # the launcher's records (transitions, checkpoints) come from node-01


def _urgent(r: Record) -> bool:
    return r["kind"] in URGENT or (r["kind"] == "process" and r.get("event") == "exited")


def _heartbeats(sc: Scenario, until: datetime) -> list[Record]:
    out = []
    for node in (*NODES, *sc.spares):
        stop = FAULT_AT - timedelta(seconds=0.5) if node in sc.silent else until
        t = T0 - timedelta(seconds=30)
        while t <= stop:
            out.append({"kind": "heartbeat", "ts": t, "node": node})
            t += timedelta(seconds=1)
    return out


@dataclass
class Delivery:
    at: datetime
    node: str
    records: list[Record]

    def __repr__(self) -> str:
        kinds: dict[str, int] = defaultdict(int)
        for r in self.records:
            kinds[r["kind"]] += 1
        what = ",".join(f"{k}x{n}" for k, n in sorted(kinds.items()))
        return f"+{(self.at - T0).total_seconds():.2f}s {self.node} [{what}]"


@dataclass
class Plan:
    """How the records reach the service; `describe` names it in a failure."""

    describe: str
    latency: Callable[[str, int], float] = lambda node, k: 0.05
    hold: Callable[[Delivery], float] = lambda d: 0.0  # extra delay of one batch
    outage: tuple[str, datetime, datetime] | None = None  # node, from, until (spool)


def _batches(records: list[Record], plan: Plan) -> list[Delivery]:
    """Each node's batches: one per send interval, events and exits at once; a node's
    batches leave in order (a held batch holds the ones after it: the spool is FIFO)."""
    by_node: dict[str, list[Record]] = defaultdict(list)
    for r in sorted(records, key=lambda r: r["ts"]):
        by_node[_node(r)].append(r)
    out: list[Delivery] = []
    for node, recs in sorted(by_node.items()):
        batches: list[Delivery] = []
        pending: list[Record] = []
        window_end: datetime | None = None
        for r in recs:
            if window_end is not None and r["ts"] >= window_end:
                batches.append(Delivery(window_end, node, pending))
                pending, window_end = [], None
            if _urgent(r):
                if pending:  # the event flushes what was waiting, in order
                    batches.append(Delivery(r["ts"], node, pending))
                    pending, window_end = [], None
                batches.append(Delivery(r["ts"], node, [r]))
                continue
            if window_end is None:
                offset = (r["ts"] - T0).total_seconds() % SEND_S
                window_end = r["ts"] + timedelta(seconds=SEND_S - offset)
            pending.append(r)
        if pending:
            batches.append(Delivery(window_end or recs[-1]["ts"], node, pending))
        floor = None
        for k, b in enumerate(batches):
            at = b.at + timedelta(seconds=plan.latency(node, k) + plan.hold(b))
            if plan.outage and plan.outage[0] == node and plan.outage[1] <= at < plan.outage[2]:
                at = plan.outage[2]  # held in the spool until the service is back
            if floor is not None and at < floor:
                at = floor
            floor = at
            out.append(Delivery(at, node, b.records))
    out.sort(key=lambda d: (d.at, d.node))
    return out


# -- the verdict -------------------------------------------------------------------------------


def _verdict(d: Any) -> dict[tuple[str, str, str], tuple[list[tuple[str, str]], list[str]]]:
    """Every head that is not minor (as console.actions.diagnosis folds them), the findings
    under it, and what the remediation policy proposes for it."""
    by_id = {f.id: f for f in d.findings}

    def head(f: Any, seen: frozenset[str] = frozenset()) -> Any:
        for c in f.caused_by:
            if c in by_id and c not in seen:
                return head(by_id[c], seen | {f.id})
        return f

    out = {}
    for h in d.findings:
        if head(h) is not h or h.severity in (MINOR, INFO):
            continue
        folded = sorted((f.kind, f.subject) for f in d.findings if f is not h and head(f) is h)
        ev = h.evidence
        cause = rp.Cause(
            kind=h.kind,
            subject=h.subject,
            finding=h.fingerprint,
            evidence=ev,
            recovery=h.recovery.to_dict() if h.recovery else None,
            node=ev.get("node"),
            gpu=ev.get("gpu"),
            group=GROUP,
            job="4242",
        )
        proposals = sorted(
            f"{p.kind} {p.target}" for p in rp.plan(cause, rp.RemediationPolicy()).proposals
        )
        out[(h.kind, h.subject, h.role)] = (folded, proposals)
    return out


def _snapshot_inputs(delivered: list[Record]) -> tuple[dict[str, datetime | None], list[Record]]:
    seen: dict[str, datetime | None] = {}
    for r in delivered:
        node = _node(r)
        last = seen.get(node)
        if last is None or r["ts"] > last:
            seen[node] = r["ts"]
    return seen, [r for r in delivered if r["kind"] != "heartbeat"]


def _reference(records: list[Record], sc: Scenario, now: datetime) -> Any:
    nodes, recs = _snapshot_inputs(records)
    snap = build_snapshot(
        group=GROUP,
        generation=sc.generation,
        state=sc.state,
        records=recs,
        nodes=nodes,
        contract_findings=[],
        now=now,
    )
    return diagnose(snap, now)


def _replay(sc: Scenario, deliveries: list[Delivery], now: datetime) -> Any:
    """A pass after every delivery, as the service runs them; the last at `now`."""
    live = LiveGroup(group=GROUP, generation=sc.generation)
    delivered: list[Record] = []
    result = None
    times = sorted({d.at for d in deliveries})
    by_time: dict[datetime, list[Delivery]] = defaultdict(list)
    for d in deliveries:
        by_time[d.at].append(d)
    for at in [*times, now]:
        for d in by_time.get(at, ()):
            delivered.extend(d.records)
            live.apply(d.records)
        if at < T0:
            continue  # the healthy history: one pass at the end of it is enough
        nodes, recs = _snapshot_inputs(delivered)
        snap = live.snapshot(
            state=sc.state, records=recs, nodes=nodes, contract_findings=[], now=at
        )
        result = diagnose(snap, at, memo=live.memo)
    return result


def _check(
    sc: Scenario,
    plan: Plan,
    noise: list[Record] | None = None,
    stamp: float = 0.0,
    lose: Callable[[Delivery], bool] | None = None,
) -> None:
    base = [*sc.records, *_heartbeats(sc, END)]
    records = [*base, *(noise or [])]
    if stamp:
        assert sc.death is not None
        records = [
            {**r, "ts": r["ts"] + timedelta(seconds=stamp)} if sc.death(r) else r for r in records
        ]
    deliveries = _batches(records, plan)
    now = max(d.at for d in deliveries) + timedelta(seconds=0.5)
    expected = _verdict(_reference(base, sc, now))
    assert any(k[:2] == sc.expect and k[2] != SYMPTOM for k in expected), (
        f"{sc.name}: the base evidence does not name {sc.expect}: {sorted(expected)}"
    )
    assert not any(k[:2] == sc.absent for k in expected), (
        f"{sc.name}: the base evidence heads {sc.absent}: {sorted(expected)}"
    )
    kept = [d for d in deliveries if lose is None or not lose(d)]
    got = _verdict(_replay(sc, kept, now))
    assert got == expected, (
        f"scenario {sc.name}, plan {plan.describe}, noise {bool(noise)}, stamp +{stamp}s: "
        f"the settled verdict differs.\ndeliveries after T0:\n  "
        + "\n  ".join(repr(d) for d in deliveries if d.at >= T0)
        + f"\nexpected {expected}\ngot      {got}"
    )


# -- plans ----------------------------------------------------------------------------------------


def _interleaved(seed: int) -> Plan:
    rnd = random.Random(seed)
    lat: dict[tuple[str, int], float] = {}

    def latency(node: str, k: int) -> float:
        return lat.setdefault((node, k), rnd.uniform(0.0, 1.5))

    return Plan(f"interleaved(seed={seed})", latency=latency)


def _root_held(sc: Scenario, by: float) -> Plan:
    return Plan(
        f"root cause's batch held {by:.1f}s",
        hold=lambda d: by if any(sc.fault(r) for r in d.records) else 0.0,
    )


def _retried(seed: int) -> Plan:
    """One batch after T0 times out (its first attempt lost): sent again 2 s later."""
    rnd = random.Random(seed)
    chosen: dict[str, int] = {}

    def hold(d: Delivery) -> float:
        if d.records[0]["ts"] < T0:
            return 0.0
        key = d.node
        if key not in chosen:
            chosen[key] = rnd.randrange(4)
        chosen[key] -= 1
        return 2.0 if chosen[key] == -1 else 0.0

    return Plan(f"retried(seed={seed})", hold=hold)


def _spool(node: str, start_s: float, length_s: float) -> Plan:
    start = T0 + timedelta(seconds=start_s)
    return Plan(
        f"outage of {node} +{start_s}s for {length_s}s, spool replayed",
        outage=(node, start, start + timedelta(seconds=length_s)),
    )


def _plans(sc: Scenario) -> list[Plan]:
    fault_node = next((_node(r) for r in sc.records if sc.fault(r)), NODES[0])
    other = NODES[1] if fault_node == NODES[0] else NODES[0]
    return [
        Plan("reference"),
        _interleaved(1),
        _interleaved(2),
        _root_held(sc, 1.0),
        _root_held(sc, SEND_S),
        _retried(3),
        _spool(fault_node, 0.5, 12.0),
        _spool(other, 0.5, 12.0),
    ]


def _noise(sc: Scenario) -> list[Record]:
    """A healthy neighbour on the node the fault is not on: a straggler within tolerance
    (its steps 10 % slower), an informational Xid (63, a row remapped), a corrected AER."""
    fault_node = next((_node(r) for r in sc.records if sc.fault(r)), NODES[0])
    node = NODES[1] if fault_node == NODES[0] else NODES[0]
    rank = 8 if node == NODES[1] else 0
    if node in sc.silent:
        return []
    out: list[Record] = [
        {
            "kind": "device_event",
            "ts": FAULT_AT + timedelta(seconds=0.5),
            "node": node,
            "gpu": gpu_of(rank + 2),
            "event": "xid",
            "code": 63,
            "detail": "row remap",
        },
        {
            "kind": "host_event",
            "ts": FAULT_AT + timedelta(seconds=0.7),
            "node": node,
            "event": "aer_corrected",
            "device": "0000:3b:00.0",
            "severity": "corrected",
        },
    ]
    for r in sc.records:
        if r["kind"] == "step" and r["rank"] == rank + 1 and r["ts"] < T0 - timedelta(seconds=2):
            out.append(
                {
                    **r,
                    "ts": r["ts"] + timedelta(milliseconds=1),
                    "duration_ms": r["duration_ms"] * 1.1,
                }
            )
    return out


# -- the tests ---------------------------------------------------------------------------------


@pytest.mark.parametrize("sc", SCENARIOS, ids=str)
def test_every_delivery_order_settles_on_the_same_verdict(sc: Scenario) -> None:
    for plan in _plans(sc):
        _check(sc, plan)


@pytest.mark.parametrize("sc", SCENARIOS, ids=str)
def test_a_healthy_neighbours_noise_changes_no_verdict(sc: Scenario) -> None:
    noise = _noise(sc)
    for plan in (Plan("reference"), _interleaved(4)):
        _check(sc, plan, noise=noise)


@pytest.mark.parametrize("stamp", [0.5, 1.4, TOLERANCE_S - 0.5])  # the first error is 0.4 s before
def test_a_death_stamped_after_its_peers_errors_settles_on_the_death(stamp: float) -> None:
    sc = _kill()
    for plan in (Plan("reference"), _root_held(sc, SEND_S), _interleaved(5)):
        _check(sc, plan, stamp=stamp)


@settings(max_examples=40, deadline=None)
@given(
    sc=st.sampled_from(SCENARIOS),
    seed=st.integers(0, 2**16),
    held=st.floats(0.0, SEND_S),
    outage=st.one_of(
        st.none(), st.tuples(st.sampled_from(NODES), st.floats(0.0, 6.0), st.floats(0.5, 15.0))
    ),
    noise=st.booleans(),
)
def test_any_mix_of_transport_orders_settles_on_the_same_verdict(
    sc: Scenario, seed: int, held: float, outage: tuple[str, float, float] | None, noise: bool
) -> None:
    inter = _interleaved(seed)
    root = _root_held(sc, held)
    plan = Plan(
        f"{inter.describe} + {root.describe}"
        + (f" + {_spool(*outage).describe}" if outage else ""),
        latency=inter.latency,
        hold=root.hold,
        outage=_spool(*outage).outage if outage else None,
    )
    _check(sc, plan, noise=_noise(sc) if noise else None)


def test_the_harness_catches_a_replay_that_settles_elsewhere() -> None:
    """The check can fail: a transport that loses the root cause's batch (which ingest
    never does: it acknowledges only what it stored) settles on another verdict."""
    sc = _kill()
    lost = lambda d: any(sc.fault(r) for r in d.records)  # noqa: E731
    with pytest.raises(AssertionError, match="settled verdict differs"):
        _check(sc, _root_held(sc, 1.0), lose=lost)
