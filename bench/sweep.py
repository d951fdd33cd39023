"""Benchmark: the one-second sweeps at 2,048 nodes / 16,384 GPUs.

Beat sends two sweeps every second to the housekeeping queue, which one worker process
drains alone (`worker-housekeeping`): the node sweep (`console.sweep_nodes`: silent nodes
marked down, validated ones proposed back) and the group sweep (`console.sweep`: a
diagnosis scheduled per recently active group). They were one task on the default queue,
where it waited behind diagnosis passes and expired (16 of ~480 ran in 8 minutes of
`bench/detect.py --ranks 16384`), so a dead node's incident opened late. This bench says
what each sweep costs that process, next to one urgent-lane run measured in the same run
(why the sweeps do not share the lane's process).

Writes the fleet `bench/console.py` writes (2,048 nodes x 8 GPUs, one 16,384-rank group)
plus `--jobs` small groups of 8 ranks on the same nodes (a fleet of many jobs is the
sweep's expensive shape: it schedules a diagnosis per recently active group), every node
reporting. Then it times, in-process against Postgres and Valkey:

- the node sweep of the fleet at rest (the common case: nothing to mark), `--runs` times;
- the group sweep: the first run of a second (every group's diagnosis sent, as when the
  workers keep up) and the rest (pending keys held: nothing sent);
- the node sweep that finds 1 % of the nodes silent (marks each down, opens its incident),
  and a third of them silent together (one fleet incident), then the sweep resolving it;
- baselines: a `SELECT 1` round trip, one urgent-lane run for a node of the 16k group
  (`pipeline.diagnose_urgent`, what the lane exists for), and the group sweep's runs sent
  a claim and a message a group (as before `scheduling.schedule_sweep`).

    python bench/sweep.py [--jobs 255] [--runs 20]

Without DATABASE_URL/REDIS_URL it starts a throwaway embedded Postgres and Valkey.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

NODES, GPUS = 2048, 8


def build_jobs(jobs: int) -> None:
    """`jobs` groups of 8 ranks, one node each, active a moment ago."""
    from django.utils import timezone

    from console.models import ConsistencyGroup, Node, Rank

    ConsistencyGroup.objects.filter(name__startswith="bench-job-").delete()
    now = timezone.now()
    by_name = {n.name: n.pk for n in Node.objects.filter(name__startswith="bench-")}
    groups = ConsistencyGroup.objects.bulk_create(
        [
            ConsistencyGroup(
                name=f"bench-job-{j:04d}",
                kind="training",
                state="running",
                generation=1,
                world_size=GPUS,
                state_since=now,
                last_activity=now,
            )
            for j in range(jobs)
        ]
    )
    Rank.objects.bulk_create(
        [
            Rank(
                group=g,
                rank=r,
                node_id=by_name[f"bench-{(j + 1) % NODES:04d}"],
                gpu=f"GPU-b-{((j + 1) % NODES) * GPUS + r}",
                generation=1,
                last_step=0,
                last_step_at=now,
                process_state="started",
            )
            for j, g in enumerate(groups)
            for r in range(GPUS)
        ],
        batch_size=5000,
    )


def reporting(silent: int = 0) -> list[str]:
    """Every node reported just now but `silent` of them, spread out, 30 s ago; every
    group active just now. Returns the silent nodes' names."""
    from django.db.models import Q
    from django.utils import timezone

    from bench.console import GROUP
    from console.models import ConsistencyGroup, Incident, Node

    now = timezone.now()
    Node.objects.filter(name__startswith="bench-").update(last_seen=now, health="ok")
    Incident.objects.filter(kind="node_silent").delete()
    ConsistencyGroup.objects.filter(Q(name=GROUP) | Q(name__startswith="bench-job-")).update(
        last_activity=now
    )
    if not silent:
        return []
    names = [f"bench-{i:04d}" for i in range(0, NODES, NODES // silent)][:silent]
    Node.objects.filter(name__in=names).update(last_seen=now - timedelta(seconds=30))
    return names


def _timed(fn: Any) -> tuple[float, int]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as ctx:
        t0 = time.perf_counter()
        fn()
        took = (time.perf_counter() - t0) * 1000
    return took, len(ctx.captured_queries)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=255)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args(argv)
    from bench.console import GROUP, _setup, build

    embedded = _setup()
    try:
        build(NODES * GPUS, 3)
        build_jobs(args.jobs)
        from django.db import connection
        from django.utils import timezone

        from console import pipeline, scheduling
        from console.models import Node
        from console.tasks import sweep, sweep_nodes

        def select_1() -> None:
            with connection.cursor() as cur:
                cur.execute("SELECT 1")

        def urgent() -> None:
            pipeline.diagnose_urgent(group_name=GROUP, node="bench-0100", now=timezone.now())

        def sweep_all_due() -> None:
            """The group sweep as it runs when the workers keep up: every group's
            previous run started (its pending key cleared), so each is sent again."""
            from django.core.cache import cache

            cache.delete_many([scheduling.pending_key(g) for g in groups])
            scheduling.forget_recent()
            sweep()

        def sweep_one_by_one() -> None:
            """The baseline: the same runs sent as before 2026-12-06, a debounce claim
            and a message a group (schedule_diagnosis per group)."""
            from django.core.cache import cache

            cache.delete_many([scheduling.pending_key(g) for g in groups])
            scheduling.forget_recent()
            for name in pipeline.groups_to_sweep(now=timezone.now(), window=timedelta(minutes=30)):
                scheduling.schedule_diagnosis(name)

        reporting()
        groups = pipeline.groups_to_sweep(now=timezone.now(), window=timedelta(minutes=30))
        urgent()  # warm: the first run on a process reads more
        rest, base, lane, due, held, single = [], [], [], [], [], []
        for _ in range(args.runs):
            reporting()  # a run is seconds with the baseline: no node goes 10 s silent
            rest.append(_timed(sweep_nodes))
            base.append(_timed(select_1))
            lane.append(_timed(urgent))
            due.append(_timed(sweep_all_due))
            held.append(_timed(sweep))
            single.append(_timed(sweep_one_by_one))
        silent = reporting(silent=NODES // 100)
        marking = _timed(sweep_nodes)
        down = Node.objects.filter(name__in=silent, health="down").count()
        assert down == len(silent), (down, len(silent))
        # The path to the service breaks: a third of the fleet silent in one sweep, one
        # fleet incident (fleet_health.mass_silence), and then the sweep that settles it.
        many = reporting(silent=NODES // 3)
        together = _timed(sweep_nodes)
        assert Node.objects.filter(name__in=many, health="down").count() == len(many)
        reporting()
        settled = _timed(sweep_nodes)
        rest_ms = [ms for ms, _ in rest]
        due_ms = [ms for ms, _ in due]
        held_ms = [ms for ms, _ in held]
        lane_ms = statistics.median(ms for ms, _ in lane)
        base_ms = statistics.median(ms for ms, _ in base)
        print(
            f"fleet {NODES} nodes x {GPUS} GPUs, one {NODES * GPUS}-rank group + "
            f"{args.jobs} jobs of {GPUS} ranks; {args.runs} runs"
        )
        rest_p50 = statistics.median(rest_ms)
        print(
            f"node sweep at rest      p50 {rest_p50:7.2f} ms  p95 {_pct(rest_ms, 0.95):7.2f} ms"
            f"  {rest[0][1]} queries  share of a process's second {rest_p50 / 10:.2f} %"
        )
        print(
            f"node sweep, {len(silent)} silent   {marking[0]:7.1f} ms  {marking[1]} queries  "
            f"({marking[0] / len(silent):.1f} ms a node marked down)"
        )
        print(
            f"node sweep, {len(many)} silent  {together[0]:7.1f} ms  {together[1]} queries  "
            f"(together: one fleet incident, {together[0] / len(many):.2f} ms a node); "
            f"the sweep that resolves it {settled[0]:.1f} ms"
        )
        print(
            f"group sweep, all sent   p50 {statistics.median(due_ms):7.1f} ms  "
            f"p95 {_pct(due_ms, 0.95):7.1f} ms  ({len(groups)} groups)"
        )
        print(
            f"group sweep, all held   p50 {statistics.median(held_ms):7.1f} ms  "
            f"p95 {_pct(held_ms, 0.95):7.1f} ms"
        )
        single_ms = statistics.median(ms for ms, _ in single)
        print(
            f"baseline: all sent, a message a group  p50 {single_ms:7.1f} ms  -> group "
            f"sweep all sent {statistics.median(due_ms) / max(single_ms, 0.001):.3f}x"
        )
        print(
            f"baseline SELECT 1       p50 {base_ms:7.2f} ms  -> node sweep at rest "
            f"{rest_p50 / max(base_ms, 0.001):.1f}x"
        )
        print(
            f"baseline urgent run     p50 {lane_ms:7.1f} ms  -> node sweep at rest "
            f"{rest_p50 / max(lane_ms, 0.001):.3f}x, group sweep all sent "
            f"{statistics.median(due_ms) / max(lane_ms, 0.001):.2f}x"
        )
    finally:
        if embedded is not None:
            embedded.stop()


if __name__ == "__main__":
    main()
