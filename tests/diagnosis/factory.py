"""Contract-shaped record builders for diagnosis tests (DESIGN §3 field names).

Builds plain record dicts the way the database adapter will hand them to
`build_snapshot`: `kind`, aware `ts`, then the contract's fields.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

from console.diagnosis import GroupSnapshot, build_snapshot

T0 = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
GROUP = "llama-70b"


def node_of(rank: int, gpus_per_node: int = 8) -> str:
    return f"node-{rank // gpus_per_node + 1:02d}"


def gpu_of(rank: int, gpus_per_node: int = 8) -> str:
    return f"GPU-{rank // gpus_per_node + 1:04d}-{rank % gpus_per_node}"


def step(
    rank: int,
    n: int,
    ts: datetime,
    *,
    duration_ms: float = 1000.0,
    gen: int = 1,
    phases: dict[str, float] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    ph = phases or {
        "compute": duration_ms * 0.6,
        "collective": duration_ms * 0.25,
        "input": duration_ms * 0.05,
        "checkpoint": 0.0,
        "optimizer": duration_ms * 0.10,
    }
    rec = {
        "kind": "step",
        "ts": ts,
        "group": GROUP,
        "generation": gen,
        "rank": rank,
        "step": n,
        "tokens": 4096,
        "data_cursor": n * 4096,
        "duration_ms": duration_ms,
        "phases": ph,
        "loss": 2.0 - n * 0.001,
        "grad_norm": 1.0,
        "loss_scale": 65536.0,
        "overflow": False,
    }
    rec.update(fields)
    return rec


def sample(rank: int, ts: datetime, *, gpus_per_node: int = 8, **fields: Any) -> dict[str, Any]:
    rec = {
        "kind": "device_sample",
        "ts": ts,
        "node": node_of(rank, gpus_per_node),
        "gpu": gpu_of(rank, gpus_per_node),
        "index": rank % gpus_per_node,
        "temp_c": 60.0,
        "power_w": 500.0,
        "sm_clock_mhz": 1980.0,
        "mem_clock_mhz": 2619.0,
        "util_pct": 97.0,
        "mem_used_bytes": 70 * 2**30,
        "ecc_sbe": 0,
        "ecc_dbe": 0,
        "retired_or_remapped_pending": False,
        "throttle_reasons": [],
        "nvlink_errors": 0,
        "pcie_replays": 0,
    }
    rec.update(fields)
    return rec


def device_event(
    rank: int, ts: datetime, event: str, code: int | None = None, gpus_per_node: int = 8
) -> dict[str, Any]:
    return {
        "kind": "device_event",
        "ts": ts,
        "node": node_of(rank, gpus_per_node),
        "gpu": gpu_of(rank, gpus_per_node),
        "event": event,
        "code": code,
        "detail": f"{event} {code}",
    }


def process(
    rank: int, ts: datetime, event: str, *, gen: int = 1, gpus_per_node: int = 8, **fields: Any
) -> dict[str, Any]:
    rec = {
        "kind": "process",
        "ts": ts,
        "group": GROUP,
        "generation": gen,
        "rank": rank,
        "pid": 1000 + rank,
        "gpu": gpu_of(rank, gpus_per_node),
        "event": event,
    }
    rec.update(fields)
    return rec


def transition(
    ts: datetime,
    from_state: str | None,
    to_state: str,
    *,
    gen: int = 1,
    restart_count: int = 0,
    **fields: Any,
) -> dict[str, Any]:
    rec = {
        "kind": "transition",
        "ts": ts,
        "group": GROUP,
        "generation": gen,
        "from_state": from_state,
        "to_state": to_state,
        "reason": "test",
        "restart_count": restart_count,
        "world_size": None,
        "topology": None,
        "data_cursor": None,
        "model_version": "v1",
    }
    rec.update(fields)
    return rec


def collective(
    rank: int, ts: datetime, entries: list[dict[str, Any]], gen: int = 1
) -> dict[str, Any]:
    return {
        "kind": "collective",
        "ts": ts,
        "group": GROUP,
        "generation": gen,
        "rank": rank,
        "entries": entries,
    }


def entry(
    seq: int,
    state: str,
    started_ts: datetime | None,
    *,
    op: str = "all_reduce",
    pg: str = "0",
    numel: int = 1 << 20,
    dtype: str = "bfloat16",
) -> dict[str, Any]:
    return {
        "seq": seq,
        "pg": pg,
        "op": op,
        "numel": numel,
        "dtype": dtype,
        "state": state,
        "started_ts": started_ts,
    }


def checkpoint(
    ts: datetime,
    cid: str,
    step_n: int,
    phase: str,
    shards: int = 4,
    *,
    manifest: dict[str, Any] | None = None,
    gen: int = 1,
) -> dict[str, Any]:
    if manifest is None:
        sh = [
            {"path": f"{cid}/shard-{i}.pt", "bytes": 1000, "sha256": f"{i:064x}"}
            for i in range(shards)
        ]
        manifest = {"shards": sh, "total_bytes": 1000 * shards, "format": "dcp"}
    return {
        "kind": "checkpoint",
        "ts": ts,
        "group": GROUP,
        "generation": gen,
        "checkpoint_id": cid,
        "step": step_n,
        "phase": phase,
        "manifest": manifest,
        "duration_ms": 1000.0,
    }


def training(
    *,
    ranks: int = 16,
    steps: int = 20,
    step_ms: float = 1000.0,
    jitter: float = 0.0,
    end: datetime = T0,
    gen: int = 1,
    seed: int = 7,
    gpus_per_node: int = 8,
    first_step: int = 100,
    with_checkpoint: bool = True,
) -> list[dict[str, Any]]:
    """A healthy group: `steps` steps per rank ending at `end`, samples, one checkpoint."""
    rnd = random.Random(seed)
    start = end - timedelta(milliseconds=step_ms * (steps + 5))
    recs: list[dict[str, Any]] = [transition(start, "initializing", "running", gen=gen)]
    for rk in range(ranks):
        recs.append(process(rk, start, "started", gen=gen, gpus_per_node=gpus_per_node))
        recs.append(sample(rk, end, gpus_per_node=gpus_per_node))
        for i in range(steps):
            d = step_ms * (1 + rnd.uniform(-jitter, jitter))
            ts = end - timedelta(milliseconds=step_ms * (steps - 1 - i))
            recs.append(step(rk, first_step + i, ts, duration_ms=d, gen=gen))
    if with_checkpoint:
        ck_ts = end - timedelta(milliseconds=step_ms * steps)
        recs.append(checkpoint(ck_ts, "ckpt-100", first_step, "written", gen=gen))
        recs.append(
            checkpoint(ck_ts + timedelta(seconds=1), "ckpt-100", first_step, "committed", gen=gen)
        )
    return recs


def heartbeats(ranks: int, ts: datetime, gpus_per_node: int = 8) -> dict[str, datetime | None]:
    return {node_of(r, gpus_per_node): ts for r in range(0, ranks, gpus_per_node)}


def snap(
    records: list[dict[str, Any]],
    *,
    now: datetime = T0,
    state: str = "running",
    gen: int = 1,
    nodes: dict[str, datetime | None] | None = None,
    contract_findings: list[dict[str, Any]] | None = None,
) -> GroupSnapshot:
    return build_snapshot(
        group=GROUP,
        generation=gen,
        state=state,
        records=records,
        nodes=nodes if nodes is not None else {},
        contract_findings=contract_findings or [],
        now=now,
    )


def of_kind(diagnosis: Any, kind: str) -> list[Any]:
    return [f for f in diagnosis.findings if f.kind == kind]


def rank_subject(rank: int) -> str:
    return f"rank:{GROUP}/{rank}"
