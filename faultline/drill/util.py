"""Small helpers every drill module shares (the runner and the row modules it dispatches to).

Owns reading a rank log's first error, waiting on a predicate, and a checkpoint id's step.
Kept apart from faultline.drill.runner so the row modules (serving_drill, topology,
fake_device) need not import the runner that imports them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def first_error(logs: list[Path]) -> str:
    """The last error line of the first rank log that has one, and the log's path: what a
    user reads first when a generation never got going (a missing module, a bad port)."""
    for log in logs:
        with contextlib.suppress(OSError):
            lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines()]
            errors = [ln for ln in lines if "Error" in ln or "error:" in ln]
            if errors:
                return f"{errors[-1][:200]} (see {log})"
    where = logs[0].parent if logs else "the work directory's logs/"
    return f"no rank logged an error (see {where})"


def wait(predicate: Callable[[], Any], timeout: float, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return None


def all_alive(job: Any) -> bool:
    return all(p.poll() is None for p in job.procs)


def step_of(checkpoint_id: str | None) -> int:
    if not checkpoint_id:
        return 0
    digits = "".join(ch if ch.isdigit() else " " for ch in checkpoint_id).split()
    return int(digits[-1]) if digits else 0


def world_shape(world: int, shape: dict[str, int] | None = None) -> dict[str, int]:
    """The whole topology of a world of `world` ranks with these TP/PP/EP degrees: DP is
    what is left once TP and PP split the model (EP ranks are DP ranks of the dense
    part), as Megatron counts it."""
    out = {"tp": 1, "pp": 1, "ep": 1, **(shape or {})}
    return {
        "dp": world // (out["tp"] * out["pp"]),
        "tp": out["tp"],
        "pp": out["pp"],
        "ep": out["ep"],
    }
