from __future__ import annotations

import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from agents import signing
from agents.executor import OUTPUT_LIMIT, Executor

from .conftest import StubIngest

PY = sys.executable
TOKEN = "flt_node-1-token"
KEY = signing.key_from_token(TOKEN)


def _action(
    action_id: str = "a1", generation: int = 4, kind: str = "cordon", **changes: object
) -> dict:
    action = {
        "id": action_id,
        "kind": kind,
        "target": "node:node-1",
        "group": "g",
        "generation": generation,
        "params": {"reason": "xid 79"},
        **changes,
    }
    return signing.sign(action, KEY)


def _executor(tmp_path: Path, **kw) -> Executor:
    marker = tmp_path / "ran.txt"
    hooks = kw.pop(
        "hooks",
        {
            "cordon": f"{PY} -c \"import sys; open(sys.argv[1], 'a').write(sys.argv[2] + chr(10))\""
            f" {marker} {{node}}:{{reason}}",
        },
    )
    kw.setdefault("token", TOKEN)
    return Executor(tmp_path, node="node-1", hooks=hooks, **kw)


def test_it_runs_the_hook_with_the_action_filled_in(tmp_path: Path) -> None:
    result = _executor(tmp_path).handle(_action())
    assert result is not None and result["status"] == "succeeded"
    assert result["exit_code"] == 0
    assert (tmp_path / "ran.txt").read_text() == "node-1:xid 79\n"


def test_it_runs_an_action_id_once_even_after_a_restart(tmp_path: Path) -> None:
    _executor(tmp_path).handle(_action())
    assert _executor(tmp_path).handle(_action()) is None  # a new process, same state dir
    assert (tmp_path / "ran.txt").read_text().count("\n") == 1


def test_it_refuses_an_action_from_an_older_generation(tmp_path: Path) -> None:
    executor = _executor(tmp_path)
    executor.observe("g", 5)
    result = executor.handle(_action(generation=4))
    assert result["status"] == "failed"
    assert "older than generation 5" in result["output"]
    assert not (tmp_path / "ran.txt").exists()


def test_it_learns_the_newest_generation_from_actions_it_runs(tmp_path: Path) -> None:
    executor = _executor(tmp_path)
    executor.handle(_action("a1", generation=7))
    assert executor.handle(_action("a2", generation=6))["status"] == "failed"


def test_it_does_not_run_hooks_in_dry_run(tmp_path: Path) -> None:
    result = _executor(tmp_path, dry_run=True).handle(_action())
    assert result["output"].startswith("dry-run: would run")
    assert not (tmp_path / "ran.txt").exists()


def test_it_fails_an_action_kind_without_a_hook(tmp_path: Path) -> None:
    executor = _executor(tmp_path, allowed_kinds=["cordon", "reboot"])
    result = executor.handle(_action(kind="reboot"))
    assert result["status"] == "failed" and "no hook" in result["output"]


def test_it_times_out_a_hung_hook_and_bounds_output(tmp_path: Path) -> None:
    hooks = {"cordon": f"{PY} -c \"print('x' * 100000); import time; time.sleep(10)\""}
    result = _executor(tmp_path, hooks=hooks, timeout_s=1.0).handle(_action())
    assert result["status"] == "failed" and result["exit_code"] is None
    assert "timed out" in result["output"]
    assert len(result["output"]) <= OUTPUT_LIMIT + 100


def test_it_reports_results_and_polls_for_actions(tmp_path: Path, stub: StubIngest) -> None:
    stub.polled_actions = [_action("a9")]
    executor = _executor(tmp_path, server=stub.url)
    assert executor.poll_once() == 1
    executor.handle(executor._queue.get_nowait())
    assert stub.results["a9"]["status"] == "succeeded"
    assert stub.results["a9"]["exit_code"] == 0


class _CutShort(BaseHTTPRequestHandler):
    """Answers every poll with a body shorter than its Content-Length, then closes: what
    an agent reads from a web worker killed mid-reply (http.client.IncompleteRead)."""

    def log_message(self, *args: object) -> None:
        pass

    def _cut(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "100")
        self.end_headers()
        self.wfile.write(b'{"actions": [')
        self.close_connection = True

    do_GET = _cut


def test_a_reply_cut_short_is_a_failed_poll_not_a_dead_poller(tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _CutShort)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        executor = _executor(tmp_path, server=f"http://127.0.0.1:{server.server_port}")
        # Raised IncompleteRead (not an OSError), which ended the poll thread for good.
        assert executor.poll_once() == 0
    finally:
        server.shutdown()
        server.server_close()
