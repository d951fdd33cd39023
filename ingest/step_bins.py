"""Fine-grained step rollups for the group charts: (group, generation, 5 s, rank block).

A cold heatmap over raw rows scans and hash-aggregates every step of the window (~1M rows
at 16,384 ranks). `rollup(now=...)` instead keeps, per BUCKET_S-second bucket,

- `ingest_stepbinrollup`: per rank block (a power of two of ranks, `console.charts.
  rank_block` of the group's size, so a chart row is always whole blocks) the slowest
  step, the sum and the count (mean = sum / count);
- `ingest_stephistrollup`: per log-scale step-time bucket (HIST_RESOLUTION per e-fold)
  the count, from which the chart reads p50/p90/p99 as it did from raw rows;

and `ingest_rollupmark` records the bucket range [rolled_from, rolled_until) those
tables cover, so the chart reads rollups inside it and raw rows only outside (the open
tail of the last few seconds). Both sums are exact, so a chart from rollups equals one
from raw rows.

Run by Celery beat every few seconds, off the ingest path: it takes no lock that ingest
takes (a pass is serialized by an advisory lock of its own) and never touches live state.
Each pass recomputes the last few closed buckets with one INSERT ... SELECT ... ON
CONFLICT DO UPDATE per table (rows that did not change are not rewritten), so it is
idempotent and folds in rows that arrived late; after a gap it catches up at most
CATCH_UP.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.db import connection, transaction

from console.charts import MAX_RANK_BINS

# Bucket width: the chart's time bins are whole buckets (120 x 5 s = its 10 minutes).
BUCKET_S = 5
# Log-scale step-time histogram: bucket b holds [e^(b/res), e^((b+1)/res)) ms (~1 %).
HIST_RESOLUTION = 48
# A bucket is rolled once it has been closed this long (agents batch about a second).
GRACE = timedelta(seconds=2)
# Closed buckets each pass recomputes: rows up to ~15 s late land on the next pass.
LOOKBACK_BUCKETS = 3
# The minute task's refold for rows later than LOOKBACK_BUCKETS: the last 2 minutes.
# The chart's whole 10 minutes would cost ~10M rows a minute at 16k ranks stepping at 1 Hz.
BACKSTOP_BUCKETS = 24
# After missed passes (or on the first), a pass goes back at most this far.
CATCH_UP = timedelta(minutes=15)
MARK = "step_bins"
_LOCK_KEY = 0x5354_4550_4249_4E53 >> 1  # "STEPBINS", as a bigint advisory lock key

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# Ranks per block for every group: the smallest power of two that fits the group's
# ranks (world size or registered ranks, whichever is larger) into MAX_RANK_BINS blocks;
# console.charts.rank_block is the same rule, so the chart assembles its rows from blocks.
_BLOCKS_CTE = """
blocks AS MATERIALIZED (
  SELECT g.id AS group_id,
         (SELECT min(1 << k) FROM generate_series(0, 30) k
          WHERE (%(max_bins)s::bigint << k) >= greatest(g.world_size, r.n, 1)) AS block
  FROM console_consistencygroup g
  LEFT JOIN (SELECT group_id, count(*) AS n FROM console_rank GROUP BY group_id) r
    ON r.group_id = g.id
)
"""

# Rows of a bucket that now belongs to a larger block than when it was rolled (a group
# whose ranks registered after its first steps) would be counted twice: drop them.
_DELETE_MISALIGNED_SQL = f"""
WITH {_BLOCKS_CTE}
DELETE FROM ingest_stepbinrollup r USING blocks b
WHERE r.group_id = b.group_id AND r.bucket >= %(start)s AND r.bucket < %(end)s
  AND r.rank_lo %% b.block <> 0
"""  # noqa: S608 - constant SQL

# One scan of the window's non-stale steps feeds both tables (GROUPING SETS). A row is
# rewritten only if it changed; a float sum may differ in its last bits between plans
# (a parallel scan adds in another order), which is not a change.
_ROLLUP_SQL = f"""
WITH {_BLOCKS_CTE},
agg AS MATERIALIZED (
  SELECT GROUPING(rank_lo) AS is_hist, group_id, generation, bucket, rank_lo, hb,
         count(*) AS n, max(duration_ms) AS mx, sum(duration_ms) AS sm
  FROM (
    SELECT s.group_id, s.generation,
           date_bin(make_interval(secs => %(width)s), s.ts, %(epoch)s) AS bucket,
           s.rank - s.rank %% b.block AS rank_lo,
           floor(ln(greatest(s.duration_ms, 0.001)) * %(hres)s)::int AS hb,
           s.duration_ms
    FROM ingest_steprecord s JOIN blocks b ON b.group_id = s.group_id
    WHERE s.ts >= %(start)s AND s.ts < %(end)s AND NOT s.stale AND s.duration_ms IS NOT NULL
  ) steps
  GROUP BY GROUPING SETS ((group_id, generation, bucket, rank_lo),
                          (group_id, generation, bucket, hb))
),
bins AS (
  INSERT INTO ingest_stepbinrollup
      (group_id, generation, bucket, rank_lo, steps, max_ms, sum_ms)
  SELECT group_id, generation, bucket, rank_lo, n, mx, sm FROM agg WHERE is_hist = 0
  ON CONFLICT (group_id, generation, bucket, rank_lo) DO UPDATE SET
      steps = EXCLUDED.steps, max_ms = EXCLUDED.max_ms, sum_ms = EXCLUDED.sum_ms
  WHERE ingest_stepbinrollup.steps <> EXCLUDED.steps
     OR ingest_stepbinrollup.max_ms <> EXCLUDED.max_ms
     OR abs(ingest_stepbinrollup.sum_ms - EXCLUDED.sum_ms) > 1e-9 * abs(EXCLUDED.sum_ms)
  RETURNING 1
),
hist AS (
  INSERT INTO ingest_stephistrollup (group_id, generation, bucket, hist_bucket, steps)
  SELECT group_id, generation, bucket, hb, n FROM agg WHERE is_hist = 1
  ON CONFLICT (group_id, generation, bucket, hist_bucket) DO UPDATE SET
      steps = EXCLUDED.steps
  WHERE ingest_stephistrollup.steps IS DISTINCT FROM EXCLUDED.steps
  RETURNING 1
)
SELECT (SELECT count(*) FROM bins), (SELECT count(*) FROM hist)
"""  # noqa: S608 - constant SQL

_MARK_SQL = """
INSERT INTO ingest_rollupmark (name, rolled_from, rolled_until) VALUES (%s, %s, %s)
ON CONFLICT (name) DO UPDATE SET
    rolled_from = EXCLUDED.rolled_from, rolled_until = EXCLUDED.rolled_until
"""


def bucket_floor(ts: datetime) -> datetime:
    """Start of the BUCKET_S bucket holding `ts` (buckets are aligned to the epoch)."""
    seconds = (ts - EPOCH) // timedelta(seconds=BUCKET_S) * BUCKET_S
    return EPOCH + timedelta(seconds=seconds)


def covered() -> tuple[datetime, datetime] | None:
    """[rolled_from, rolled_until): the buckets the rollup tables hold, or None."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT rolled_from, rolled_until FROM ingest_rollupmark WHERE name = %s", [MARK]
        )
        row = cur.fetchone()
    return (row[0], row[1]) if row else None


def rollup(*, now: datetime, buckets: int = LOOKBACK_BUCKETS) -> dict[str, int]:
    """Recompute the last `buckets` closed buckets (more after a gap); rows changed per table.

    Returns {} without doing anything while another pass holds the lock: that pass covers
    the same buckets, and a beat that outruns a slow pass must not queue them up.
    """
    end = bucket_floor(now - GRACE)
    start = end - timedelta(seconds=BUCKET_S * buckets)
    written: dict[str, int] = {}
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SELECT pg_try_advisory_xact_lock(%s)", [_LOCK_KEY])
        if not cur.fetchone()[0]:
            return written
        cur.execute(
            "SELECT rolled_from, rolled_until FROM ingest_rollupmark WHERE name = %s", [MARK]
        )
        mark = cur.fetchone()
        start, rolled = _window(start, end, mark)
        cur.execute("SET LOCAL jit = off")  # compiling costs more than it saves here
        cur.execute("SET LOCAL work_mem = '64MB'")  # hash both grouping sets in memory
        params = {
            "start": start,
            "end": end,
            "width": BUCKET_S,
            "epoch": EPOCH,
            "hres": HIST_RESOLUTION,
            "max_bins": MAX_RANK_BINS,
        }
        cur.execute(_DELETE_MISALIGNED_SQL, params)
        cur.execute(_ROLLUP_SQL, params)
        bins, hist = cur.fetchone()
        cur.execute(_MARK_SQL, [MARK, *rolled])
    written["ingest_stepbinrollup"] = bins
    written["ingest_stephistrollup"] = hist
    return written


def _window(
    start: datetime, end: datetime, mark: tuple[datetime, datetime] | None
) -> tuple[datetime, tuple[datetime, datetime]]:
    """Where this pass starts, and the range covered once it commits.

    Coverage must stay contiguous: every bucket in [rolled_from, rolled_until) rolled.
    A pass that follows the last one within CATCH_UP starts where it stopped (if that is
    earlier) and extends the range; otherwise (first pass, or a long outage) it rolls the
    last CATCH_UP and the range restarts there.
    """
    floor = bucket_floor(end - CATCH_UP)
    if mark is None or mark[1] < floor:
        start = min(start, floor)
        return start, (start, end)
    rolled_from, rolled_until = mark
    start = max(min(start, rolled_until), floor)
    if rolled_from > end:  # the clock went back past the whole range: start over
        return start, (start, end)
    return start, (min(rolled_from, start), max(rolled_until, end))


def trim(*, before: datetime) -> int:
    """Delete rollup rows older than `before` (retention, with the raw days); rows removed."""
    removed = 0
    with transaction.atomic(), connection.cursor() as cur:
        for table in ("ingest_stepbinrollup", "ingest_stephistrollup"):
            cur.execute(f"DELETE FROM {table} WHERE bucket < %s", [before])  # noqa: S608
            removed += cur.rowcount
        cur.execute(
            "UPDATE ingest_rollupmark SET rolled_from = greatest(rolled_from, %s) WHERE name = %s",
            [before, MARK],
        )
    return removed
