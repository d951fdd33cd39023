"""Handler of state transitions: who may make one (ingest.ownership, the generation jump
and rate limits), and what an applied one changes: the group's generation, state, world
size, job, declared nodes, topology, data cursor, objectives and model versions.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec
from django.conf import settings

from agents import protocol as p
from console.models import ConsistencyGroup
from ingest import fencing, ownership
from ingest.copytext import flag, num, text, when
from ingest.copytext import json as cjson
from ingest.store.batch_state import plain
from ingest.store.fences import Fences
from ingest.store.kinds import Keep, Kind
from ingest.store.live_state import RANKS_OF_UNDECLARED_DROP


def _shape(topology: Any) -> dict[str, int] | None:
    """A world's whole shape, defaults included: `to_builtins` omits a degree of 1 (the
    wire's `omit_defaults`), and `{}` for DP 1 x TP 1 reads as "not reported"."""
    return msgspec.structs.asdict(topology) if topology is not None else None


def _transition_refused(
    w: Fences, rec: p.Transition, group: ConsistencyGroup, view: fencing.GroupView
) -> bool:
    """True (and a claim recorded) when this node may not make this transition.

    Who may is ingest.ownership's `may_transition` (the launcher, a host, a node placing
    a rank earlier in this batch, the batch that creates the group, or its creator while
    nothing is placed). A generation moves at most INGEST_MAX_GENERATION_JUMP at once
    (a new group starts at most that high) and INGEST_GENERATION_ADVANCE_PER_HOUR in an
    hour, whoever moves it.
    """
    name, owner, who = rec.group, w.owners[rec.group], w.claimant
    allowed = view.is_new or ownership.may_transition(owner, who, group=name, places_here=False)
    if not allowed and not owner.owner_job and ownership.rendezvous_open(owner, w.now):
        allowed = w.places_here(name)
    kind = "" if allowed else "unauthorized_transition"
    jump = rec.generation - (0 if view.is_new else view.generation)
    if kind or jump <= 0 or _reclaims(w, rec, view):
        pass
    elif jump > settings.INGEST_MAX_GENERATION_JUMP:
        kind = "generation_jump"
    elif not view.is_new and not ownership.within_budget(
        owner, jump, w.now, per_hour=settings.INGEST_GENERATION_ADVANCE_PER_HOUR
    ):
        kind = "generation_rate"
    if not kind:
        return False
    w.claim(
        kind,
        f"group:{name}",
        view.generation,
        {
            "record_generation": rec.generation,
            "active_generation": view.generation,
            "to_state": rec.to_state,
            "max_jump": settings.INGEST_MAX_GENERATION_JUMP,
            "advance_per_hour": settings.INGEST_GENERATION_ADVANCE_PER_HOUR,
        },
    )
    return True


def _reclaims(w: Fences, rec: p.Transition, view: fencing.GroupView) -> bool:
    """The group's launcher declares its nodes at a generation below the group's: it
    reclaims the group (a name a stranger held since its first rendezvous)."""
    return (
        w.claimant.launches(rec.group)
        and rec.nodes is not None
        and not w.owners[rec.group].owner_job
        and not view.is_new
        and rec.generation < view.generation
    )


def on_transition(w: Fences, rec: p.Transition, ts: datetime) -> None:
    if rec.job is not None:
        w.take_name(rec.job, rec.group, rec.generation, ts)
    group, view = w.groups[rec.group]
    owner = w.owners[group.name]
    if _transition_refused(w, rec, group, view):
        w.touched_groups.add(group.name)
        applied = False
    else:
        if _reclaims(w, rec, view):
            w.reset(group, view, owner, rec.generation, ts)
            w.drops[group.name].append(RANKS_OF_UNDECLARED_DROP)
        w.violations.extend(fencing.check_transition(view, rec))
        applied = w.fence(rec, ts, is_transition=True)
    w.rows["transitionrecord"].append(
        f"{when(ts)}{w.node_cell}{group.pk}\t{rec.generation}\t{flag(not applied)}\t"
        f"{text(rec.from_state)}\t{text(rec.to_state)}\t"
        f"{text(rec.reason)}\t{num(rec.restart_count)}\t"
        f"{num(rec.world_size)}\t{cjson(_shape(rec.topology))}\t{num(rec.data_cursor)}\t"
        f"{text(rec.model_version)}\n"
    )
    if not applied:
        return
    if rec.generation > view.generation:
        view.generation = group.generation = rec.generation
        view.fenced_at = ts
        view.versions_seen = []
        w.written_past_the_fence(group, view, ts)
        # Checkpoint order is judged within a generation: a restart may restore from
        # an older checkpoint than the newest (poisoned ones skipped) and commit anew.
        view.last_checkpoint_step = group.last_checkpoint_step = None
    group.state = rec.to_state
    group.state_since = ts
    if rec.restart_count is not None:
        view.restart_count = group.restart_count = max(view.restart_count, rec.restart_count)
    if rec.world_size is not None:
        group.world_size = owner.world_size = rec.world_size
    if rec.job is not None:
        w.set_job(rec.job, group)
    if rec.nodes is not None and not owner.owner_job:
        _declare(w, group.name, owner, rec.nodes)
    if rec.topology is not None:
        group.topology = _shape(rec.topology)
    if rec.data_cursor is not None:
        view.data_cursor = group.data_cursor = rec.data_cursor
    if rec.objectives is not None:
        # the launcher's declaration replaces its previous one key by key; an
        # operator's (console.actions.groups) is kept beside it and wins when merged.
        declared = {**(group.objectives or {}).get("launcher", {}), **plain(rec.objectives)}
        group.objectives = {**(group.objectives or {}), "launcher": declared}
    if rec.model_version:
        if view.model_version and view.model_version not in view.versions_seen:
            view.versions_seen.append(view.model_version)
        view.model_version = group.model_version = rec.model_version
    group.summary = {**group.summary, "versions_seen": view.versions_seen[-20:]}
    w.summary_changed.add(group.name)


def _declare(w: Fences, name: str, owner: ownership.Owner, nodes: list[str]) -> None:
    """The nodes of this generation's rendezvous, declared by a host or the launcher:
    they replace the group's nodes, and no other node joins."""
    generation = w.groups[name][0].generation
    w.declared[name] = (sorted(set(nodes)), generation)
    owner.member = w.node.name in nodes
    if not owner.member:
        owner.left_generation = generation
    owner.has_members = bool(nodes)
    if owner.rendezvous_until is None or owner.rendezvous_until > w.now:
        owner.rendezvous_until = w.now


# This family's kinds (ingest.store.kinds): each handler writes its table's COPY columns
# in this order.
KINDS = (
    Kind(
        p.Transition,
        on_transition,
        table="transitionrecord",
        columns=(
            "ts",
            "node_id",
            "group_id",
            "generation",
            "stale",
            "from_state",
            "to_state",
            "reason",
            "restart_count",
            "world_size",
            "topology",
            "data_cursor",
            "model_version",
        ),
        keep=Keep.GROUP_EVENTS,
    ),
)
