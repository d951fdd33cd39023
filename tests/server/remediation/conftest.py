"""Remediation fixtures: a 10-node pool with GPUs, a training group, and helpers."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from django.utils import timezone

from console import actions
from console.models import ConsistencyGroup, Device, Node, Rank


@pytest.fixture
def now() -> datetime:
    return timezone.now()


@pytest.fixture
def pool(db: Any) -> list[Node]:
    """Ten nodes in pool a100, one GPU each; group "llama" at generation 3 on n-00/n-01."""
    nodes = [Node.objects.create(name=f"n-{i:02d}", pool="a100") for i in range(10)]
    for i, node in enumerate(nodes):
        Device.objects.create(uuid=f"GPU-{i:04d}", node=node, index=0)
    group = ConsistencyGroup.objects.create(name="llama", generation=3, state="running")
    for rank, node in enumerate(nodes[:2]):
        Rank.objects.create(group=group, rank=rank, node=node, generation=3)
    return nodes


@pytest.fixture
def propose(cast: dict[str, Any], now: datetime):
    """propose(target, kind="cordon_node", by="operator") -> Outcome."""

    def make(target: str, kind: str = "cordon_node", by: str = "operator", **kw: Any) -> Any:
        return actions.propose_action(
            kind=kind,
            target=target,
            reason="xid 79 storm",
            actor=cast[by],
            now=kw.pop("at", now),
            **kw,
        )

    return make


@pytest.fixture
def vote(cast: dict[str, Any], now: datetime):
    def cast_vote(action_id: int, by: str, approve: bool = True, **kw: Any) -> Any:
        return actions.vote_on_action(
            action_id=action_id, actor=cast[by], approve=approve, now=kw.pop("at", now), **kw
        )

    return cast_vote
