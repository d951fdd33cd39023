"""MTBF, MTTR and ETTR rest on the exposure the fleet reported, not on the window asked for."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from console.diagnosis.reliability import (
    MIN_ETTR_EXPOSURE_H,
    MIN_MTBF_EXPOSURE_H,
    Exposure,
    GroupSpan,
    Interruption,
    fleet_report,
    markdown,
)

H = 3600.0


def _stop(n: int, at: float, node: str = "n0") -> Interruption:
    return Interruption(incident=n, group="g", generation=n, kind="xid", layer="gpu", opened=at,
                        restarted=True, node=node, downtime_s=60.0)  # fmt: skip


def _report(exposure: Exposure, stops: int, *, days: float = 30.0) -> dict:
    end = days * 24 * H
    return fleet_report(
        [_stop(n, end - (n + 1) * 60.0) for n in range(stops)],
        [GroupSpan("g", "training", 16, end - 2 * H, end)],
        start=0.0, end=end, exposure=exposure,
    )  # fmt: skip


def test_it_shows_no_mtbf_for_a_fleet_that_reported_for_three_minutes() -> None:
    seen = Exposure(observed_hours=0.05, gpu_hours=0.05 * 128, node_hours=0.05 * 16,
                    per_node_hours={"n0": 0.05})  # fmt: skip
    r = _report(seen, 1)
    assert r["mtbf_hours"] is None and r["mtbf_gpu_hours"] is None and r["mtbf_node_hours"] is None
    assert r["mtbf_note"] == "not enough exposure"
    assert r["by_layer"][0]["mtbf_hours"] is None
    assert r["per_node"][0] == {"node": "n0", "interruptions": 1, "node_hours": 0.05,
                                "mtbf_hours": None, "mtbf_note": "not enough exposure"}  # fmt: skip
    assert r["exposure"]["observed_hours"] == 0.05 and r["exposure"]["gpu_hours"] == 6.4
    assert "MTBF fleet-wide: not enough exposure (over 0.05 h)" in markdown(r)


def test_it_divides_each_exposure_by_the_interruptions_once_there_is_a_day_of_it() -> None:
    seen = Exposure(observed_hours=48.0, gpu_hours=48.0 * 128, node_hours=48.0 * 16,
                    per_node_hours={"n0": 48.0})  # fmt: skip
    r = _report(seen, 4)
    assert (r["mtbf_hours"], r["mtbf_gpu_hours"], r["mtbf_node_hours"]) == (12.0, 1536.0, 192.0)
    assert r["mtbf_note"] is None
    assert r["per_node"][0]["mtbf_hours"] == 12.0 and r["per_node"][0]["node_hours"] == 48.0
    assert "MTBF fleet-wide: 12 h (over 48 h)" in markdown(r)


@given(st.floats(min_value=0.0, max_value=100.0))
def test_the_minimum_is_where_a_rate_starts(hours: float) -> None:
    r = _report(Exposure(observed_hours=hours, gpu_hours=hours * 8, node_hours=hours,
                         per_node_hours={"n0": hours}), 2)  # fmt: skip
    shown = hours >= MIN_MTBF_EXPOSURE_H
    assert (r["mtbf_hours"] is not None) is shown
    assert (r["per_node"][0]["mtbf_hours"] is not None) is shown
    assert r["mtbf_note"] == (None if shown else "not enough exposure")


@settings(max_examples=30)
@given(st.floats(min_value=3.0, max_value=365.0))
def test_the_window_asked_for_changes_no_rate(days: float) -> None:
    seen = Exposure(observed_hours=30.0, gpu_hours=240.0, node_hours=30.0,
                    per_node_hours={"n0": 30.0})  # fmt: skip
    r = _report(seen, 3, days=days)
    assert (r["mtbf_hours"], r["mtbf_gpu_hours"], r["per_node"][0]["mtbf_hours"]) == (
        10.0,
        80.0,
        10.0,
    )


def test_enough_exposure_without_an_interruption_says_so() -> None:
    r = _report(Exposure(observed_hours=72.0, gpu_hours=576.0, node_hours=72.0), 0)
    assert r["mtbf_hours"] is None and r["mtbf_note"] == "no interruption"


def test_an_ettr_needs_an_hour_of_its_group() -> None:
    end = 30 * 24 * H
    for ran_h, shown in ((MIN_ETTR_EXPOSURE_H, True), (0.05, False)):
        r = fleet_report([], [GroupSpan("g", "training", 8, end - ran_h * H, end)],
                         start=0.0, end=end, exposure=Exposure())  # fmt: skip
        group = r["per_group"][0]
        assert (group["ettr"] is not None, r["ettr"] is not None) == (shown, shown)
        assert group["ettr_note"] == (None if shown else "not enough exposure")
        assert group["gpu_hours"] == round(8 * ran_h, 3)
