"""Benchmark: the group page and its chart JSON for a 16,384-rank training group.

Writes 2,048 nodes x 8 GPUs, one group of 16,384 ranks with ~60 steps each (~1M step
rows, COPY), transitions, checkpoints and one open incident straight into Postgres, then
times GET /groups/<name>/ and GET /api/v1/pages/groups/<name>/charts/ with the Django
test client (server time and bytes; goal <= 300 ms and <= 1 MB each), next to two
baselines measured in the same run: `SELECT count(*)` over the group's step rows and the
fleet page. The cold chart is timed twice: from raw rows (before any step-bin rollup, as
before the rollup existed), and after the rollup ran as Celery beat runs it (`ingest.step_bins`:
closed 5 s buckets rolled, the last seconds read raw). The rollup passes are timed too:
the first (catch-up) pass over the whole window, the steady pass beat repeats every 5 s
(the last 3 closed buckets, ~200k step rows at 16k ranks) and the once-a-minute refold
of the chart's 10 minutes.

    python bench/console.py [--ranks 16384] [--steps 60] [--runs 7]

Without DATABASE_URL/REDIS_URL it starts a throwaway embedded Postgres and Valkey.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

# Run as a script, this file's folder comes first on sys.path and its name would shadow
# the `console` app: put the repository root there instead.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

GROUP = "bench-16k"
T0 = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)


def _setup() -> Any:
    embedded = None
    if not (os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL")):
        from faultline.embedded import start_embedded

        embedded = start_embedded(Path(tempfile.mkdtemp(prefix="faultline-bench-")))
        os.environ["DATABASE_URL"] = embedded.database_url
        os.environ["REDIS_URL"] = embedded.redis_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "faultline.settings")
    os.environ.setdefault("FAULTLINE_DB_POOL", "0")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return embedded


def build(ranks: int, steps: int) -> None:
    """Write the fleet, the group and its telemetry; replaces an earlier bench group."""
    from django.db import connection

    from console.models import ConsistencyGroup, Device, Incident, Node, Rank

    with connection.cursor() as cur:
        # Raw DELETE: the ORM's cascade would load a million step rows to delete them.
        cur.execute(
            "DELETE FROM ingest_steprecord WHERE group_id IN "
            "(SELECT id FROM console_consistencygroup WHERE name = %s)",
            [GROUP],
        )
        # A previous run's rollup claims the same minutes: start from raw rows again.
        cur.execute("DELETE FROM ingest_rollupmark")
    ConsistencyGroup.objects.filter(name=GROUP).delete()
    nodes = [Node(name=f"bench-{i:04d}", health="ok", last_seen=T0) for i in range(ranks // 8)]
    Node.objects.bulk_create(nodes, ignore_conflicts=True, batch_size=2000)
    by_name = {n.name: n.pk for n in Node.objects.filter(name__startswith="bench-")}
    sample = {"temp_c": 61.0, "power_w": 540.0, "util_pct": 97.0, "throttle_reasons": []}
    Device.objects.bulk_create(
        [
            Device(
                uuid=f"GPU-b-{r}",
                node_id=by_name[f"bench-{r // 8:04d}"],
                index=r % 8,
                health="ok",
                last_sample=sample,
                last_seen=T0,
            )
            for r in range(ranks)
        ],
        ignore_conflicts=True,
        batch_size=5000,
    )
    end = T0 + timedelta(seconds=steps * 1.2)
    group = ConsistencyGroup.objects.create(
        name=GROUP,
        kind="training",
        state="running",
        generation=2,
        restart_count=1,
        world_size=ranks,
        state_since=T0,
        last_activity=end,
        summary={
            "goodput": {
                "window_s": 600.0,
                "wall_s": 80.0,
                "tokens_total": 10**9,
                "tokens_valid": 9 * 10**8,
                "g_train_tokens_per_s": 1.1e7,
                "badput_s": {
                    "stall": 2.0,
                    "restart": 5.0,
                    "checkpoint": 1.5,
                    "recompute": 3.0,
                    "invalid": 0.0,
                },
                "productive_fraction": 0.86,
            },
            "tail_ratio": 1.31,
            "phase_medians_ms": {"compute": 800.0, "collective": 250.0},
            "newest_valid_checkpoint": "ckpt-40",
            "recovery_advice": {
                "auto_restart_safe": True,
                "reason": "restart from ckpt-40",
                "checkpoint": "ckpt-40",
                "lost_steps": 20,
                "lost_tokens": 20 * 4096 * ranks,
                "lost_gpu_hours": 109.2,
            },
        },
    )
    Rank.objects.bulk_create(
        [
            Rank(
                group=group,
                rank=r,
                node_id=by_name[f"bench-{r // 8:04d}"],
                gpu=f"GPU-b-{r}",
                generation=2,
                last_step=steps - 1,
                last_step_at=end,
                process_state="started",
            )
            for r in range(ranks)
        ],
        batch_size=5000,
    )
    rnd = random.Random(7)
    slow = set(rnd.sample(range(ranks), 12))
    _copy_steps(group.pk, ranks, steps, slow, by_name, rnd)
    _transitions_and_checkpoints(group, by_name["bench-0000"], steps)
    Incident.objects.create(
        group=group,
        generation=2,
        fingerprint="bench-straggler",
        kind="straggler",
        subject=f"rank:{GROUP}/{min(slow)}",
        severity="major",
        summary="Rank is a straggler",
        root_cause={"evidence": {"rank": min(slow), "tail_ratio": 1.6}},
        opened_at=end,
    )


def _copy_steps(
    group_id: int, ranks: int, steps: int, slow: set[int], by_name: dict[str, int], rnd: Any
) -> None:
    """COPY in text format, one chunk per step, in time order as ingest writes them.

    Rank-major order (every rank's steps together) would scatter a few seconds of steps
    over every page of the table, which no live group does.
    """
    from django.db import connection

    cols = "ts, node_id, group_id, generation, stale, rank, step, tokens, data_cursor, " + (
        "duration_ms, phases, loss, grad_norm, loss_scale, overflow"
    )
    nodes = [by_name[f"bench-{r // 8:04d}"] for r in range(ranks)]
    factors = [1.6 if r in slow else 1.0 for r in range(ranks)]
    phases = [
        f'{{"compute": {700.0 * f}, "collective": 250.0, "input": 40.0, '
        '"checkpoint": 0.0, "optimizer": 10.0}'
        for f in factors
    ]
    with (
        connection.cursor() as cur,
        cur.cursor.copy(f"COPY ingest_steprecord ({cols}) FROM STDIN") as copy,
    ):
        for s in range(steps):
            base = T0 + timedelta(seconds=s * 1.2)
            offsets = sorted((rnd.random() * 50, r) for r in range(ranks))  # arrival order
            lines = []
            for ms, r in offsets:
                ts = base + timedelta(milliseconds=ms)
                dur = 1000.0 * factors[r] + rnd.random() * 40
                lines.append(
                    f"{ts.isoformat()}\t{nodes[r]}\t{group_id}\t2\tf\t{r}\t{s}\t4096\t"
                    f"{s * 4096}\t{dur:.2f}\t{phases[r]}\t2.5\t1.0\t65536.0\tf\n"
                )
            copy.write("".join(lines))
    with connection.cursor() as cur:
        # A re-run deleted the previous million rows: without VACUUM every scan reads them too.
        cur.execute("VACUUM ANALYZE ingest_steprecord")


def _transitions_and_checkpoints(group: Any, node_id: int, steps: int) -> None:
    from ingest.models import CheckpointRecord, TransitionRecord

    path = [
        ("initializing", "running", 1),
        ("running", "quiescing", 1),
        ("quiescing", "recovering", 1),
        ("recovering", "initializing", 2),
        ("initializing", "running", 2),
    ]
    TransitionRecord.objects.bulk_create(
        [
            TransitionRecord(
                ts=T0 - timedelta(minutes=10 - i),
                node_id=node_id,
                group=group,
                generation=gen,
                from_state=a,
                to_state=b,
                restart_count=gen - 1,
                world_size=group.world_size,
            )
            for i, (a, b, gen) in enumerate(path)
        ]
    )
    CheckpointRecord.objects.bulk_create(
        [
            CheckpointRecord(
                ts=T0 + timedelta(seconds=s),
                node_id=node_id,
                group=group,
                generation=2,
                checkpoint_id=f"ckpt-{s}",
                step=s,
                phase=phase,
            )
            for s in range(0, steps, 20)
            for phase in ("staging", "written", "committed")
        ]
    )


def _time(client: Any, url: str, runs: int, *, cold: bool = False) -> tuple[float, int]:
    from django.core.cache import cache

    times, size = [], 0
    for _ in range(runs):
        if cold:
            cache.clear()  # the chart JSON is cached for a few seconds; measure a recompute
        started = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, (url, response.status_code)
        size = len(response.content)
    return statistics.median(times), size


def _report(label: str, url: str, ms: float, size: int) -> None:
    print(f"{label:<38} {url:<40} {ms:7.1f} ms  {size / 1024:8.1f} KiB")


def _newest(group_id: int) -> datetime:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT max(ts) FROM ingest_steprecord WHERE group_id = %s", [group_id])
        return cur.fetchone()[0]


def _rollups(newest: datetime, runs: int) -> None:
    """Run and time the step-bin rollup as beat would, the newest step just written.

    Leaves the rollup covering every closed bucket up to GRACE before the newest step.
    """
    from ingest import step_bins

    def timed(now: datetime, buckets: int) -> tuple[float, dict[str, int]]:
        started = time.perf_counter()
        written = step_bins.rollup(now=now, buckets=buckets)
        return (time.perf_counter() - started) * 1000, written

    ms, written = timed(newest, step_bins.LOOKBACK_BUCKETS)  # the first pass catches up
    print(f"rollup    first pass (catch-up, whole window): {ms:7.1f} ms  {written}")
    steady = [timed(newest, step_bins.LOOKBACK_BUCKETS)[0] for _ in range(runs)]
    rows = _rows_between(newest, step_bins.LOOKBACK_BUCKETS)
    print(
        f"rollup    steady pass (every 5 s, {step_bins.LOOKBACK_BUCKETS} buckets, "
        f"{rows} step rows): {statistics.median(steady):7.1f} ms"
    )
    ms, _ = timed(newest, step_bins.BACKSTOP_BUCKETS)
    print(f"rollup    minute refold ({step_bins.BACKSTOP_BUCKETS} buckets): {ms:7.1f} ms")


def _rows_between(newest: datetime, buckets: int) -> int:
    from django.db import connection

    from ingest import step_bins

    end = step_bins.bucket_floor(newest - step_bins.GRACE)
    start = end - timedelta(seconds=step_bins.BUCKET_S * buckets)
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM ingest_steprecord WHERE ts >= %s AND ts < %s", [start, end]
        )
        return cur.fetchone()[0]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ranks", type=int, default=16_384)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args(argv)
    embedded = _setup()
    try:
        from django.db import connection
        from django.db.models import Count
        from django.test import Client

        from console.actions import create_user
        from console.models import ConsistencyGroup

        started = time.perf_counter()
        build(args.ranks, args.steps)
        print(
            f"built {args.ranks} ranks x {args.steps} steps in "
            f"{time.perf_counter() - started:.1f} s"
        )
        from django.contrib.auth.models import User

        user = User.objects.filter(username="bench").first() or create_user(
            actor="bench",
            username="bench",
            role="viewer",
            password="bench-pass-123",  # noqa: S106 - throwaway bench user
        )
        client = Client(HTTP_HOST="127.0.0.1")
        client.force_login(user)
        group = ConsistencyGroup.objects.get(name=GROUP)
        count_ms = []
        for _ in range(args.runs):
            t = time.perf_counter()
            with connection.cursor() as cur:
                cur.execute(
                    "SELECT count(*) FROM ingest_steprecord WHERE group_id = %s", [group.pk]
                )
                rows = cur.fetchone()[0]
            count_ms.append((time.perf_counter() - t) * 1000)
        print(
            f"baseline  SELECT count(*) ({rows} step rows): {statistics.median(count_ms):7.1f} ms"
        )
        charts = f"/api/v1/pages/groups/{GROUP}/charts/"
        for label, url, cold in [
            ("fleet page (goal <= 300 ms)", "/", False),
            ("group page", f"/groups/{GROUP}/", False),
            ("group JSON", f"/api/v1/pages/groups/{GROUP}/", False),
            ("charts cold, raw rows (no rollup yet)", charts, True),
        ]:
            _report(label, url, *_time(client, url, args.runs, cold=cold))
        newest = _newest(group.pk)
        _rollups(newest, args.runs)
        from console.api.pages import compute_group_charts

        group = ConsistencyGroup.objects.annotate(rank_count=Count("ranks")).get(pk=group.pk)
        same = compute_group_charts(group) == compute_group_charts(group, rollups=False)
        print(f"chart from rollup + raw tail == chart from raw rows: {same}")
        for label, url, cold in [
            ("charts cold, rollup + raw tail", charts, True),
            ("charts warm", charts, False),
        ]:
            _report(label, url, *_time(client, url, args.runs, cold=cold))
        # Just before beat's next pass the raw tail is one pass (5 s) longer.
        with connection.cursor() as cur:
            cur.execute(
                "UPDATE ingest_rollupmark SET rolled_until = rolled_until - '5 s'::interval"
            )
        _report(
            "charts cold, raw tail 5 s longer", charts, *_time(client, charts, args.runs, cold=True)
        )
    finally:
        if embedded is not None:
            embedded.stop()


if __name__ == "__main__":
    main()
