"""The sorted-input statistics equal the plain ones to the bit (a 16k-rank pass
sorts its 260k step durations once, and the MAD reads them in O(log n))."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from console.diagnosis.records import PHASES, Phases
from console.diagnosis.stats import (
    mad,
    mad_sorted,
    median,
    median_sorted,
    percentile,
    percentile_sorted,
)

# Repeated values, ties at the center and wide ranges are where a bisection goes wrong.
values = st.lists(
    st.one_of(
        st.sampled_from([0.0, 0.1, 0.2, 0.30000000000000004, 1.0, 1e9, -3.0]),
        st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=400, deadline=None)
@given(values, st.one_of(st.none(), st.floats(min_value=-1e6, max_value=1e6)))
def test_mad_of_sorted_values_equals_the_mad_of_their_deviations(
    vals: list[float], center: float | None
) -> None:
    c = median(vals) if center is None else center
    assert mad_sorted(sorted(vals), c) == mad(vals, c)


@settings(max_examples=200, deadline=None)
@given(values, st.floats(min_value=0, max_value=100))
def test_median_and_percentile_of_sorted_values_are_the_plain_ones(
    vals: list[float], q: float
) -> None:
    ordered = sorted(vals)
    assert median_sorted(ordered) == median(vals)
    assert percentile_sorted(ordered, q) == percentile(vals, q)


def test_a_steps_phase_values_are_in_phases_order_with_unreported_as_zero() -> None:
    given_ = {p: float(i + 1) for i, p in enumerate(PHASES) if p != "input"}
    assert Phases(**given_).values == tuple(given_.get(p, 0.0) for p in PHASES)
    assert Phases().values == (0.0,) * len(PHASES)
    assert Phases(compute=1.0) == Phases(compute=1.0)  # derived: not a field of equality
