"""A small timeline builder: a training or serving group reporting through real ingest.

Scenarios describe a fleet minute by minute (healthy steps, then a fault), post every
node's records as its own agent through POST /api/v1/ingest, run the real pipeline
(snapshot from Postgres → engine → incidents) at a chosen moment, and return incidents.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from console import pipeline
from console.models import Incident
from tests.conftest import iso, make_batch

PER_NODE = 4


@dataclass
class Timeline:
    """Records per node, posted in time order; ranks map to node-<i> GPU <rank % 4>."""

    post: Callable[..., Any]
    group: str = "job"
    ranks: int = 8
    start: datetime = field(default_factory=lambda: datetime.now(UTC) - timedelta(minutes=2))
    step_s: float = 1.0
    generation: int = 1
    records: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))

    # -- where things run ----------------------------------------------------------------
    def node(self, rank: int) -> str:
        return f"node-{rank // PER_NODE}"

    def gpu(self, rank: int) -> str:
        return f"GPU-{self.group}-{rank}"

    def at(self, seconds: float) -> datetime:
        return self.start + timedelta(seconds=seconds)

    def add(self, node: str, ts: datetime, record: dict[str, Any]) -> None:
        self.records[node].append({**record, "ts": iso(ts)})

    # -- building blocks -----------------------------------------------------------------
    def boot(self, *, at: float = 0.0, to_state: str = "running", **fields: Any) -> None:
        self.add(
            self.node(0),
            self.at(at),
            {"kind": "transition", "group": self.group, "generation": self.generation,
             "to_state": to_state, "world_size": self.ranks, **fields},
        )  # fmt: skip
        for rank in range(self.ranks):
            self.add(
                self.node(rank),
                self.at(at),
                {"kind": "process", "group": self.group, "generation": self.generation,
                 "rank": rank, "event": "started", "pid": 100 + rank, "gpu": self.gpu(rank)},
            )  # fmt: skip
            self.sample(rank, at=at)

    def sample(self, rank: int, *, at: float, **fields: Any) -> None:
        self.add(
            self.node(rank),
            self.at(at),
            {"kind": "device_sample", "gpu": self.gpu(rank), "index": rank % PER_NODE,
             "temp_c": 60.0, "power_w": 400.0, "sm_clock_mhz": 1980.0, "util_pct": 97.0,
             **fields},
        )  # fmt: skip

    def heartbeats(self, *, until: float, skip_nodes: set[str] = frozenset()) -> None:
        for i in range(0, int(until) + 1, 5):
            for n in {self.node(r) for r in range(self.ranks)} - set(skip_nodes):
                self.add(n, self.at(i), {"kind": "heartbeat", "uptime_s": float(i)})

    def steps(
        self,
        *,
        first: int,
        count: int,
        at: float,
        ranks: range | list[int] | None = None,
        phases: Callable[[int, int], dict[str, float]] | None = None,
        loss: Callable[[int, int], Any] | None = None,
        cursor: bool = True,
    ) -> None:
        """`count` steps from step `first`, starting at second `at`, one per step_s."""
        for k in range(count):
            s = first + k
            for rank in ranks if ranks is not None else range(self.ranks):
                ph = (phases or _default_phases)(rank, s)
                rec = {
                    "kind": "step", "group": self.group, "generation": self.generation,
                    "rank": rank, "step": s, "tokens": 4096,
                    "duration_ms": round(sum(ph.values()), 3), "phases": ph,
                    "loss": loss(rank, s) if loss else 2.0 - s * 0.001,
                }  # fmt: skip
                if cursor:
                    rec["data_cursor"] = s * 4096
                self.add(self.node(rank), self.at(at + k * self.step_s), rec)

    def collectives(
        self, *, seq: int, at: float, entered: list[int], op: str = "all_reduce", **odd: Any
    ) -> None:
        """Ranks in `entered` started collective `seq` at second `at` and wait there."""
        for rank in entered:
            entry = {"seq": seq, "pg": "0", "op": op, "numel": 1 << 20, "dtype": "bfloat16",
                     "state": "started", "started_ts": iso(self.at(at))}  # fmt: skip
            entry.update(odd.get(str(rank), {}))
            done = [
                {"seq": seq - i, "pg": "0", "op": op, "numel": 1 << 20, "dtype": "bfloat16",
                 "state": "completed", "started_ts": iso(self.at(at - i))}
                for i in range(3, 0, -1)
            ]  # fmt: skip
            self.add(
                self.node(rank),
                self.at(at),
                {"kind": "collective", "group": self.group, "generation": self.generation,
                 "rank": rank, "entries": [*done, entry]},
            )  # fmt: skip

    def checkpoint(self, ckpt: str, *, at: float, step: int, phase: str, **extra: Any) -> None:
        self.add(
            self.node(0),
            self.at(at),
            {"kind": "checkpoint", "group": self.group, "generation": self.generation,
             "checkpoint_id": ckpt, "step": step, "phase": phase, **extra},
        )  # fmt: skip

    def good_checkpoint(self, ckpt: str, *, at: float, step: int) -> None:
        manifest = {
            "shards": [
                {"path": f"{ckpt}/shard{i}.distcp", "bytes": 1000, "sha256": f"{i:064x}"}
                for i in range(2)
            ],
            "total_bytes": 2000,
            "format": "torch_dcp",
        }
        for offset, phase in enumerate(("staging", "written", "committed")):
            self.checkpoint(ckpt, at=at + offset * 0.1, step=step, phase=phase,
                            manifest=manifest)  # fmt: skip

    # -- running ------------------------------------------------------------------------
    def send(self) -> None:
        """Post each node's records as that node's agent, in time order, 200 per batch."""
        for node, recs in sorted(self.records.items()):
            recs.sort(key=lambda r: r["ts"])
            for i in range(0, len(recs), 200):
                # Sent now, like an agent shipping what it spooled: no clock skew.
                response = self.post(make_batch(recs[i : i + 200], node=node))
                assert response.status_code == 202, response.content
        self.records.clear()

    def diagnose(self, at: float) -> list[Incident]:
        self.send()
        pipeline.diagnose(group_name=self.group, now=self.at(at))
        return list(
            Incident.objects.filter(group__name=self.group)
            .exclude(state="resolved")
            .prefetch_related("alerts")
            .order_by("opened_at")
        )


def _default_phases(rank: int, step: int) -> dict[str, float]:
    jitter = ((rank * 7 + step * 13) % 11) * 2.0  # deterministic few-ms jitter
    return {"compute": 650.0 + jitter, "collective": 250.0, "input": 40.0, "optimizer": 60.0}


def only(incidents: list[Incident]) -> Incident:
    assert len(incidents) == 1, [f"{i.kind} {i.subject}: {i.summary}" for i in incidents]
    return incidents[0]


def symptoms(incident: Incident) -> list[str]:
    return sorted(a.kind for a in incident.alerts.all() if a.role == "symptom")


HEALTHY_S = 30


def healthy_job(post: object) -> Timeline:
    """The scenarios' common start: a booted job, a good checkpoint at step 10 and
    HEALTHY_S seconds of steps and heartbeats."""
    t = Timeline(post=post)
    t.boot(at=0)
    t.good_checkpoint("ckpt-10", at=10.5, step=10)
    t.steps(first=0, count=HEALTHY_S, at=1)
    t.heartbeats(until=HEALTHY_S + 60)
    return t
