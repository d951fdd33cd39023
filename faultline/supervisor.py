"""The child-process supervisor of `faultline up` and `faultline demo`.

Owns running a set of named commands, restarting one that dies (the rules below, in
`restart_delay`), reviving an embedded Valkey, and stopping every child on SIGTERM/SIGINT.
Must not know what the children are (faultline.bootstrap builds the service's commands,
faultline.demo adds agents and the workload) and must not touch the database.

With `logs`, each child's output goes to `<logs>/<child>.log` (appended across restarts)
instead of the terminal, except the children named in `passthrough` (their stdout stays on
the terminal, their stderr goes to the log); children then run in a process group of their
own, so a Ctrl-C at the terminal reaches only the supervisor, which stops the children
named in `stop_first` before the rest (`faultline demo`: the simulated fleet, then the
service it reports to).

A child can also be restarted on request: with `restart_dir`, a file named after a child
in that folder (e.g. `agent:node-003`) makes the supervisor SIGTERM it and start it again
at once, not counted as a death (`faultline demo` "reboots" a node's agent this way).

Restart rules: a child that dies is restarted after 0.5 s, doubling with each death in
the last minute up to 30 s (a Redis blip crashes the Celery worker once; five blips must
not take Faultline down). Only a child that died 30 times in ten minutes stops the whole
service (exit 1).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from faultline.embedded import Embedded, EmbeddedError

FIRST_DELAY_S = 0.5
MAX_DELAY_S = 30.0
BURST_WINDOW_S = 60.0
GIVE_UP_AFTER = 30
GIVE_UP_WINDOW_S = 600.0
STOP_GRACE_S = 15.0
TICK_S = 0.5


def restart_delay(deaths: Sequence[float], now: float) -> float | None:
    """Seconds to wait before restarting a child whose earlier restarts were at `deaths`
    (monotonic times), or None when it has died too often and the service must stop."""
    recent = [t for t in deaths if now - t < GIVE_UP_WINDOW_S]
    if len(recent) >= GIVE_UP_AFTER:
        return None
    burst = sum(1 for t in recent if now - t < BURST_WINDOW_S)
    return min(MAX_DELAY_S, FIRST_DELAY_S * 2**burst)


class Supervisor:
    """Runs the children, restarts one that dies with backoff, stops all on a signal.

    An embedded Valkey that dies is restarted on its port first (`embedded`).
    """

    def __init__(
        self,
        commands: dict[str, list[str]],
        env: dict[str, str],
        embedded: Embedded | None = None,
        restart_dir: Path | None = None,
        logs: Path | None = None,
        passthrough: frozenset[str] = frozenset(),
        stop_first: Sequence[str] = (),
        stop_message: str = "",
    ) -> None:
        self.commands, self.env, self.embedded = commands, env, embedded
        self.restart_dir = restart_dir
        self.logs, self.passthrough, self.stop_first = logs, passthrough, tuple(stop_first)
        self.stop_message = stop_message
        self.requested: set[str] = set()  # stopped on request: restart now, not a death
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.restarts: dict[str, list[float]] = {name: [] for name in commands}
        self.due: dict[str, float] = {}
        self.stopping = False
        self.stopping_announced = False

    def start(self, name: str) -> None:
        if self.logs is None:
            self.procs[name] = subprocess.Popen(self.commands[name], env=self.env)
            return
        self.logs.mkdir(parents=True, exist_ok=True)
        with open(self.log_of(name), "ab") as log:
            self.procs[name] = subprocess.Popen(
                self.commands[name],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=None if name in self.passthrough else log,
                stderr=log,
                process_group=0,  # the terminal's Ctrl-C is the supervisor's to hand on
            )

    def log_of(self, name: str) -> Path:
        """Where a child's output goes (`agent:node-001` -> agent-node-001.log)."""
        return (self.logs or Path()) / (name.replace(":", "-").replace("/", "-") + ".log")

    def run(self) -> int:
        """Start every child and keep them running until `stopping`; 1 if one gave up."""
        for name in self.commands:
            self.start(name)
        while not self.stopping:
            time.sleep(TICK_S)
            self._revive_embedded()
            self._take_requests()
            now = time.monotonic()
            for name, proc in list(self.procs.items()):
                if self.stopping or proc.poll() is None:
                    continue
                if name in self.requested:
                    self.requested.discard(name)
                    self.due.pop(name, None)
                    print(f"faultline: {name} restarted on request", flush=True)
                    self.start(name)
                    continue
                if name not in self.due:
                    delay = restart_delay(self.restarts[name], now)
                    if delay is None:
                        print(
                            f"faultline: {name} died {GIVE_UP_AFTER} times in 10 min; stopping",
                            flush=True,
                        )
                        self.stop()
                        return 1
                    self.restarts[name] = [
                        *(t for t in self.restarts[name] if now - t < GIVE_UP_WINDOW_S),
                        now,
                    ]
                    print(
                        f"faultline: {name} exited with code {proc.returncode}; "
                        f"restarting in {delay:.1f}s",
                        flush=True,
                    )
                    self.due[name] = now + delay
                if now >= self.due[name]:
                    del self.due[name]
                    self.start(name)
        return 0

    def _take_requests(self) -> None:
        """SIGTERM each child named by a file in `restart_dir` (the file is removed)."""
        if self.restart_dir is None:
            return
        try:
            names = [p.name for p in self.restart_dir.iterdir()]
        except OSError:
            return
        for name in names:
            with contextlib.suppress(OSError):
                (self.restart_dir / name).unlink()
            proc = self.procs.get(name)
            if proc is None or name in self.requested:
                continue
            self.requested.add(name)
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    def _revive_embedded(self) -> None:
        if self.embedded is None:
            return
        try:
            if self.embedded.revive_valkey():
                print("faultline: embedded Valkey exited; restarted it on its port", flush=True)
        except EmbeddedError as exc:  # retried on the next tick
            print(f"faultline: {exc}", flush=True)

    def handle_signals(self) -> None:
        """SIGTERM and SIGINT end `serve` (install before announcing the service)."""

        def on_signal(signum: int, frame: object) -> None:
            self.stopping = True

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

    def serve(self) -> int:
        """Run in the foreground until a signal, then stop every child; the exit code."""
        sys.stdout.flush()
        code = self.run()
        self.stop()
        return code

    def stop(self) -> None:
        """SIGTERM the `stop_first` children and wait for them, then every other child;
        each round waits up to STOP_GRACE_S, then SIGKILLs what is left."""
        if self.stop_message and not self.stopping_announced:
            self.stopping_announced = True
            print(self.stop_message, flush=True)
        self.stopping = True
        first = [n for n in self.stop_first if n in self.procs]
        rest = [n for n in self.procs if n not in first]
        for names in (first, rest):
            self._stop([self.procs[n] for n in names])

    @staticmethod
    def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
            if proc.poll() is None:
                proc.kill()
                proc.wait()
