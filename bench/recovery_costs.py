"""Benchmark: what measuring one resolved incident's recovery costs reads, for a long job.

A resolved incident's costs (console.queries.recovery.measure) are measured by its group's
diagnosis passes every 30 s until final, inside the pass: the group's next pass waits.
This writes one group of `--ranks` ranks (8 per node) whose generation 1 ran `--hours` at
one step per `--step-s`, checkpointing every `--ckpt-every` steps, then failed; generation
2 restored the newest checkpoint, redid the lost steps and ran on `--extra` steps. Two
incidents: A, generation 1's failure (restarted, caught up); B, a straggler of generation
2 resolved without a restart (its costs are the generation's newest step). Each is
measured `--runs` times (median), with the pages (8 KiB) its step queries touched
(EXPLAIN ANALYZE BUFFERS of each query it ran on ingest_steprecord) and, as the baseline
of the same run, the least any measurement must read: a count(*) of the interruption's own
rows (A: generation 1's steps from the resume step on and generation 2's until it caught
up; B: the newest step's rows), bounded by time on the same index.

    python bench/recovery_costs.py [--ranks 1024] [--hours 1] [--runs 5]
    BENCH_TREE=/tmp/old python bench/recovery_costs.py   # another checkout's code

Without DATABASE_URL/REDIS_URL it starts a throwaway embedded Postgres and Valkey.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
_ROOT = Path(os.environ.get("BENCH_TREE") or _HERE.parent).resolve()
# Run as a script, this file's folder comes first on sys.path and its name would shadow
# the `console` app: put the tree under test there instead.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_ROOT))
sys.path.insert(1, str(_HERE.parent))

GROUP = "bench-recovery"
OTHER = "bench-recovery-neighbour"
T0 = datetime(2026, 11, 29, 4, 0, tzinfo=UTC)
RESTART_AFTER_S = 60.0  # failure -> generation 2 running
RESTORE_S = 30.0  # generation 2 running -> its first step


def _setup() -> Any:
    from bench.console import _setup as setup

    return setup()


def build(
    ranks: int, steps: int, step_s: float, ckpt_every: int, extra: int, others: int
) -> dict[str, Any]:
    """Write the group, its two generations' steps (COPY), transitions, checkpoints and the
    two resolved incidents, beside another job of `others` ranks stepping over the same
    hours (a fleet's table holds other groups' rows, which a plan on the time index reads
    too); replaces an earlier run's groups."""
    from django.db import connection

    from console.models import ConsistencyGroup, Incident, Node
    from ingest.models import CheckpointRecord, TransitionRecord

    with connection.cursor() as cur:
        cur.execute(
            "DELETE FROM ingest_steprecord WHERE group_id IN "
            "(SELECT id FROM console_consistencygroup WHERE name IN (%s, %s))",
            [GROUP, OTHER],
        )
    ConsistencyGroup.objects.filter(name__in=[GROUP, OTHER]).delete()
    Node.objects.bulk_create(
        [Node(name=f"rc-{i:04d}", health="ok", last_seen=T0) for i in range(ranks // 8)],
        ignore_conflicts=True,
        batch_size=2000,
    )
    by_name = {n.name: n.pk for n in Node.objects.filter(name__startswith="rc-")}
    nodes = [by_name[f"rc-{r // 8:04d}"] for r in range(ranks)]
    fail_at = T0 + timedelta(seconds=steps * step_s)
    restart_at = fail_at + timedelta(seconds=RESTART_AFTER_S)
    resume = (steps // ckpt_every) * ckpt_every
    if resume >= steps:
        resume -= ckpt_every
    redo_to = steps + extra
    end = restart_at + timedelta(seconds=RESTORE_S + (redo_to - resume) * step_s)
    group = ConsistencyGroup.objects.create(
        name=GROUP,
        kind="training",
        state="running",
        generation=2,
        restart_count=1,
        world_size=ranks,
        state_since=restart_at,
        last_activity=end,
    )
    other = ConsistencyGroup.objects.create(
        name=OTHER,
        kind="training",
        state="running",
        generation=1,
        world_size=others,
        state_since=T0,
        last_activity=end,
    )
    cols = "ts, node_id, group_id, generation, stale, rank, step, tokens, data_cursor, loss"
    with (
        connection.cursor() as cur,
        cur.cursor.copy(f"COPY ingest_steprecord ({cols}) FROM STDIN") as copy,
    ):
        for gid, world, gen, first, last, start in (
            (other.pk, others, 1, 1, steps + extra + 100, T0),
            (group.pk, ranks, 1, 1, steps, T0),
            (group.pk, ranks, 2, resume + 1, redo_to, restart_at + timedelta(seconds=RESTORE_S)),
        ):
            for s in range(first, last + 1):
                ts = (start + timedelta(seconds=(s - first + 1) * step_s)).isoformat()
                copy.write(
                    "".join(
                        f"{ts}\t{nodes[r % len(nodes)]}\t{gid}\t{gen}\tf\t{r}\t{s}\t4096\t"
                        f"{s * 4096 * world}\t2.5\n"
                        for r in range(world)
                    )
                )
    with connection.cursor() as cur:
        cur.execute("VACUUM ANALYZE ingest_steprecord")
    path = [
        (1, None, "running", T0),
        (1, "running", "quiescing", fail_at + timedelta(seconds=10)),
        (1, "quiescing", "recovering", fail_at + timedelta(seconds=20)),
        (2, "recovering", "running", restart_at),
    ]
    common = {"node_id": nodes[0], "group": group}
    TransitionRecord.objects.bulk_create(
        [
            TransitionRecord(
                ts=ts,
                generation=gen,
                from_state=frm,
                to_state=to,
                restart_count=gen - 1,
                world_size=ranks,
                **common,
            )
            for gen, frm, to, ts in path
        ]
    )
    CheckpointRecord.objects.bulk_create(
        [
            CheckpointRecord(
                ts=T0 + timedelta(seconds=s * step_s + 5),
                generation=1,
                checkpoint_id=f"ckpt-{s}",
                step=s,
                phase=phase,
                data_cursor=s * 4096 * ranks,
                **common,
            )
            for s in range(ckpt_every, steps, ckpt_every)
            for phase in ("committed", "verified")
        ]
    )
    first_b = end - timedelta(seconds=30)

    def incident(key: str, gen: int, kind: str, first: datetime, resolved: datetime) -> Any:
        return Incident.objects.create(
            group=group,
            generation=gen,
            fingerprint=f"bench-{key}",
            kind=kind,
            subject=f"rank:{GROUP}/3",
            severity="major",
            summary=f"bench {kind}",
            root_cause={"evidence": {"rank": 3}},
            state="resolved",
            opened_at=first,
            resolved_at=resolved,
            timeline={
                "first_evidence": first.isoformat(),
                "detected": (first + timedelta(seconds=2)).isoformat(),
            },
        )

    a = incident("a", 1, "process_exit", fail_at, restart_at)
    b = incident("b", 2, "straggler", first_b, end)
    return {
        "group": group,
        "a": a,
        "b": b,
        "resume": resume,
        "steps": steps,
        "redo_to": redo_to,
        "fail_at": fail_at,
        "restart_at": restart_at,
        "end": end,
        "step_s": step_s,
    }


def _count(sql: str, params: list[Any]) -> tuple[float, int]:
    from django.db import connection

    started = time.perf_counter()
    with connection.cursor() as cur:
        cur.execute(sql, params)
        n = cur.fetchone()[0]
    return (time.perf_counter() - started) * 1000, n


def baselines(world: dict[str, Any]) -> dict[str, tuple[float, int]]:
    """count(*) of each incident's own rows, bounded by time on (group, generation, ts)."""
    g, step_s = world["group"].pk, world["step_s"]
    resume_ts = T0 + timedelta(seconds=world["resume"] * step_s)
    caught_up = world["restart_at"] + timedelta(
        seconds=RESTORE_S + (world["steps"] - world["resume"]) * step_s
    )
    sql = (
        "SELECT count(*) FROM ingest_steprecord WHERE group_id = %s AND generation = %s"
        " AND ts >= %s AND ts <= %s"
    )
    ms1, n1 = _count(sql, [g, 1, resume_ts, world["fail_at"]])
    ms2, n2 = _count(sql, [g, 2, world["restart_at"], caught_up])
    newest = world["end"] - timedelta(seconds=step_s / 2)
    ms3, n3 = _count(sql, [g, 2, newest, world["end"]])
    return {"a": (ms1 + ms2, n1 + n2), "b": (ms3, n3)}


def _pages(queries: list[tuple[str, Any]]) -> int:
    """Shared buffers (hit + read) the step queries touched, by EXPLAIN ANALYZE BUFFERS."""
    from django.db import connection

    total = 0
    with connection.cursor() as cur:
        for sql, params in queries:
            cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params)
            raw = cur.fetchone()[0]
            plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
            total += int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0))
    return total


def measure(incident: Any, runs: int) -> tuple[float, int, int]:
    """Median ms of recovery.measure, and the step queries and pages of one measurement."""
    from django.db import connection

    from console.models import Incident
    from console.queries import recovery

    incident = Incident.objects.select_related("group").get(pk=incident.pk)
    captured: list[tuple[str, Any]] = []

    def capture(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if "ingest_steprecord" in sql:
            captured.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        recovery.measure(incident)
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        costs = recovery.measure(incident)
        times.append((time.perf_counter() - started) * 1000)
    assert costs is not None
    return statistics.median(times), len(captured), _pages(captured)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument("--step-s", type=float, default=1.0)
    parser.add_argument("--ckpt-every", type=int, default=600)
    parser.add_argument("--extra", type=int, default=600)
    parser.add_argument("--others", type=int, default=1024, help="the neighbour job's ranks")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    embedded = _setup()
    try:
        steps = int(args.hours * 3600 / args.step_s)
        started = time.perf_counter()
        world = build(args.ranks, steps, args.step_s, args.ckpt_every, args.extra, args.others)
        from django.db import connection

        with connection.cursor() as cur:
            cur.execute("SELECT count(*) FROM ingest_steprecord")
            rows = cur.fetchone()[0]
        took = time.perf_counter() - started
        print(
            f"tree {_ROOT}\nbuilt {args.ranks} ranks, generation 1 {steps} steps "
            f"({args.hours} h), resume at {world['resume']}, generation 2 to "
            f"{world['redo_to']}: {rows} step rows (the neighbour's {args.others} ranks "
            f"included) in {took:.1f} s"
        )
        base = baselines(world)
        for key, label in (("a", "A restarted, caught up"), ("b", "B resolved, no restart")):
            ms, queries, pages = measure(world[key], args.runs)
            costs = _costs(world[key])
            base_ms, own = base[key]
            print(
                f"{label:<24} measure {ms:8.1f} ms  {queries} step queries  {pages:7d} pages"
                f"  | baseline count(*) of its {own} own rows {base_ms:7.1f} ms"
                f"  ratio {ms / max(base_ms, 0.01):6.1f}"
            )
            print(f"{'':<24} costs {costs}")
    finally:
        if embedded is not None:
            embedded.stop()


def _costs(incident: Any) -> dict[str, Any]:
    from console.models import Incident
    from console.queries import recovery

    got = recovery.measure(Incident.objects.select_related("group").get(pk=incident.pk)) or {}
    keys = ("lost_steps", "lost_tokens", "repeated_steps", "restore_s", "last_step", "complete")
    return {k: got.get(k) for k in keys}


if __name__ == "__main__":
    main()
