"""Silence after a telemetry outage: a node replaying its spool has not delivered its
newest steps yet, and its ranks must not be paged as stalled for that (issue 23)."""

from __future__ import annotations

from datetime import timedelta

from console.diagnosis import diagnose
from tests.diagnosis.factory import T0, heartbeats, snap, training

RANKS = 16  # two nodes


def _paged(now_s: float, delivered_s: float) -> set[str]:
    """Steps until T0; each node's newest delivered record at T0 + delivered_s."""
    now = T0 + timedelta(seconds=now_s)
    nodes = heartbeats(RANKS, T0 + timedelta(seconds=delivered_s))
    d = diagnose(snap(training(ranks=RANKS), nodes=nodes), now)
    return {f.kind for f in d.findings}


def test_a_node_still_replaying_its_spool_is_not_a_stalled_group() -> None:
    # The service is back 10 s after the last stored step; the agents' spools still hold
    # the outage's steps: what they delivered ends where the stored steps end.
    assert not {"group_stall", "rank_hang"} & _paged(now_s=10, delivered_s=0)


def test_a_node_that_delivered_up_to_now_without_steps_is_a_stalled_group() -> None:
    # Same silence, but the agents have delivered everything up to now: it is a stall.
    assert "group_stall" in _paged(now_s=10, delivered_s=9.5)


def test_a_replay_that_caught_up_judges_silence_from_the_delivered_records() -> None:
    # Delivered up to 8 s after the last step (the spool's heartbeats are in): stalled.
    assert "group_stall" in _paged(now_s=20, delivered_s=8)


def test_past_the_heartbeat_timeout_the_silent_nodes_are_down() -> None:
    # The deferral ends at the heartbeat timeout: silent nodes whose ranks stopped are down.
    assert "node_down" in _paged(now_s=60, delivered_s=0)
