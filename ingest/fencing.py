"""Fencing and monotonic contracts, decided per record against the group's live state.

Pure functions over plain values: which records may move live state, and which break a
correctness contract (seed: one active generation per group; restart count, checkpoint
order, data cursor and model version never go backwards within a generation).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass
class GroupView:
    """The slice of a group's live state that fencing needs (mutated as records apply)."""

    name: str
    generation: int
    fenced_at: datetime | None
    restart_count: int
    data_cursor: int | None
    model_version: str
    last_checkpoint_step: int | None
    is_new: bool = False
    versions_seen: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Violation:
    kind: str
    subject: str
    generation: int
    evidence: dict[str, Any]


def classify_generation(view: GroupView, generation: int, *, is_transition: bool) -> str:
    """'apply', 'stale' (older generation) or 'ahead' (newer, no transition yet)."""
    if view.is_new and view.generation == 0:
        return "apply"  # a group is created by its first record, at whatever generation
    if generation == view.generation:
        return "apply"
    if generation < view.generation:
        return "stale"
    return "apply" if is_transition else "ahead"


def stale_violation(view: GroupView, kind: str, generation: int, ts: datetime) -> Violation | None:
    """Judge a record of an older generation (it is stored either way, never applied).

    Stamped before the fence: a late delivery (another node's agent spooled it), no
    violation. After the fence: the old generation is still alive — writing progress
    (steps, checkpoints) is split brain, anything else a stale generation.
    """
    if view.fenced_at is not None and ts <= view.fenced_at:
        return None
    writing_after_fence = kind in {"step", "checkpoint"} and view.fenced_at is not None
    return Violation(
        kind="split_brain" if writing_after_fence else "stale_generation",
        subject=f"group:{view.name}",
        generation=generation,
        evidence={
            "record_kind": kind,
            "record_generation": generation,
            "active_generation": view.generation,
            "record_ts": ts.isoformat(),
            "fenced_at": view.fenced_at.isoformat() if view.fenced_at else None,
        },
    )


def check_transition(view: GroupView, rec: Any) -> list[Violation]:
    """Monotonic checks for a transition inside the active generation."""
    out: list[Violation] = []
    same_gen = rec.generation == view.generation and not view.is_new
    subject = f"group:{view.name}"
    if same_gen and rec.restart_count is not None and rec.restart_count < view.restart_count:
        out.append(
            Violation(
                "non_monotonic",
                subject,
                rec.generation,
                {"field": "restart_count", "was": view.restart_count, "now": rec.restart_count},
            )
        )
    if (
        same_gen
        and rec.data_cursor is not None
        and view.data_cursor is not None
        and rec.data_cursor < view.data_cursor
    ):
        out.append(
            Violation(
                "data_cursor_regression",
                subject,
                rec.generation,
                {"field": "data_cursor", "was": view.data_cursor, "now": rec.data_cursor},
            )
        )
    if (
        same_gen
        and rec.model_version
        and rec.model_version != view.model_version
        and rec.model_version in view.versions_seen
    ):
        out.append(
            Violation(
                "non_monotonic",
                subject,
                rec.generation,
                {"field": "model_version", "was": view.model_version, "now": rec.model_version},
            )
        )
    return out


def check_checkpoint_order(view: GroupView, rec: Any) -> Violation | None:
    """A newly committed checkpoint must not be older than the newest committed one."""
    if rec.phase != "committed" or rec.step is None or view.last_checkpoint_step is None:
        return None
    if rec.step < view.last_checkpoint_step:
        return Violation(
            "non_monotonic",
            f"checkpoint:{view.name}/{rec.checkpoint_id}",
            rec.generation,
            {"field": "checkpoint_step", "was": view.last_checkpoint_step, "now": rec.step},
        )
    return None


def check_rank_cursor(
    group: str, rank: int, generation: int, was: int | None, now: int | None
) -> Violation | None:
    if was is None or now is None or now >= was:
        return None
    return Violation(
        "data_cursor_regression",
        f"rank:{group}/{rank}",
        generation,
        {"field": "data_cursor", "was": was, "now": now},
    )
