"""Real TorchFT: two replica groups and their lighthouse; one replica dies and rejoins.

Each replica group is faultline.drill.torchft_job (TorchFT's own Manager, DDP and
optimizer wrapper on gloo; nothing of Faultline in it) under its own
`python -m agents.torchrun --max-restarts 1`. Replica group 1's rank is SIGKILLed after
three steps committed together; torchrun restarts it, late (REJOIN_DELAY_S, a slow node),
and it heals from replica group 0 and rejoins with a slow first step (WARMUP_S, a compile).
The lighthouse waits out the dead replica's heartbeat (6 s here, 5 s by default: past the
engine's 4 s floor for a silent rank) before it issues replica group 0 a quorum of its
own; when replica group 1 is back, replica group 0 waits out its warm-up in the new
quorum's first allreduce. Both waits must read as quorum changes (quiescing, then running
again: alone, then with dp 2), never as an incident, while replica group 1's own group
shows its death and its next generation.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from agents.listener import Listener

from .conftest import validate
from .judging import blamed, judge, parsed, sweep, timeline

pytest.importorskip("torchft")

ROOT = Path(__file__).resolve().parents[2]
HEARTBEAT_TIMEOUT_MS = 6000
# Longer than the heartbeat: the quorum waits for the dead replica's heartbeat to expire,
# as with TorchFT's defaults (60 s join, 5 s heartbeat).
JOIN_TIMEOUT_MS = 20000
# The restarted replica's first step is this much slower once in its quorum (a compile,
# cold caches): past the engine's 4 s floor, so the survivor's wait in that quorum's first
# step reads as a stall unless it is reported as the pause it is.
WARMUP_S = 5.0
# The restarted replica starts this much later (a slow node): past the heartbeat, so the
# survivor first trains alone in a quorum of its own, then waits in the next one.
REJOIN_DELAY_S = 8.0


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def _dp(records: list[dict[str, Any]], group: str) -> list[tuple[str, Any]]:
    """The group's TorchFT transitions: (to_state, dp or reason)."""
    return [
        (r["to_state"], (r.get("topology") or {}).get("dp") or r.get("reason"))
        for r in records
        if r["kind"] == "transition" and r.get("group") == group
        and r.get("reason") in ("quorum_change", "awaiting_quorum", "reconfiguring",
                                "step_not_committed")
    ]  # fmt: skip


@pytest.mark.torch
@pytest.mark.slow
def test_a_replica_that_drops_out_and_rejoins_is_a_quorum_change_to_the_other(
    short_dir: Path,
) -> None:
    lighthouse_bin = shutil.which("torchft_lighthouse", path=str(Path(sys.executable).parent))
    assert lighthouse_bin is not None
    got: list[dict[str, Any]] = []
    lis = Listener(got.append, socket_path=short_dir / "r.sock")
    lis.start()
    port = _port()
    lighthouse = subprocess.Popen(
        [lighthouse_bin, "--min_replicas", "1", "--bind", f"[::]:{port}",
         "--join_timeout_ms", str(JOIN_TIMEOUT_MS),
         "--heartbeat_timeout_ms", str(HEARTBEAT_TIMEOUT_MS)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    stop = short_dir / "stop"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_"))}
    env.update(PYTHONPATH=str(ROOT), FAULTLINE_REPORTER_SOCKET=lis.socket_path,
               TORCHFT_LIGHTHOUSE=f"http://localhost:{port}", PYTHONWARNINGS="ignore",
               OMP_NUM_THREADS="1")  # fmt: skip
    replicas = []
    try:
        rejoin = ["--kill-at", "0:3", "--rejoin-delay-s", str(REJOIN_DELAY_S),
                  "--warmup-s", str(WARMUP_S)]  # fmt: skip
        for rid, extra in (("0", []), ("1", rejoin)):
            log = open(short_dir / f"rg{rid}.log", "w")  # noqa: SIM115 -- the child owns it
            replicas.append(subprocess.Popen(
                [sys.executable, "-m", "agents.torchrun", "--nproc-per-node", "1",
                 "--max-restarts", "1", "--monitor-interval", "0.1",
                 "-m", "faultline.drill.torchft_job", "--replica-id", rid,
                 "--stop-file", str(stop), *extra],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            ))  # fmt: skip
            log.close()

        def rejoined() -> bool:  # replica group 1's next generation trains in a quorum of 2
            return any(r["kind"] == "transition" and r["generation"] == 1 and
                       (r.get("topology") or {}).get("dp") == 2 for r in list(got))  # fmt: skip

        assert _wait(rejoined, 150), (short_dir / "rg1.log").read_text()[-3000:]
        time.sleep(2.0)  # a few steps together again
        stop.touch()
        codes = [p.wait(60) for p in replicas]
    finally:
        for p in (*replicas, lighthouse):
            if p.poll() is None:
                p.kill()
                p.wait()
        time.sleep(0.3)
        lis.stop()
    assert codes == [0, 0], [(short_dir / f"rg{i}.log").read_text()[-2000:] for i in "01"]
    validate(got)
    records = parsed(got)
    # One consistency group per replica group: the one that died has the exit.
    dead = {r["group"] for r in records if r.get("event") == "exited"}
    assert len(dead) == 1
    (dead_group,) = dead
    (survivor,) = {r["group"] for r in records} - dead
    # The survivor: together (dp 2), paused while the lighthouse waited out the dead
    # replica's heartbeat, running again (alone, or with the restarted replica if it was
    # back first), and together again at the end.
    moves = _dp(records, survivor)
    together = moves.index(("running", 2))
    paused = moves.index(("quiescing", "awaiting_quorum"), together)
    assert moves[paused + 1] == ("running", 1) and moves[-1] == ("running", 2), moves
    # The rejoined replica's warm-up, waited out in the new quorum's first step: a pause,
    # then running (dp 1 while the rejoined replica heals, as TorchFT counts it), then dp 2.
    rest = moves[paused + 2 :]
    assert rest[0] == ("quiescing", "reconfiguring"), moves
    assert all(to == "running" for to, _ in rest[1:]) and rest[-1] == ("running", 2), moves
    assert {r["generation"] for r in records if r.get("group") == survivor} == {0}
    # ... and nothing about it ever opens an incident, at any moment of the run.
    verdicts = sweep(records, survivor)
    wrong = {t: v for t, v in verdicts.items() if v}
    assert not wrong, (wrong, timeline(records, survivor, list(wrong)))
    # The replica that died: its own exit (SIGKILL, as torchrun named it), its restart.
    (death,) = [r for r in records if r.get("event") == "exited"]
    assert (death["rank"], death["signal"], death["launcher_root_cause"]) == (
        0, 9, "torchelastic",
    )  # fmt: skip
    restart = next(r["ts"] for r in records if r.get("group") == dead_group
                   and r["kind"] == "transition" and r["generation"] == 1)  # fmt: skip
    assert blamed(judge(records, dead_group, restart - timedelta(milliseconds=1))) == {
        ("process_exit", f"rank:{dead_group}/0")
    }
    # Without either pause the survivor's waits would have read as a hang: the test can
    # fail. The wait for the lighthouse, then the rejoined replica's warm-up in the new
    # quorum's first step.
    for reason in ("awaiting_quorum", "reconfiguring"):
        unpaused = [r for r in records if not (r.get("group") == survivor
                    and r.get("reason") == reason)]  # fmt: skip
        assert any(v for v in sweep(unpaused, survivor).values()), reason
