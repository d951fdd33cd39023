"""Silence after a telemetry outage: a node replaying its spool has not delivered its
newest steps yet, and its ranks must not be paged as stalled for that."""

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


def _stopped_group(now_s: float, late_s: float, hung: int | None = None) -> list[tuple[str, str]]:
    """Every rank stepped until T0 (or, with `hung`, the others step until now and rank
    `hung` stopped at T0); the first node's newest record is half a second old, the
    second's `late_s` old: the ordinary lag of an agent sending every 5 s (the shipped
    send_interval)."""
    now = T0 + timedelta(seconds=now_s)
    if hung is None:
        records = training(ranks=RANKS)
    else:
        records = [
            r for r in training(ranks=RANKS, end=now, steps=40)
            if not (r.get("rank") == hung and r["kind"] == "step" and r["ts"] > T0)
        ]  # fmt: skip
    nodes = heartbeats(RANKS, now - timedelta(seconds=0.5))
    nodes[sorted(nodes)[1]] = now - timedelta(seconds=late_s)
    d = diagnose(snap(records, nodes=nodes), now)
    return sorted((f.kind, f.subject) for f in d.findings)


def test_a_group_that_stopped_as_one_is_not_paged_rank_by_rank_beside_a_late_node() -> None:
    """Found at 16k ranks (bench/detect.py): past the threshold, the up-to-date nodes'
    ranks were each called hung (a root cause per rank, 128 incidents) while a node that
    had not delivered for 4.5 s kept its ranks unjudged."""
    for now_s in (5.0, 6.0, 7.0, 8.0):
        found = _stopped_group(now_s, late_s=4.5)
        assert not [f for f in found if f[0] == "rank_hang"], (now_s, found)
    # Once the late node's records say its ranks stopped too: one stall of the group.
    assert [k for k, _ in _stopped_group(9.0, late_s=4.5)] == ["group_stall"]


def test_a_rank_that_stopped_while_its_peers_step_is_hung_beside_a_late_node() -> None:
    found = _stopped_group(10.0, late_s=4.5, hung=3)
    assert found == [("rank_hang", "rank:llama-70b/3")]
