"""The fake device rows' own parts that need no drill run: one story per fault, and the
real slowdown of `clock_throttle` (a process duty-cycled, then left running)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from faultline.drill.fake_device import DutyCycle
from faultline.drill.matrix import MATRIX
from faultline.drill.runner import Result


def _state(pid: int) -> str:
    # /proc/<pid>/stat: "pid (comm) S ..."; comm may hold spaces, the state follows ")".
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_row_that_must_stand_alone_fails_when_a_second_story_opened() -> None:
    row = Result("SIGSTOP rank 1", "hang", "rank_hang", found_root_cause="rank_hang")
    row.alone, row.advice_correct = True, True
    assert row.passed
    row.other_root_causes = ["group_stall"]
    assert not row.passed
    row.alone = False  # rows that do not say so keep the old criterion
    assert row.passed


def test_the_hang_and_fake_device_rows_must_stand_alone() -> None:
    alone = {s.name for s in MATRIX if s.alone}
    assert {"hang", "hang_after_checkpoint", "long_kernel", "clock_throttle"} <= alone


def test_the_duty_cycle_stops_the_process_and_leaves_it_running_after() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        cycle = DutyCycle(proc.pid, period_s=0.2, running=0.05).start()
        seen = set()
        for _ in range(200):
            seen.add(_state(proc.pid))
            if "T" in seen and cycle.cycles >= 2:
                break
            cycle._stop.wait(0.01)
        cycle.stop()
        assert "T" in seen and cycle.cycles >= 2  # really stopped, more than once
        assert _state(proc.pid) != "T"  # and resumed for good
    finally:
        proc.kill()
        proc.wait()
