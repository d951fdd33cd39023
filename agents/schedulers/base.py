"""What every scheduler backend shares: the `Backend` type, running one command with a
timeout (`Runner`), running one action (`execute`) and the node's attestation of the jobs
running on it (the heartbeat's `jobs`, `Attestation`).

Backends import this module; it imports no backend (agents.schedulers picks one by name).
A backend never decides whether an action is wise and never retries: the executor owns
at-most-once and fencing; the service owns the gates.
"""

from __future__ import annotations

import logging
import shlex
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from agents import actions_contract as contract
from agents import vocab

# The one limit both sides keep (agents/vocab.py); the clipped text fits within it.
OUTPUT_LIMIT = vocab.ACTION_OUTPUT_LIMIT
_CUT = "\n...[truncated]...\n"

log = logging.getLogger("faultline.agent.schedulers")


@dataclass(frozen=True)
class Ran:
    argv: list[str]
    code: int | None  # None: could not run or timed out
    out: str

    @property
    def ok(self) -> bool:
        return self.code == 0

    def line(self) -> str:
        code = "timeout/error" if self.code is None else f"exit {self.code}"
        out = self.out.strip()
        out = out if len(out) <= 300 else out[:300] + " ..."  # reads are kept in the outcome
        return f"$ {shlex.join(self.argv)}  ({code})\n{out}".rstrip()


class Runner:
    """Runs argv lists (never a shell) with a timeout; remembers what ran, in order."""

    def __init__(self, *, timeout_s: float = 60.0, env: dict[str, str] | None = None) -> None:
        self.timeout_s = timeout_s
        self.env = env
        self.ran: list[Ran] = []

    def __call__(self, *argv: str, timeout_s: float | None = None) -> Ran:
        try:
            done = subprocess.run(
                list(argv),
                capture_output=True,
                text=True,
                timeout=timeout_s or self.timeout_s,
                env=self.env,
                check=False,
            )
            ran = Ran(list(argv), done.returncode, (done.stdout or "") + (done.stderr or ""))
        except subprocess.TimeoutExpired:
            ran = Ran(list(argv), None, f"timed out after {timeout_s or self.timeout_s:g}s")
        except OSError as exc:
            ran = Ran(list(argv), None, f"cannot run {argv[0]}: {exc}")
        self.ran.append(ran)
        return ran

    def transcript(self) -> str:
        return "\n".join(r.line() for r in self.ran)

    def commands(self) -> list[list[str]]:
        return [r.argv for r in self.ran]


class Backend(Protocol):
    name: str
    kinds: frozenset[str]

    def run(self, action: dict[str, Any], *, node: str, runner: Runner) -> contract.Result: ...

    def plan(self, action: dict[str, Any], *, node: str) -> list[list[str]]: ...

    def jobs_on(self, run: Runner, node: str) -> list[str] | None: ...


def bound(text: str) -> str:
    if len(text) <= OUTPUT_LIMIT:
        return text
    keep = (OUTPUT_LIMIT - len(_CUT)) // 2
    return text[:keep] + _CUT + text[-keep:]


class Attestation:
    """The scheduler jobs running on this node, as the agent's heartbeat attests them.

    The service lets a group bound to a job take ranks and transitions only from nodes
    that attest the job (docs/security.md, "Who owns a group"). Read from the scheduler
    every `every_s` on a thread of its own, and at once (`wants`) when a workload names a
    job the last read did not show: the attestation must reach the service before the
    job's first records do. None while the scheduler cannot say (not installed, down).
    """

    def __init__(
        self,
        backend: Backend,
        node: str,
        *,
        every_s: float = 30.0,
        min_gap_s: float = 0.5,
        timeout_s: float = 10.0,
        env: dict[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backend, self.node = backend, node
        self.every_s, self.min_gap_s = every_s, min_gap_s
        self.timeout_s, self.env, self.clock = timeout_s, env, clock
        self._jobs: list[str] | None = None
        self._read_at: float | None = None
        self._asked: dict[str, float] = {}  # job -> when a record named it unattested
        self._asked_at: float | None = None  # the newest of those reads
        self._lock = threading.Lock()

    @property
    def jobs(self) -> list[str] | None:
        return self._jobs

    def refresh(self) -> list[str] | None:
        """Read the node's jobs. A failed read keeps the last good one: a scheduler that
        does not answer for a moment must not cut the node off from its own jobs."""
        with self._lock:
            self._read_at = self.clock()
            runner = Runner(timeout_s=self.timeout_s, env=self.env)
            try:
                jobs = self.backend.jobs_on(runner, self.node)
            except Exception:
                log.exception("could not read this node's jobs from %s", self.backend.name)
                jobs = None
            if jobs is None:
                log.warning(
                    "%s did not say which jobs run here: %s",
                    self.backend.name,
                    runner.transcript()[-300:],
                )
            else:
                self._jobs = jobs
            return self._jobs

    def wants(self, job: str) -> bool:
        """Read again when `job` is not attested yet: once per job and `every_s`, and at
        most once per `min_gap_s` for all jobs (a workload naming made-up jobs costs one
        read each, bounded). True when the read changed what is attested: send a heartbeat
        before the record."""
        known, now = self._jobs, self.clock()
        if known is not None and job in known:
            return False
        asked = self._asked.get(job)
        if asked is not None and now - asked < self.every_s:
            return False
        if self._asked_at is not None and now - self._asked_at < self.min_gap_s:
            return False
        if len(self._asked) >= 1024:
            self._asked.clear()
        self._asked[job] = self._asked_at = now
        return self.refresh() != known

    def run(self, stop: threading.Event) -> None:
        """Read again every `every_s` until `stop` (the caller read once before starting)."""
        while not stop.wait(self.every_s):
            self.refresh()


def execute(
    backend: Backend,
    action: dict[str, Any],
    *,
    node: str,
    timeout_s: float,
    dry_run: bool = False,
    env: dict[str, str] | None = None,
) -> contract.Result:
    """Run one action on the backend; the result's output carries every command and reply."""
    kind = contract.canonical(str(action.get("kind")))
    action = {**action, "kind": kind}
    if dry_run:
        plan = backend.plan(action, node=node)
        text = "\n".join(shlex.join(argv) for argv in plan)
        return contract.result(
            "applied",
            f"dry-run: would run\n{text}",
            exit_code=0,
            kind=kind,
            scheduler=backend.name,
            commands=plan,
        )
    runner = Runner(timeout_s=timeout_s, env=env)
    res = backend.run(action, node=node, runner=runner)
    res["output"] = bound(f"{res['output']}\n{runner.transcript()}".strip())
    res.setdefault("outcome", {})["commands"] = runner.commands()
    res["outcome"].setdefault("kind", kind)
    res["outcome"].setdefault("scheduler", backend.name)
    return res
