"""Small builders for gate inputs; every test states what it changes."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from console.policy.inputs import (
    ActionRecord,
    ActionRequest,
    FleetState,
    RecentActions,
    Vote,
)
from console.policy.lifecycle import ActionKind, ActionState

NOW = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)


def node(pool: str, i: int) -> str:
    return f"{pool}-{i:02d}"


def fleet(
    pools: dict[str, int] | None = None,
    *,
    quarantined: Iterable[str] = (),
    cordoned: Iterable[str] = (),
    gpus_per_node: int = 8,
    isolated_gpus: Iterable[str] = (),
    generations: dict[str, int] | None = None,
) -> FleetState:
    pools = pools if pools is not None else {"a100": 16, "h100": 16}
    node_pool = {node(p, i): p for p, count in pools.items() for i in range(count)}
    gpu_node = {f"{n}/gpu{g}": n for n in node_pool for g in range(gpus_per_node)}
    return FleetState(
        pools=pools,
        node_pool=node_pool,
        quarantined=frozenset(quarantined),
        cordoned=frozenset(cordoned),
        pool_gpus={p: c * gpus_per_node for p, c in pools.items()},
        gpu_node=gpu_node,
        isolated_gpus=frozenset(isolated_gpus),
        generations=generations if generations is not None else {"llama": 7},
    )


def request(**changes: Any) -> ActionRequest:
    base = ActionRequest(
        id="act-1",
        kind=ActionKind.CORDON_NODE,
        target="node:a100-00",
        node="a100-00",
        proposed_by="olga",
        proposed_at=NOW - timedelta(minutes=1),
        expires_at=NOW + timedelta(hours=1),
        state=ActionState.PROPOSED,
    )
    return replace(base, **changes)


def automatic(**changes: Any) -> ActionRequest:
    return request(proposed_by=None, trigger="xid:79", **changes)


def vote(voter: str, *, approve: bool = True, role: str = "approver", **changes: Any) -> Vote:
    base = Vote(action_id="act-1", voter=voter, role=role, approve=approve, cast_at=NOW)
    return replace(base, **changes)


def records(
    n: int,
    *,
    kind: ActionKind = ActionKind.CORDON_NODE,
    node_name: str | None = None,
    ago: timedelta = timedelta(minutes=1),
    automatic: bool = True,
    failed: bool = False,
) -> list[ActionRecord]:
    return [
        ActionRecord(
            kind=kind,
            target=f"node:{node_name or node('h100', i)}",
            node=node_name or node("h100", i),
            at=NOW - ago,
            automatic=automatic,
            failed=failed,
        )
        for i in range(n)
    ]


def history(*groups: list[ActionRecord]) -> RecentActions:
    return RecentActions.of(r for g in groups for r in g)
