"""TorchFT: each replica group a Faultline consistency group, its quorum the DP degree.

Owns reporting what a `torchft.Manager` decides, from its own calls: a committed step
(`should_commit()` true: step = the Manager's `current_step()`, with the rank's collective
window through agents.torch), the quorum the replica group trains in (a `running`
transition, reason `quorum_change`, topology `dp` = replicas participating, whenever the
quorum or its participants change), and a pause: a quorum that keeps the group waiting
longer than QUORUM_WAIT_S (the lighthouse waits out a dead peer's heartbeat timeout, 5 s by
default) or a step that did not commit (a peer failed mid-step, too few replicas) puts the
group in `quiescing` until a step commits again, so its silence is not read as a hang; so
does a new quorum whose first step keeps the group waiting longer than QUORUM_WAIT_S (the
peers that joined it heal, then run their first step). A pause is bounded by TorchFT's own
timeouts for the step's waits (`bound_s`): past them the group is `running` again (reason
`pause_overran`) and its silence is the engine's to judge. A
replica group that drops out and rejoins is its own group's failure and restart (its
launcher reports them); to the others it is a quorum change, never an incident. Group,
generation and rank are the replica group's own (its launcher's: agents.launcher_env):
each replica group is a fault domain of its own.

torchft is imported only by `install()` when no module is passed (agents.launch passes the
one the program imported). It must never raise into the training loop.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
import weakref
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from agents import reporter

QUORUM_CHANGE = "quorum_change"
AWAITING_QUORUM = "awaiting_quorum"
RECONFIGURING = "reconfiguring"
NOT_COMMITTED = "step_not_committed"
PAUSE_OVERRAN = "pause_overran"
# A quorum pending this long (after the group's first committed step) is a pause: well
# inside the diagnosis engine's 4 s floor for calling a silent rank hung.
QUORUM_WAIT_S = 1.0
WATCH_EVERY_S = 0.25
# TorchFT bounds every wait of a step: the quorum by the Manager's quorum_timeout, the
# recovery and the collectives by its timeout (60 s each by default). A pause past those
# (plus this slack) is no longer TorchFT waiting on its peers: this replica is stuck, and
# its silence goes back to the engine.
OVERRUN_SLACK_S = 5.0
DEFAULT_TIMEOUT_S = 60.0
_MARK = "__faultline__"


@dataclass
class QuorumState:
    """What one Manager last told Faultline, and the quorum it waits for."""

    quorum_id: int | None = None
    participants: int | None = None
    quiescing: bool = False
    quorum_started: float | None = None  # monotonic, when start_quorum was called
    overran: bool = False  # this step's pause outlasted TorchFT's bounds: no new pause


def _state(manager: Any) -> QuorumState:
    state: QuorumState = manager.__dict__.setdefault("_faultline_quorum", QuorumState())
    return state


def _call(manager: Any, name: str) -> Any:
    fn = getattr(manager, name, None)
    return fn() if callable(fn) else None


def _lead(manager: Any) -> bool:
    """Transitions come from the replica group's rank 0 only: one per group."""
    return getattr(manager, "_group_rank", 0) == 0


def _seconds(manager: Any, name: str) -> float:
    value = getattr(manager, name, None)
    seconds = getattr(value, "total_seconds", None)
    return float(seconds()) if callable(seconds) else DEFAULT_TIMEOUT_S


def bound_s(manager: Any) -> float:
    """How long TorchFT itself lets one step wait on its peers: the quorum, then recovery
    and the step's collectives, each within its own timeout."""
    return (
        _seconds(manager, "_quorum_timeout") + 2 * _seconds(manager, "_timeout") + OVERRUN_SLACK_S
    )


def pause(manager: Any, reason: str) -> None:
    """The replica group stopped committing (once per pause)."""
    state = _state(manager)
    if state.overran:
        return  # this step already outlasted TorchFT's bounds: its silence is not a pause
    if not state.quiescing and _lead(manager):
        reporter.get().transition("quiescing", from_state="running", reason=reason)
    state.quiescing = True


def overrun(manager: Any) -> None:
    """The pause outlasted every bound TorchFT puts on the step's waits: running again, so
    that the engine judges the silence (a hang of this replica, not a quorum matter)."""
    state = _state(manager)
    if state.quiescing and _lead(manager):
        reporter.get().transition("running", from_state="quiescing", reason=PAUSE_OVERRAN)
    state.quiescing, state.overran = False, True


def observe(manager: Any, committed: bool, *, steps: bool = True) -> None:
    """After `manager.should_commit()` answered `committed`: the step and the quorum it
    committed in, or the pause."""
    if not committed:
        pause(manager, NOT_COMMITTED)
        return
    state = _state(manager)
    quorum = getattr(manager, "_quorum_id", None)
    participants = _call(manager, "num_participants")
    changed = (quorum, participants) != (state.quorum_id, state.participants)
    if _lead(manager) and (state.quiescing or changed):
        reporter.get().transition(
            "running",
            from_state="quiescing" if state.quiescing else "running",
            reason=QUORUM_CHANGE,
            world_size=getattr(manager, "_group_world_size", None),
            topology={"dp": max(int(participants or 1), 1)},
        )
    state.quorum_id, state.participants, state.quiescing = quorum, participants, False
    state.overran = False
    if steps:
        from agents import torch as fl_torch

        step = _call(manager, "current_step")
        if isinstance(step, int):
            fl_torch.report_step(step)


class _QuorumWatch:
    """One daemon thread per process: pauses the groups whose quorum keeps them waiting."""

    def __init__(self) -> None:
        self.managers: weakref.WeakSet[Any] = weakref.WeakSet()
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None

    def add(self, manager: Any) -> None:
        with self.lock:
            self.managers.add(manager)
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self.run, name="faultline-torchft-quorum", daemon=True
                )
                self.thread.start()

    def run(self) -> None:
        while True:
            time.sleep(WATCH_EVERY_S)
            with self.lock:
                managers = list(self.managers)
            for manager in managers:
                with contextlib.suppress(Exception):
                    self.check(manager)

    @staticmethod
    def check(manager: Any, now: float | None = None) -> None:
        state = _state(manager)
        future = getattr(manager, "_quorum_future", None)
        started = state.quorum_started
        if state.quorum_id is None or started is None or future is None:
            return  # before the first commit (start-up waits for peers)
        waited = (time.monotonic() if now is None else now) - started
        if state.overran or waited < QUORUM_WAIT_S:
            return
        if state.quiescing and waited >= bound_s(manager):
            overrun(manager)
        elif not future.done():
            pause(manager, AWAITING_QUORUM)
        elif getattr(manager, "_quorum_id", None) != state.quorum_id:
            # A new quorum that has not committed yet: its first step waits on the peers
            # that just joined (a rejoining replica heals from us, then runs a first step
            # that may compile for minutes). A slow step in the quorum it already
            # committed in is no pause: that is for the engine to judge.
            pause(manager, RECONFIGURING)


_watch = _QuorumWatch()


def install(module: ModuleType | None = None, *, steps: bool = True) -> None:
    """Report every `torchft.manager.Manager` of this process (idempotent). `steps=False`
    when the training loop reports its own steps (agents.torch.report_step)."""
    if module is None:
        import torchft.manager  # optional dependency, loaded only when asked

        module = torchft.manager
    reporter.auto()  # the replica group's reporter, from its launcher (idempotent)
    manager_class = module.Manager
    if getattr(manager_class.should_commit, _MARK, False):
        return
    should_commit_of, start_quorum_of = manager_class.should_commit, manager_class.start_quorum

    @functools.wraps(should_commit_of)
    def should_commit(self: Any, *args: Any, **kwargs: Any) -> Any:
        committed = should_commit_of(self, *args, **kwargs)
        with contextlib.suppress(Exception):  # telemetry never breaks the training loop
            observe(self, bool(committed), steps=steps)
        return committed

    @functools.wraps(start_quorum_of)
    def start_quorum(self: Any, *args: Any, **kwargs: Any) -> Any:
        with contextlib.suppress(Exception):
            state = _state(self)
            state.quorum_started, state.overran = time.monotonic(), False
            _watch.add(self)
        return start_quorum_of(self, *args, **kwargs)

    setattr(should_commit, _MARK, True)
    manager_class.should_commit = should_commit
    manager_class.start_quorum = start_quorum
