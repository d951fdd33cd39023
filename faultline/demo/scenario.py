"""The demo's script: the fleet layout, the fault matrix and its schedules.

Owns which groups run where (training slots, serving nodes, spares), which faults the demo
plays in which order and how often. Plain data and one pure function; must not start
processes, send telemetry or sleep (faultline.demo.simulator plays the script).
"""

from __future__ import annotations

from dataclasses import dataclass

RANKS_PER_NODE = 4
WORKERS_PER_NODE = 2
STEP_S = 1.0
SERVING_WINDOW_S = 5.0
CKPT_EVERY = 10

# Recovery objectives each training group's launcher declares. train-a's RPO is
# a little over its checkpoint interval: met while checkpoints land, exceeded (a risk
# finding, `rpo_exceeded`) once the corrupt checkpoint of the matrix leaves the newest
# valid one 20 steps behind. Restarts rewind the data to the checkpoint: allow_repeat.
OBJECTIVES: dict[str, dict[str, object]] = {
    "train-a": {"rpo_steps": CKPT_EVERY + 6, "rto_s": 120, "consistency": "allow_repeat"},
    "train-b": {"rpo_minutes": 2, "rto_s": 120, "consistency": "allow_repeat"},
}

# A fault placed on a spare node (no job runs there), not on a group: the most common case
# in a fleet, a GPU that fails between jobs. The service takes the node out on its own.
SPARE = "spare"

# The fault matrix from the seed, in the order the demo plays it: (kind, group or SPARE).
MATRIX: tuple[tuple[str, str], ...] = (
    ("xid79", "train-a"),
    ("xid79", SPARE),
    ("thermal_straggler", "train-b"),
    ("collective_mismatch", "train-a"),
    ("oom", "train-b"),
    ("serving_not_ready", "serve"),
    ("nan_loss", "train-a"),
    ("slow_nic", "train-b"),
    ("corrupt_checkpoint", "train-a"),
    ("stale_generation", "train-b"),
)
# (seconds before the first fault, seconds between faults, seconds a fault is held).
SCHEDULES = {"demo": (30.0, 40.0, 45.0), "fast": (12.0, 20.0, 25.0), "none": (0.0, 0.0, 0.0)}
# Seconds a node taken out by a hardware fault stays out, visibly, after its job moved off,
# before the demo "repairs" (reboots) it; then the service validates it and puts it back.
REPAIR_AFTER_S = {"demo": 30.0, "fast": 10.0, "none": 0.0}


@dataclass
class Slot:
    node: str
    gpu: int


@dataclass
class Fault:
    kind: str
    rank: int | None = None
    node: str | None = None
    worker: str | None = None
    started: float = 0.0
    until: float = 0.0


def layout(nodes: list[str], gpus: int) -> tuple[dict[str, list[Slot]], list[str], list[str]]:
    """Training slots per group, serving nodes, spare nodes (for node replacement)."""
    per_group = max(1, min(3, (len(nodes) - 1) // 3))
    rpn = min(RANKS_PER_NODE, gpus)
    train_a = nodes[:per_group]
    train_b = nodes[per_group : 2 * per_group]
    serve = nodes[2 * per_group : 2 * per_group + max(1, min(2, len(nodes) - 2 * per_group))]
    spares = nodes[2 * per_group + len(serve) :]
    slots = {
        "train-a": [Slot(n, g) for n in train_a for g in range(rpn)],
        "train-b": [Slot(n, g) for n in train_b for g in range(rpn)],
    }
    return slots, serve, spares
