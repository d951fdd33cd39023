"""Benchmark: a new day's step partition read before and after its first ANALYZE.

A diagnosis pass reads the rows since its cursor (`rank_tables.rank_records_since`). On a
partition autovacuum has not analyzed yet (its first look comes up to `autovacuum_naptime`,
60 s, after the day starts filling) the planner has no statistics and walks the group's
`(group, generation, ts)` index over the day's rows instead of the primary key from the
cursor. Beat now runs `partitions.analyze_young` every 5 s. This bench says what that buys
and what it costs:

- writes a 16,384-rank group's steps into a day partition of its own, with autovacuum off
  for it (so the "before" stays before), `--steps` steps in arrival order;
- times the incremental read of the newest step (cursor one step behind) and of the newest
  `--behind` steps, first with the partition never analyzed, then after `analyze_young`;
- times `analyze_young` itself: the run that analyzes, and the run at rest (nothing due);
- times the late-row re-check's `id = ANY(ids)` filter over the newest three steps with a
  third of their ids, the array as psycopg sends it (int[] here: not hashed against a
  bigint column) against the same array cast to `::bigint[]` (what the read sends);
- baseline in the same run: a `SELECT 1` round trip.

    python bench/partition_stats.py [--ranks 16384] [--steps 45] [--runs 5]

Without DATABASE_URL/REDIS_URL it starts a throwaway embedded Postgres and Valkey.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

DAY = datetime(2033, 1, 10, 0, 0, tzinfo=UTC)


def _copy(group_id: int, ranks: int, steps: int, nodes: list[int]) -> None:
    """COPY the steps in time order (one chunk per step), as ingest writes them."""
    from django.db import connection

    cols = "ts, node_id, group_id, generation, stale, rank, step, tokens, duration_ms, phases"
    phases = '{"compute": 700.0, "collective": 250.0, "input": 40.0}'
    with (
        connection.cursor() as cur,
        cur.cursor.copy(f"COPY ingest_steprecord ({cols}) FROM STDIN") as copy,
    ):
        for s in range(steps):
            base = DAY + timedelta(seconds=s)
            copy.write(
                "".join(
                    f"{(base + timedelta(microseconds=r * 3)).isoformat()}\t{nodes[r]}\t"
                    f"{group_id}\t2\tf\t{r}\t{s}\t4096\t1000.0\t{phases}\n"
                    for r in range(ranks)
                )
            )


def _ms(fn: Any, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ranks", type=int, default=16384)
    parser.add_argument("--steps", type=int, default=45)
    parser.add_argument("--behind", type=int, default=2, help="steps behind, second read")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    from bench.console import GROUP, _setup, build

    embedded = _setup()
    try:
        build(args.ranks, 1)
        from django.db import connection

        from console.models import ConsistencyGroup, Rank
        from console.queries.telemetry import rank_tables
        from ingest import partitions

        group = ConsistencyGroup.objects.get(name=GROUP)
        created = partitions.ensure_partitions(days_ahead=0, days_back=0, now=DAY)
        part = partitions.partition_name("ingest_steprecord", DAY.date())
        with connection.cursor() as cur:
            cur.execute(f"ALTER TABLE {part} SET (autovacuum_enabled = off)")
        ranks = dict(Rank.objects.filter(group=group).values_list("rank", "node_id"))
        nodes = [ranks[r] for r in range(args.ranks)]
        names = dict(group.ranks.values_list("node_id", "node__name").distinct())
        t0 = time.perf_counter()
        _copy(group.pk, args.ranks, args.steps, nodes)
        rows = args.ranks * args.steps
        print(f"wrote {rows:,} step rows into {part} in {time.perf_counter() - t0:.1f} s")
        with connection.cursor() as cur:
            cur.execute(f"SELECT max(id) FROM {part}")  # noqa: S608 - our name
            (top,) = cur.fetchone()

        def read(behind: int) -> int:
            after = {"step": top - behind * args.ranks}
            got = rank_tables.rank_records_since(group, node_names=names, after=after, skip={})
            return -1 if got is None else len(got)

        def plan(behind: int) -> str:
            """The new partition's scan and the SQL's own time (EXPLAIN ANALYZE)."""
            with connection.cursor() as cur:
                cur.execute(
                    f"EXPLAIN ANALYZE SELECT id FROM ingest_steprecord WHERE group_id = %s "  # noqa: S608
                    f"AND NOT stale AND generation = %s AND id > %s ORDER BY id LIMIT "
                    f"{rank_tables.MAX_SINCE_ROWS}",
                    [group.pk, group.generation, top - behind * args.ranks],
                )
                lines = [row[0].strip() for row in cur.fetchall()]
            at = next((i for i, ln in enumerate(lines) if part in ln), None)
            scans = [] if at is None else lines[at : at + 8]
            how = " / ".join(
                " ".join(ln.split("  (")[0].lstrip("-> ").split()[:5])
                for ln in scans
                if "Scan on" in ln
            )
            return f"{how}; SQL {lines[-1].split(': ')[-1]}"

        def select_1() -> None:
            with connection.cursor() as cur:
                cur.execute("SELECT 1")

        results: dict[str, dict[str, float]] = {}
        for stage in ("never analyzed", "after analyze_young"):
            if stage != "never analyzed":
                t0 = time.perf_counter()
                due = partitions.analyze_young()
                took = (time.perf_counter() - t0) * 1000
                print(f"analyze_young: {took:.0f} ms, analyzed {due}")
            read(1)  # the first reader of a row writes its hint bits: not this stage's cost
            results[stage] = {}
            for behind in (1, args.behind):
                ms = _ms(lambda b=behind: read(b), args.runs)
                results[stage][f"{behind} step(s) behind"] = ms
                print(
                    f"  {stage:20s} read {behind} step(s) behind: {read(behind):6d} rows "
                    f"{ms:8.1f} ms  plan: {plan(behind)}"
                )
        # The late-row re-check's `id = ANY(ids)` as a filter over rows (the plan a live 16k
        # pass got): psycopg sends ints as smallint[] or int[], and a cross-type = is not
        # hashed, so the array is scanned per row. OFFSET 0 keeps the filter off the index.
        span = 3 * args.ranks
        late = list(range(top - span + 1, top + 1, 3))
        any_sql = (
            f"SELECT count(*) FROM (SELECT id FROM {part} WHERE id > %s OFFSET 0) s "  # noqa: S608
            "WHERE s.id = ANY(%s{cast})"
        )

        def any_filter(cast: str) -> None:
            with connection.cursor() as cur:
                cur.execute(any_sql.format(cast=cast), [top - span, late])
                assert cur.fetchone()[0] == len(late)

        uncast = _ms(lambda: any_filter(""), 1)
        cast = _ms(lambda: any_filter("::bigint[]"), args.runs)
        print(
            f"late-row filter, {len(late):,} ids over {span:,} rows: uncast {uncast:.0f} ms, "
            f"::bigint[] {cast:.1f} ms, ratio {cast / uncast:.4f}"
        )
        rest = _ms(partitions.analyze_young, args.runs)
        base = _ms(select_1, 50)
        print(f"analyze_young at rest (nothing due): {rest:.2f} ms")
        print(f"baseline SELECT 1: {base:.3f} ms")
        for key, before in results["never analyzed"].items():
            after = results["after analyze_young"][key]
            print(
                f"read {key}: {before:.1f} ms never analyzed, {after:.1f} ms analyzed, "
                f"ratio {after / before:.3f}"
            )
        print(f"analyze_young at rest / SELECT 1: {rest / base:.1f}")
        with connection.cursor() as cur:
            for name in created:
                cur.execute(f"DROP TABLE IF EXISTS {name}")
    finally:
        if embedded is not None:
            embedded.stop()


if __name__ == "__main__":
    main()
