"""The supervisor restarts a child on request (a file named after it), not as a death."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

from faultline.supervisor import Supervisor
from faultline.testing.service import wait_for

CHILD = "import os, sys, time; open(sys.argv[1], 'a').write(f'{os.getpid()}\\n'); time.sleep(60)"


def _pids(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def test_it_restarts_a_child_named_by_a_request_file_at_once_and_not_as_a_death(
    tmp_path: Path,
) -> None:
    requests = tmp_path / "restart"
    requests.mkdir()
    logs = {name: tmp_path / f"{name}.pids" for name in ("agent:a", "agent:b")}
    commands = {name: [sys.executable, "-c", CHILD, str(log)] for name, log in logs.items()}
    sup = Supervisor(commands, dict(os.environ), restart_dir=requests)
    thread = threading.Thread(target=sup.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: all(_pids(log) for log in logs.values()), 20, "both children")
        first = _pids(logs["agent:a"])[0]
        (requests / "agent:a").touch()
        (requests / "nobody").touch()  # a name that is no child is dropped
        asked = time.monotonic()
        wait_for(lambda: len(_pids(logs["agent:a"])) == 2, 20, "agent:a started again")
        assert time.monotonic() - asked < 5
        assert _pids(logs["agent:a"])[1] != first
        assert len(_pids(logs["agent:b"])) == 1  # the other child is left alone
        assert sup.restarts["agent:a"] == []  # not counted toward giving up
        assert list(requests.iterdir()) == []
        time.sleep(1.5)
        assert len(_pids(logs["agent:a"])) == 2  # restarted once, not again
    finally:
        sup.stop()
        thread.join(timeout=20)
    assert all(proc.poll() is not None for proc in sup.procs.values())
