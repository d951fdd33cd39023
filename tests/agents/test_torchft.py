"""agents.integrations.torchft over a stand-in Manager (no torchft needed here).

What a Manager's decisions become: committed steps, quorum changes as transitions with the
replica group's dp, and pauses (a quorum that keeps the group waiting, a step that did not
commit) as `quiescing`, so a peer replica's drop-out is never read as this group's hang.
"""

from __future__ import annotations

import sys
import time
import types
from concurrent.futures import Future
from datetime import timedelta
from typing import Any

import pytest

from agents import reporter
from agents.integrations import torchft as ft

from .conftest import validate


class Manager:
    """The slice of torchft.Manager the integration reads (torchft 0.2.0's names)."""

    def __init__(self, group_rank: int = 0, world: int = 2) -> None:
        self._group_rank, self._group_world_size = group_rank, world
        self._quorum_id = -1
        self._participants = 0
        self._step = 0
        self._quorum_future: Future[None] | None = None
        self.commit = True

    def num_participants(self) -> int:
        return self._participants

    def current_step(self) -> int:
        return self._step

    def start_quorum(self) -> None:
        self._quorum_future = Future()

    def should_commit(self) -> bool:
        if self.commit:
            self._step += 1
        return self.commit


class Sent:
    """What the integration sent: the reporter's records and the steps it reported."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.steps: list[int] = []

    def moves(self) -> list[tuple[str, Any]]:
        return [(r["to_state"], (r.get("topology") or {}).get("dp") or r["reason"])
                for r in self.records if r["kind"] == "transition"]  # fmt: skip


@pytest.fixture
def sent(monkeypatch: Any) -> Sent:
    out = Sent()
    rep = reporter.Reporter(socket_path="/nonexistent/r.sock", group="rg0", generation=0)
    monkeypatch.setattr(rep, "_send", out.records.append)
    monkeypatch.setattr(reporter, "_default", rep)
    fake_torch = types.SimpleNamespace(report_step=out.steps.append)
    monkeypatch.setitem(sys.modules, "agents.torch", fake_torch)
    monkeypatch.setattr(sys.modules["agents"], "torch", fake_torch, raising=False)
    return out


def _next_step(m: Manager, at: float, *, quorum: int | None = None) -> None:
    """The Manager starts its next step's quorum at monotonic `at`; with `quorum`, that
    quorum has come (its future done) with this id."""
    m.start_quorum()
    ft._state(m).quorum_started = at
    if quorum is not None:
        assert m._quorum_future is not None
        m._quorum_future.set_result(None)
        m._quorum_id = quorum


def test_it_reports_committed_steps_and_each_quorum_change(sent: Sent) -> None:
    m = Manager()
    for quorum, participants in [(1, 1), (1, 1), (2, 2), (2, 2), (2, 1), (2, 2)]:
        m._quorum_id, m._participants = quorum, participants
        ft.observe(m, m.should_commit())
    assert sent.moves() == [("running", 1), ("running", 2), ("running", 1), ("running", 2)]
    assert sent.steps == [1, 2, 3, 4, 5, 6]
    validate(sent.records)


def test_a_step_that_did_not_commit_pauses_the_group_once(sent: Sent) -> None:
    m = Manager()
    m._quorum_id, m._participants = 1, 2
    ft.observe(m, m.should_commit())
    m.commit = False
    ft.observe(m, m.should_commit())
    ft.observe(m, m.should_commit())
    m.commit, m._quorum_id, m._participants = True, 2, 1
    ft.observe(m, m.should_commit())
    assert sent.moves() == [("running", 2), ("quiescing", "step_not_committed"), ("running", 1)]
    assert sent.records[-1]["from_state"] == "quiescing"
    assert sent.steps == [1, 2]  # uncommitted steps are no progress


def test_only_the_replica_groups_rank_zero_sends_transitions(sent: Sent) -> None:
    m = Manager(group_rank=1)
    m._quorum_id, m._participants = 1, 2
    ft.observe(m, m.should_commit())
    m.commit = False
    ft.observe(m, m.should_commit())
    assert sent.moves() == [] and sent.steps == [1]


def test_a_quorum_that_keeps_the_group_waiting_is_a_pause(sent: Sent) -> None:
    m = Manager()
    m.start_quorum()
    state = ft._state(m)
    state.quorum_started = time.monotonic()
    ft._QuorumWatch.check(m, now=state.quorum_started + 10)
    assert sent.moves() == []  # before the first commit: start-up waits for its peers
    m._quorum_id, m._participants = 1, 2
    ft.observe(m, m.should_commit())
    m.start_quorum()
    state.quorum_started = 100.0
    ft._QuorumWatch.check(m, now=100.0 + ft.QUORUM_WAIT_S / 2)
    assert sent.moves() == [("running", 2)]  # not yet
    ft._QuorumWatch.check(m, now=100.0 + ft.QUORUM_WAIT_S)
    ft._QuorumWatch.check(m, now=100.0 + 2 * ft.QUORUM_WAIT_S)
    assert sent.moves() == [("running", 2), ("quiescing", "awaiting_quorum")]
    assert m._quorum_future is not None
    m._quorum_future.set_result(None)
    m._quorum_id, m._participants = 2, 1
    ft.observe(m, m.should_commit())
    ft._QuorumWatch.check(m, now=100.0 + 10)  # the quorum came: no pause
    assert sent.moves()[-1] == ("running", 1)


def test_a_new_quorums_first_step_that_keeps_the_group_waiting_is_a_pause(sent: Sent) -> None:
    """The quorum came (a replica rejoined) but its first step waits on the peer that heals
    and warms up: a pause. A slow step in the quorum the group already committed in is not
    excused: that one the engine judges."""
    m = Manager()
    m.start_quorum()
    m._quorum_id, m._participants = 1, 1
    ft.observe(m, m.should_commit())
    # Same quorum, step slow after its quorum came: no pause.
    _next_step(m, 100.0, quorum=1)
    ft._QuorumWatch.check(m, now=100.0 + 10 * ft.QUORUM_WAIT_S)
    assert sent.moves() == [("running", 1)]
    ft.observe(m, m.should_commit())
    # A new quorum (the rejoined peer in it): waiting past QUORUM_WAIT_S is a pause, once.
    _next_step(m, 200.0, quorum=2)
    ft._QuorumWatch.check(m, now=200.0 + ft.QUORUM_WAIT_S / 2)
    assert sent.moves() == [("running", 1)]  # not yet
    ft._QuorumWatch.check(m, now=200.0 + ft.QUORUM_WAIT_S)
    ft._QuorumWatch.check(m, now=200.0 + 5 * ft.QUORUM_WAIT_S)
    assert sent.moves() == [("running", 1), ("quiescing", "reconfiguring")]
    m._participants = 2
    ft.observe(m, m.should_commit())  # its first step commits: running in the new quorum
    ft._QuorumWatch.check(m, now=200.0 + 10 * ft.QUORUM_WAIT_S)
    assert sent.moves() == [("running", 1), ("quiescing", "reconfiguring"), ("running", 2)]
    assert sent.records[-1]["from_state"] == "quiescing"
    validate(sent.records)


@pytest.mark.parametrize("reconfiguring", [False, True])
def test_a_pause_past_torchfts_own_bounds_gives_the_silence_back(
    sent: Sent, reconfiguring: bool
) -> None:
    """TorchFT bounds a step's waits (quorum_timeout, then its timeout for recovery and the
    collectives): a pause longer than that is this replica stuck, not its peers. The group
    is running again, once, so the engine judges the silence; the next step may pause."""
    m = Manager()
    m._timeout, m._quorum_timeout = timedelta(seconds=10), timedelta(seconds=30)
    assert ft.bound_s(m) == 30 + 2 * 10 + ft.OVERRUN_SLACK_S
    m.start_quorum()
    m._quorum_id, m._participants = 1, 2
    ft.observe(m, m.should_commit())
    _next_step(m, 100.0, quorum=2 if reconfiguring else None)
    paused = ("quiescing", "reconfiguring" if reconfiguring else "awaiting_quorum")
    ft._QuorumWatch.check(m, now=100.0 + ft.QUORUM_WAIT_S)
    ft._QuorumWatch.check(m, now=100.0 + ft.bound_s(m) - 0.1)
    assert sent.moves() == [("running", 2), paused]  # still inside TorchFT's bounds
    for late in (0.0, 1.0, 60.0):
        ft._QuorumWatch.check(m, now=100.0 + ft.bound_s(m) + late)
    assert sent.moves() == [("running", 2), paused, ("running", "pause_overran")]
    assert sent.records[-1]["from_state"] == "quiescing"
    # The stuck step commits after all; the next one may pause again.
    assert m._quorum_future is not None
    if not m._quorum_future.done():
        m._quorum_future.set_result(None)
    ft.observe(m, m.should_commit())
    _next_step(m, 500.0)
    ft._QuorumWatch.check(m, now=500.0 + ft.QUORUM_WAIT_S)
    assert sent.moves()[-1] == ("quiescing", "awaiting_quorum")
    validate(sent.records)


def test_torchfts_defaults_bound_a_pause_when_the_manager_names_none() -> None:
    assert ft.bound_s(Manager()) == 3 * ft.DEFAULT_TIMEOUT_S + ft.OVERRUN_SLACK_S


def test_install_wraps_the_managers_calls_once_and_keeps_their_answers(
    sent: Sent,
) -> None:
    module = types.SimpleNamespace(Manager=type("M", (Manager,), {}))
    ft.install(module)  # type: ignore[arg-type]  # a stand-in module, not torchft
    ft.install(module)  # type: ignore[arg-type]  # a stand-in module, not torchft
    m = module.Manager()
    m.start_quorum()
    m._quorum_id, m._participants = 1, 2
    assert m.should_commit() is True
    m.commit = False
    assert m.should_commit() is False
    assert sent.moves() == [("running", 2), ("quiescing", "step_not_committed")]
    assert ft._state(m).quorum_started is not None
    ft._state(m).overran = True
    m.start_quorum()  # a new step: its own pause, whatever the last one did
    assert ft._state(m).overran is False


def test_a_failing_report_never_reaches_the_training_loop(sent: Sent) -> None:
    module = types.SimpleNamespace(Manager=type("M", (Manager,), {}))
    ft.install(module)  # type: ignore[arg-type]  # a stand-in module, not torchft
    m = module.Manager()

    def broken() -> int:
        raise RuntimeError("the Manager's internals moved")

    m.num_participants = broken  # type: ignore[method-assign]  # a broken method on purpose
    assert m.should_commit() is True
    assert sent.records == []
