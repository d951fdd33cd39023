"""The inputs of the pure remediation gates, read under the remediation lock.

Owns turning rows into console.policy.inputs values (policy settings, the fleet as it is
and is committed to be, recent dispatch history, an action as a request, its votes) and
the two locks decisions take: the breaker row, then the action row. It must not decide
anything (console.policy does) or write anything (the verbs do).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings

from console.actions.errors import NotFound
from console.choices import ACTION_LIVE_STATES
from console.models import Action, BreakerState, ConsistencyGroup, Device, Node
from console.policy import inputs
from console.policy.lifecycle import HISTORY_STATES, ActionKind, ActionState, kind_spec
from console.roles import role_of


def policy() -> inputs.Policy:
    """Gate settings; read per call (never at import) from FAULTLINE_REMEDIATION_POLICY."""
    return inputs.Policy.from_dict(getattr(settings, "FAULTLINE_REMEDIATION_POLICY", None))


def locked_breaker() -> BreakerState:
    """The single breaker row, locked: it doubles as the remediation lock (proposals,
    votes and dispatches that count nodes out of service must not interleave)."""
    BreakerState.objects.get_or_create(pk=1)
    return BreakerState.objects.select_for_update().get(pk=1)


def breaker_input(row: BreakerState) -> inputs.BreakerState:
    return inputs.BreakerState(
        open=row.open,
        reason=row.reason,
        opened_at=row.opened_at,
        closed_at=row.closed_at,
        closed_by=row.closed_by or None,
        close_reason=row.closed_reason,
    )


def locked_action(action_id: int) -> Action:
    try:
        return (
            Action.objects.select_for_update(of=("self",))
            .select_related("node", "executor", "group", "incident", "proposed_by")
            .get(pk=action_id)
        )
    except Action.DoesNotExist:
        raise NotFound(f"action {action_id} does not exist") from None


def fleet_state(*, exclude: int | None, include_proposed: bool) -> inputs.FleetState:
    """Inventory plus what is out or committed to go out (live actions other than `exclude`).

    At proposal, pending proposals count too, so a storm of proposals is held early; at
    approval and dispatch only actions already approved or in flight count.
    """
    nodes = list(Node.objects.values_list("name", "pool", "quarantined", "cordoned"))
    node_pool = {n: (pool or "default") for n, pool, _, _ in nodes}
    pools: dict[str, int] = {}
    for pool in node_pool.values():
        pools[pool] = pools.get(pool, 0) + 1
    quarantined = {n for n, _, q, _ in nodes if q}
    cordoned = {n for n, _, _, c in nodes if c}
    gpus = list(Device.objects.values_list("uuid", "node__name", "isolated"))
    gpu_node = {g: n for g, n, _ in gpus}
    pool_gpus: dict[str, int] = {}
    for _, n, _ in gpus:
        pool_gpus[node_pool[n]] = pool_gpus.get(node_pool[n], 0) + 1
    isolated = {g for g, _, i in gpus if i}
    states = [*ACTION_LIVE_STATES, ActionState.PROPOSED] if include_proposed else ACTION_LIVE_STATES
    # A dry run never runs, so it takes nothing out.
    pending = Action.objects.filter(state__in=states, dry_run=False).exclude(pk=exclude)
    for kind, node, gpu in pending.values_list("kind", "node__name", "gpu"):
        spec = kind_spec(kind)
        if spec.node_out and node:
            cordoned.add(node)
        elif spec.gpu_out and gpu:
            isolated.add(gpu)
    generations = dict(ConsistencyGroup.objects.values_list("name", "generation"))
    return inputs.FleetState(
        pools=pools,
        node_pool=node_pool,
        quarantined=frozenset(quarantined),
        cordoned=frozenset(cordoned),
        pool_gpus=pool_gpus,
        gpu_node=gpu_node,
        isolated_gpus=frozenset(isolated),
        generations=generations,
    )


def history(now: datetime, pol: inputs.Policy) -> inputs.RecentActions:
    window = max(pol.rate_window_s, pol.repeat_window_s, pol.breaker_window_s)
    rows = Action.objects.filter(
        state__in=HISTORY_STATES, dispatched_at__gt=now - timedelta(seconds=window)
    ).values_list("kind", "target", "dispatched_at", "proposed_by_id", "node__name", "state")
    return inputs.RecentActions.of(
        inputs.ActionRecord(
            kind=ActionKind(kind),
            target=target,
            at=at,
            automatic=by is None,
            node=node,
            failed=state == ActionState.FAILED,
        )
        for kind, target, at, by, node, state in rows
    )


def request_of(action: Action) -> inputs.ActionRequest:
    advice = (action.incident.recovery if action.incident else None) or (
        action.group.summary.get("recovery_advice") if action.group else None
    )
    safe = advice.get("auto_restart_safe") if isinstance(advice, dict) else None
    held: Any = action.node
    if action.gpu and action.node is not None:
        held = Device.objects.filter(uuid=action.gpu).first() or action.node
    return inputs.ActionRequest(
        id=str(action.pk),
        kind=ActionKind(action.kind),
        target=action.target,
        proposed_at=action.proposed_at,
        expires_at=action.expires_at,
        proposed_by=action.proposed_by.get_username() if action.proposed_by else None,
        state=ActionState(action.state),
        node=action.node.name if action.node else None,
        gpu=action.gpu or None,
        group=action.group.name if action.group else None,
        generation=action.generation,
        trigger=action.trigger or None,
        auto_restart_safe=safe if isinstance(safe, bool) else None,
        restart_advice=str(advice.get("reason", "")) if isinstance(advice, dict) else "",
        replace_flagged=bool(held and held.replace_flagged),
        taken_out_by=(held.taken_out_by if held else "") or "",
    )


def votes_of(action: Action) -> list[inputs.Vote]:
    return [
        inputs.Vote(
            action_id=str(v.action_id),
            voter=v.user.get_username(),
            role=role_of(v.user),
            approve=v.decision == "approve",
            cast_at=v.cast_at,
            generation=v.generation,
        )
        for v in action.votes.select_related("user__membership")
    ]
