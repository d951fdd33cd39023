"""bench/scale_goals.py reads the benches' summary lines; a figure it cannot find is
missing, never met. The lines below were copied from a real run of
`python bench/scale_goals.py --ranks 1024 --trials 2 --page-runs 5` (2026-12-06)."""

from __future__ import annotations

from bench import scale_goals

INGEST = """\
gunicorn  records/s     19320  batches/s   153.8  p50_ms   47.6  p99_ms  122.5  errors 0  ratio 0.16
[steady] records/s 19320 p99_ms 123 ratio 0.16
[backlog] records/s 53164 p99_ms 497 ratio 0.52
records/s 53164 p99_ms 497 ratio 0.52
"""
DETECT = (
    "scale_ranks 1024 explicit_p99_s 0.15 silent_p99_s 3.94 straggler_steps_max 5 "
    "false_hangs 0 pass_mean_ms 70 worker_cpu_per_s 0.13\n"
)
PAGE = """\
tree   round     p50     p95    data     sql    rest     cpu  pg cpu    size   gzip |     p50
this       1    30.9    32.5    24.0    17.0     7.0    14.8    16.0   351.0   24.4 |    28.9
this       2    31.0   312.0    24.0    17.0     7.0    14.8    16.0   351.0   24.4 |    28.9
"""


def test_each_goal_is_read_from_its_bench_summary_line() -> None:
    steady, backlog = scale_goals.ingest_goals(INGEST)
    assert (steady.figure, steady.met) == (0.16, False)
    assert (backlog.figure, backlog.met) == (0.52, True)
    xid, hang, straggler, false_hangs = scale_goals.detect_goals(DETECT, step_s=1.0)
    assert (xid.figure, xid.met) == (0.15, True)
    assert (hang.figure, hang.limit, hang.met) == (3.94, 6.0, True)
    assert (straggler.figure, false_hangs.figure) == (5, 0)
    # The worst round's p95 decides: one round over 300 ms is not met.
    (page,) = scale_goals.page_goals(PAGE)
    assert (page.figure, page.met) == (312.0, False)


def test_a_goal_a_bench_did_not_print_is_missing_not_met() -> None:
    assert all(g.met is None for g in scale_goals.ingest_goals("Traceback ...\n"))
    assert all(g.met is None for g in scale_goals.detect_goals("", step_s=2.0))
    # A trial kind that did not run prints "-": missing, not zero seconds.
    no_silent = DETECT.replace("silent_p99_s 3.94", "silent_p99_s -")
    assert scale_goals.detect_goals(no_silent, step_s=1.0)[1].met is None
    # A slower step raises the hang goal: max(3 x step, 5 s) + 1 s.
    assert scale_goals.detect_goals(DETECT, step_s=2.0)[1].limit == 7.0
    assert "MISSING" in scale_goals.page_goals("")[0].line()
