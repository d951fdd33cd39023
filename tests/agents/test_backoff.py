"""The sender's retry schedule, run for a whole fleet that lost the service at once.

Simulated: each agent fails its first try when the outage starts (half of them on a
request in flight, which takes the sender's timeout to fail), then retries on
`backoff_delay`; a try at or after the link's return arrives. The measure is the lossy-link
system test's (faultline.drill.spread): the busiest second of the recovery over its mean.
"""

from __future__ import annotations

import inspect
import random

import pytest

from agents.sender import Sender, backoff_delay
from faultline.drill.spread import peak_to_mean, per_second

_DEFAULTS = inspect.signature(Sender).parameters
BASE = _DEFAULTS["backoff_base"].default
CAP = _DEFAULTS["backoff_cap"].default
TIMEOUT = _DEFAULTS["timeout"].default


def _first_tries(outage_s, agents, seed, *, base=BASE, cap=CAP, schedule=backoff_delay,
                 in_flight=0.5, send_interval=2.0):  # fmt: skip
    """Seconds after the link's return at which each agent's first try after it starts."""
    rng = random.Random(seed)
    out = []
    for _ in range(agents):
        t = rng.uniform(0, send_interval)  # where in its send interval the outage found it
        took = TIMEOUT if rng.random() < in_flight else 0.0  # a request in flight times out
        failures = 0
        while t < outage_s:
            failures += 1
            t += took + schedule(failures, base, cap, rng)
            took = 0.0  # later tries fail at once: no route, or connection refused
        out.append(t - outage_s)
    return out


@pytest.mark.parametrize("outage_s", [45, 60, 120, 600])
@pytest.mark.parametrize("in_flight", [0.0, 0.5, 1.0])
def test_it_spreads_a_fleets_return_so_no_second_carries_twice_the_mean(outage_s, in_flight):
    # Outages past the cap (30 s): at exactly one cap the ramp's last short waits are still
    # ending as the link returns, and the busiest second measured 1.48-2.01.
    ratio = peak_to_mean(_first_tries(outage_s, 10_000, outage_s, in_flight=in_flight), CAP)
    assert ratio <= 2.0, ratio
    assert ratio <= 1.9, ratio  # measured 1.47-1.88 over these outages


@pytest.mark.parametrize(("base", "cap"), [(0.25, 4.0), (0.1, 4.0), (1.0, 60.0)])
def test_the_spread_holds_at_other_scales(base, cap):
    # (0.25, 4): the lossy-link system test's schedule, scaled so 64 agents fill its seconds.
    for outage_s in (10 * cap, 20 * cap):
        ratio = peak_to_mean(_first_tries(outage_s, 10_000, 1, base=base, cap=cap), cap)
        assert ratio <= 1.85, (base, cap, outage_s, ratio)


def test_sixty_four_agents_on_the_system_tests_schedule_rarely_reach_twice_the_mean():
    # 64 arrivals in 1-second bins are few: Poisson noise alone lifts the busiest second.
    # On a 4 s cap each second holds ~16 (the system test's choice); on the 30 s default,
    # ~2, and the busiest second is near 2.7x the mean for any random schedule.
    over = [
        seed
        for seed in range(200)
        if peak_to_mean(_first_tries(60, 64, seed, base=0.25, cap=4.0, in_flight=0.0), 4.0) > 2.0
    ]
    assert len(over) <= 4, over


def _lockstep(failures, base, cap, rng):
    return min(cap, base * 2**failures)


def _full_jitter_from_zero(failures, base, cap, rng):
    return rng.uniform(0, min(cap, base * 2**failures))


def test_the_measure_flags_a_fleet_that_retries_in_lockstep():
    ratio = peak_to_mean(_first_tries(60, 10_000, 3, schedule=_lockstep, in_flight=0.0), CAP)
    assert ratio > 10, ratio


def test_full_jitter_from_zero_at_the_cap_front_loads_the_return():
    # Why the cap's waits come from its upper half: the return's first seconds carry the
    # rest of every wait in progress, and long waits are more often the one in progress.
    offsets = _first_tries(600, 20_000, 4, schedule=_full_jitter_from_zero, in_flight=0.0)
    bins = per_second(offsets)
    assert peak_to_mean(offsets, CAP) > 1.85
    assert sum(bins[:5]) > 2.5 * sum(bins[-8:-3])  # front against back, same width


@pytest.mark.parametrize("failures", range(1, 25))
def test_each_wait_stays_inside_its_bounds(failures):
    rng = random.Random(failures)
    waits = [backoff_delay(failures, 0.5, 30.0, rng) for _ in range(2000)]
    ceiling = 0.5 * 2**failures
    if ceiling >= 30.0:
        assert min(waits) >= 15.0 and max(waits) <= 30.0
    else:
        assert min(waits) >= 0.25 and max(waits) <= max(0.5, ceiling)
    assert max(waits) - min(waits) > 0.4 * (min(30.0, ceiling) - 0.25)  # never a fixed wait


def test_two_agents_that_failed_together_do_not_retry_together():
    rng = random.Random(5)
    a = b = 0.0
    apart = []
    for failures in range(1, 12):
        a += backoff_delay(failures, BASE, CAP, rng)
        b += backoff_delay(failures, BASE, CAP, rng)
        apart.append(abs(a - b))
    assert min(apart[5:]) > 1.0, apart


def test_the_measure_counts_from_the_first_second_to_the_last_arrival_it_keeps():
    assert per_second([0.1, 0.9, 1.5, 4.2]) == [2, 1, 0, 0, 1]
    assert peak_to_mean([0.1, 0.9, 1.5, 4.2]) == 2 / (4 / 5)
    # The last 5 % of a fleet (TCP's own retransmissions behind a lossy link) is not the
    # recovery's length: 19 agents over 2 s and one 15 s later.
    assert peak_to_mean([0.2] * 10 + [1.2] * 9 + [15.0]) == 10 / (19 / 2)
    assert peak_to_mean([3.0] * 10) == 10 / (10 / 4)  # all late: a quiet start counts
    assert peak_to_mean([]) == 0.0
    assert per_second([-0.5, 0.2]) == [2]
    assert per_second([0.5, 0.7], window_s=3) == [2, 0, 0]  # a herd is not a short recovery
    assert peak_to_mean([0.5, 0.7], window_s=30) == 30.0
