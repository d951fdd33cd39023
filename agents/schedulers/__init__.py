"""Built-in scheduler backends: the action contract (agents/actions_contract.py) on Slurm
and Kubernetes, each reporting the outcome read back from the scheduler.

Owns choosing a backend by name (`scheduler = "slurm"` in agent.toml) and running one
command with a timeout. A backend never decides whether an action is wise and never
retries: the executor owns at-most-once and fencing; the service owns the gates.
"""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass
from typing import Any, Protocol

from agents import actions_contract as contract

OUTPUT_LIMIT = 4096


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


def bound(text: str) -> str:
    if len(text) <= OUTPUT_LIMIT:
        return text
    return text[: OUTPUT_LIMIT // 2] + "\n...[truncated]...\n" + text[-OUTPUT_LIMIT // 2 :]


def backend_named(name: str | None) -> Backend | None:
    """The backend for `scheduler = "<name>"`; None for ''/None; ValueError names the fix."""
    if not name:
        return None
    from agents.schedulers.kubernetes import Kubernetes
    from agents.schedulers.slurm import Slurm

    backends: dict[str, Backend] = {"slurm": Slurm(), "kubernetes": Kubernetes()}
    if name not in backends:
        raise ValueError(
            f'scheduler = "{name}" is not a built-in backend; use one of: '
            f"{', '.join(sorted(backends))}, or leave it unset and configure [hooks]"
        )
    return backends[name]


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
