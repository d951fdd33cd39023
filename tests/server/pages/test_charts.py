"""console.charts: binning, series and tables for the pages, on plain rows (no database)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from console import charts

T0 = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)


def test_it_caps_rank_bins_at_256_for_a_16k_rank_group():
    assert charts.rank_bins(16_384) == 256 and charts.rank_block(16_384) == 64
    assert charts.rank_bins(8) == 8 and charts.rank_block(8) == 1


def test_it_bins_ranks_in_whole_power_of_two_blocks():
    # 1000 ranks: blocks of 4 (2 would need 500 rows), so 250 rows, the last one full.
    assert (charts.rank_block(1000), charts.rank_bins(1000)) == (4, 250)
    assert (charts.rank_block(16_385), charts.rank_bins(16_385)) == (128, 129)


def test_it_labels_rank_bins_with_the_edges_the_sql_uses():
    world = 1000
    bins, block = charts.rank_bins(world), charts.rank_block(world)
    labels = charts.rank_bin_labels(world, bins)
    for rank in (0, 3, 4, 999, 517):
        lo, _, hi = labels[rank // block][1:].partition("-")  # the SQL's integer division
        assert int(lo) <= rank <= int(hi or lo)
    assert labels[-1] == "r996-999"


def test_it_keeps_at_most_120_time_bins_over_a_long_window():
    grid = charts.time_grid(T0, T0 + timedelta(hours=2))
    assert grid.bins <= 120
    assert grid.start + grid.bins * grid.width_s >= (T0 + timedelta(hours=2)).timestamp()


def test_it_never_makes_bins_narrower_than_a_second():
    grid = charts.time_grid(T0, T0 + timedelta(seconds=30))
    assert grid.width_s == 1.0 and grid.bins == 31


def test_it_aligns_time_bins_to_whole_rollup_buckets():
    first = T0 + timedelta(seconds=3.2)
    grid = charts.time_grid(first, first + timedelta(seconds=71), step_s=5)
    assert (grid.start, grid.width_s, grid.bins) == (T0.timestamp(), 5, 15)
    ten_minutes = charts.time_grid(T0, T0 + timedelta(seconds=599.9), step_s=5)
    assert (ten_minutes.width_s, ten_minutes.bins) == (5, 120)
    longer = charts.time_grid(T0, T0 + timedelta(seconds=600), step_s=5)
    assert longer.width_s == 10 and longer.bins == 61 and longer.start % 10 == 5


def test_it_places_cells_and_leaves_missing_ones_empty():
    grid = charts.time_grid(T0, T0 + timedelta(seconds=2))
    hm = charts.heatmap([(0, 0, 1000.04), (1, 2, 1600.0)], world=2, bins=2, grid=grid)
    assert hm["z"] == [[1000.0, None, None], [None, None, 1600.0]]
    assert hm["y"] == ["r0", "r1"] and len(hm["x"]) == 3


def test_it_computes_the_tail_ratio_as_p99_over_median():
    grid = charts.time_grid(T0, T0 + timedelta(seconds=5))
    series = charts.percentile_series([(1, 1000.0, 1100.0, 1500.0, 64), (0, 0, 0, 0, 1)], grid=grid)
    assert series["rho"] == [None, 1.5]
    assert series["n"] == [1, 64]


def test_it_puts_the_group_median_before_the_slowest_ranks():
    out = charts.slowest_phases([(7, 1600.0, 1120.0, 250.0, 40.0, 0.0, 10.0)], {"compute": 700.0})
    assert out["ranks"] == ["median", "r7"]
    assert out["phases"]["compute"] == [700.0, 1120.0]


def test_it_marks_the_newest_valid_checkpoint_and_a_corrupt_one():
    rows = [
        {"ts": T0, "checkpoint_id": "a", "step": 10, "phase": "committed", "generation": 1},
        {"ts": T0 + timedelta(seconds=5), "checkpoint_id": "b", "step": 20, "phase": "committed",
         "generation": 1},
        {"ts": T0 + timedelta(seconds=6), "checkpoint_id": "b", "step": 20, "phase": "corrupt",
         "generation": 1},
        {"ts": T0 + timedelta(seconds=7), "checkpoint_id": "c", "step": 30, "phase": "staging",
         "generation": 1},
    ]  # fmt: skip
    table = {r["id"]: r for r in charts.checkpoint_table(rows, newest_valid="a")}
    assert (table["a"]["valid"], table["a"]["newest_valid"]) == (True, True)
    assert table["b"]["valid"] is False and table["b"]["phase"] == "corrupt"
    assert table["c"]["valid"] is None
    assert [r["id"] for r in charts.checkpoint_table(rows, "a")] == ["c", "b", "a"]


def test_it_segments_states_and_flags_a_new_generation():
    rows = [
        {"ts": T0, "generation": 1, "from_state": None, "to_state": "running"},
        {"ts": T0 + timedelta(seconds=60), "generation": 2, "from_state": "recovering",
         "to_state": "running", "restart_count": 1},
    ]  # fmt: skip
    segs = charts.state_segments(rows, now=T0 + timedelta(seconds=90))
    assert [s["duration_s"] for s in segs] == [60.0, 30.0]
    assert [s["new_generation"] for s in segs] == [False, True]
    assert segs[-1]["end"] is None


def test_it_colours_a_node_by_its_worst_gpu():
    node = {"health": "ok", "devices": [{"health": "ok"}, {"health": "critical"}]}
    assert charts.worst_health(node) == "critical"
    assert charts.worst_health({"health": "down", "devices": [{"health": "warning"}]}) == "down"


def test_it_folds_symptoms_by_kind_with_the_reason_they_are_suppressed():
    symptoms = [{"kind": "rank_hang", "active": True}] * 3 + [{"kind": "collective_timeout"}]
    folds = charts.symptom_groups(symptoms, root_kind="xid", root_subject="gpu:GPU-1")
    assert [(f["kind"], f["count"]) for f in folds] == [("rank_hang", 3), ("collective_timeout", 1)]
    assert folds[0]["reason"] == "explained by root cause xid on gpu:GPU-1"


def test_it_caps_long_evidence_lists_and_says_how_many_are_hidden():
    rows = charts.evidence_rows({"ranks": list(range(25)), "loss": float("nan")}, max_items=20)
    assert rows[0]["value"].endswith("(5 more)")
    assert rows[1] == {"key": "loss", "value": "nan"}


def test_it_orders_timeline_marks_and_comments_by_time():
    marks = {"detected": "2026-11-29T10:00:05+00:00", "first_evidence": "2026-11-29T10:00:00+00:00"}
    comments = [{"author": "op", "at": "2026-11-29T10:00:03+00:00", "body": "looking"}]
    assert [e["label"] for e in charts.timeline(marks, comments)] == [
        "first evidence",
        "op",
        "detected",
    ]


def test_it_splits_wall_time_into_productive_and_badput_by_cause():
    out = charts.badput({"wall_s": 100.0, "productive_fraction": 0.8,
                         "badput_s": {"restart": 15.0, "stall": 5.0}})  # fmt: skip
    assert out["causes"] == ["stall", "restart"] and out["productive_s"] == 80.0


def test_it_reads_percentiles_from_a_log_histogram_within_one_percent():
    res = 48
    durations = [1000.0] * 98 + [1600.0] * 2
    rows: dict[int, int] = {}
    for d in durations:
        hb = math.floor(math.log(d) * res)
        rows[hb] = rows.get(hb, 0) + 1
    ((tb, p50, _p90, p99, n),) = charts.histogram_percentiles(
        [(3, hb, c) for hb, c in rows.items()], resolution=res
    )
    assert (tb, n) == (3, 100)
    assert abs(p50 - 1000.0) / 1000.0 < 0.011 and abs(p99 - 1600.0) / 1600.0 < 0.011


def test_it_finds_the_bin_of_a_persistent_straggler():
    cells = [(b, t, 1600.0 if b == 5 else 1000.0 + t) for b in range(16) for t in range(10)]
    assert charts.slowest_bins(cells, count=1) == [5]


def test_it_inverts_rank_binning_exactly():
    world = 1000
    members = charts.ranks_in_bins([3, 249], world=world)
    assert members == [r for r in range(world) if r // charts.rank_block(world) in (3, 249)]


def test_it_writes_evidence_numbers_and_times_in_the_console_format():
    rows = charts.evidence_rows({
        "goodput": 22090.181, "ratio": 1.0526315, "count": 12345,
        "at": "2026-12-06T21:25:38.478510+00:00",
        "window": {"started_ts": "2026-12-06T21:25:38.478510+00:00", "ms": 850.12345},
    })  # fmt: skip
    by_key = {r["key"]: r for r in rows}
    assert by_key["goodput"]["value"] == "22,090" and by_key["ratio"]["value"] == "1.053"
    assert by_key["count"]["value"] == "12345"  # an integer is shown exactly (an id, a count)
    assert by_key["at"]["at"] == "2026-12-06T21:25:38.478510+00:00"  # the page writes it relative
    assert by_key["window"]["value"] == '{"ms": 850.1, "started_ts": "2026-12-06 21:25:38 UTC"}'


def _position(scale: dict, value: float) -> float:
    return (value - scale["zmin"]) / (scale["zmax"] - scale["zmin"])


@given(st.permutations([850.0, 851.5, 852.0, 853.0, 855.5, 858.0, 850.5, 857.0]))
def test_a_healthy_group_one_percent_apart_is_one_colour(cells):
    scale = charts.step_scale(cells, {"median": 852.0, "limit": 1065.0})
    stops = dict((colour, at) for at, colour in scale["colorscale"])
    healthy, limit = stops[charts.SCALE_COLOURS[1]], stops[charts.SCALE_COLOURS[2]]
    # Every cell sits within a twentieth of the way from healthy to the straggler limit.
    assert all(abs(_position(scale, v) - healthy) <= 0.05 * (limit - healthy) for v in cells)
    assert scale["source"] == "diagnosis" and scale["zmax"] >= 1065.0 >= scale["zmin"]


def test_a_straggler_past_the_groups_limit_is_past_the_limit_colour():
    cells = [850.0, 852.0, 851.0, 1530.0]  # one rank at 1.8x: the demo's thermal straggler
    scale = charts.step_scale(cells, {"median": 852.0, "limit": 1065.0})
    limit_at = next(at for at, colour in scale["colorscale"] if colour == charts.SCALE_COLOURS[2])
    assert _position(scale, 1530.0) > limit_at and _position(scale, 852.0) < limit_at
    assert scale["zmax"] >= 1530.0  # the straggler is inside the scale, not clipped


def test_it_scales_to_the_default_ratio_before_the_group_is_diagnosed():
    for diagnosed in (None, {}, {"median": 0, "limit": 0}, {"median": 900.0, "limit": 800.0}):
        scale = charts.step_scale([100.0, 101.0, 102.0], diagnosed)
        assert scale["source"] == "chart" and scale["median_ms"] == 101.0
        assert scale["limit_ms"] == round(101.0 * charts.STRAGGLER_RATIO, 1)
    assert charts.step_scale([None, float("nan")]) is None
