"""A rank blocked inside a collective still tells the console where it waits."""

from __future__ import annotations

import threading
import time
import types
from typing import Any

from agents.torch import Recorder


class FakeReporter:
    def __init__(self) -> None:
        self.windows: list[list[dict[str, Any]]] = []

    def collective(self, window: list[dict[str, Any]]) -> None:
        self.windows.append(window)


def test_it_reports_a_collective_that_blocks_past_the_watch_threshold() -> None:
    rep = FakeReporter()
    rec = Recorder(rep)
    rec.WATCH_AFTER_S = 0.3
    fake_torch = types.SimpleNamespace(Tensor=type("Tensor", (), {}))
    release = threading.Event()
    all_reduce = rec._wrap(fake_torch, "all_reduce", lambda *a, **k: release.wait(5))
    watchdog = threading.Thread(target=rec._watch, daemon=True)
    watchdog.start()
    caller = threading.Thread(target=all_reduce)
    caller.start()
    deadline = time.monotonic() + 3
    while not rep.windows and time.monotonic() < deadline:
        time.sleep(0.05)
    release.set()
    caller.join(5)
    rec._stop.set()
    assert rep.windows, "the blocked collective was never reported"
    (entry,) = rep.windows[0]
    assert (entry["op"], entry["seq"], entry["state"]) == ("all_reduce", 1, "started")
    assert len(rep.windows) == 1  # reported once per blocked call, not every tick


def test_it_reports_a_still_blocked_collective_again_every_resend_interval() -> None:
    """A window lost on the way (the reporter drops when the agent's queue is full) must
    not hide for good where the rank waits."""
    rep = FakeReporter()
    rec = Recorder(rep)
    rec.WATCH_AFTER_S, rec.WATCH_RESEND_S = 0.2, 0.6
    fake_torch = types.SimpleNamespace(Tensor=type("Tensor", (), {}))
    release = threading.Event()
    all_reduce = rec._wrap(fake_torch, "all_reduce", lambda *a, **k: release.wait(10))
    watchdog = threading.Thread(target=rec._watch, daemon=True)
    watchdog.start()
    caller = threading.Thread(target=all_reduce)
    caller.start()
    deadline = time.monotonic() + 6
    while len(rep.windows) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    first_two = list(rep.windows)
    release.set()
    caller.join(5)
    rec._stop.set()
    assert len(first_two) == 2, first_two
    assert first_two[0] == first_two[1]  # the same blocked call, seq and state


def test_it_stays_quiet_for_collectives_that_finish_quickly() -> None:
    rep = FakeReporter()
    rec = Recorder(rep)
    rec.WATCH_AFTER_S = 0.3
    fake_torch = types.SimpleNamespace(Tensor=type("Tensor", (), {}))
    barrier = rec._wrap(fake_torch, "barrier", lambda *a, **k: None)
    watchdog = threading.Thread(target=rec._watch, daemon=True)
    watchdog.start()
    for _ in range(20):
        barrier()
        time.sleep(0.03)
    rec._stop.set()
    assert rep.windows == []
