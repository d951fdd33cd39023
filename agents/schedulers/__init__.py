"""Built-in scheduler backends: the action contract (agents/actions_contract.py) on Slurm
and Kubernetes, each reporting the outcome read back from the scheduler.

Owns the list of backends and choosing one by name (`scheduler = "slurm"` in agent.toml).
What they share (running commands, executing an action, attesting jobs) is
agents.schedulers.base, which the backends import; this module imports them, never the
reverse.
"""

from __future__ import annotations

from agents.schedulers.base import (
    OUTPUT_LIMIT,
    Attestation,
    Backend,
    Ran,
    Runner,
    bound,
    execute,
)
from agents.schedulers.kubernetes import Kubernetes
from agents.schedulers.slurm import Slurm

__all__ = [
    "BACKENDS",
    "OUTPUT_LIMIT",
    "Attestation",
    "Backend",
    "Ran",
    "Runner",
    "backend_named",
    "bound",
    "execute",
]

BACKENDS: tuple[type[Slurm] | type[Kubernetes], ...] = (Slurm, Kubernetes)


def backend_named(name: str | None) -> Backend | None:
    """The backend for `scheduler = "<name>"`; None for ''/None; ValueError names the fix."""
    if not name:
        return None
    backends: dict[str, Backend] = {b.name: b() for b in BACKENDS}
    if name not in backends:
        raise ValueError(
            f'scheduler = "{name}" is not a built-in backend; use one of: '
            f"{', '.join(sorted(backends))}, or leave it unset and configure [hooks]"
        )
    return backends[name]
