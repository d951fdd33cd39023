"""What an action's target string names, and which agent runs it.

Owns resolving the target grammar (`node:<name>`, `gpu:<uuid>`, `rank:<group>/<rank>`,
`group:<name>`; which one a kind takes is its spec's `target`), and the refusal that shows
an example; and the routing inputs of console.policy.remediation.route (whether the node's
agent and its pool's controller agent report), read from the inventory with the per-pool
remediation settings.
It reads and must not write.
"""

from __future__ import annotations

from django.conf import settings

from console.actions.errors import RemediationError
from console.choices import Health
from console.models import ConsistencyGroup, Device, Node, Rank
from console.policy import remediation as rp
from console.policy.lifecycle import ActionKind, kind_spec


def remediation_policy() -> rp.RemediationPolicy:
    """Per-pool settings; read per call from FAULTLINE_REMEDIATION_POOLS (docs/safety.md)."""
    return rp.RemediationPolicy.from_dict(getattr(settings, "FAULTLINE_REMEDIATION_POOLS", None))


def controller_reporting(pool: rp.PoolPolicy) -> bool:
    """Whether the pool's controller agent is in the inventory and not silent."""
    if not pool.controller:
        return False
    health = Node.objects.filter(name=pool.controller).values_list("health", flat=True).first()
    return health is not None and health != Health.DOWN


def executor_for(
    kind: str, node: Node | None, policy: rp.RemediationPolicy | None = None
) -> tuple[Node | None, str]:
    """The node whose agent runs `kind` on `node` (None: `node`'s own), and why it waits
    ('' when an agent that reports will run it). The rule is rp.route's."""
    if node is None:
        return None, ""
    pool = (policy or remediation_policy()).for_pool(node.pool)
    reporting = node.health != Health.DOWN
    name, wait = rp.route(
        kind,
        node.name,
        pool,
        pool_name=node.pool,
        reporting=reporting,
        controller_reporting=not reporting and controller_reporting(pool),
    )
    if name is None:
        return None, wait
    executor = Node.objects.filter(name=name).first()
    if executor is None:
        return None, (
            f"{kind} on node {node.name} waits: the controller agent {name} has never "
            "reported (no node of that name in the inventory)"
        )
    return executor, wait


# What a refusal shows for each target of the grammar (agents/actions_contract.TARGETS).
_EXAMPLE = {
    "node": "node:node-17",
    "gpu": "gpu:GPU-<uuid>",
    "rank": "rank:<group>/<rank>",
    "group": "group:<name>",
    "any": "node:node-17",
}


def resolve_target(
    kind: ActionKind, target: str
) -> tuple[Node | None, str, ConsistencyGroup | None]:
    """(executing node, gpu uuid, group) for a subject string; raises if it names nothing."""
    prefix, _, name = target.partition(":")
    want = kind_spec(kind).target
    if not name or (want != "any" and prefix != want):
        raise RemediationError(f'{kind} needs a target like "{_EXAMPLE[want]}", got "{target}"')
    if prefix == "node":
        node = Node.objects.filter(name=name).first()
        if node is None:
            raise RemediationError(f'target "{target}": node {name} is not in the fleet inventory')
        return node, "", None
    if prefix == "gpu":
        device = Device.objects.select_related("node").filter(uuid=name).first()
        if device is None:
            raise RemediationError(f'target "{target}": GPU {name} is not in the fleet inventory')
        return device.node, name, None
    if prefix in ("group", "rank"):
        group_name, _, rank = name.partition("/") if prefix == "rank" else (name, "", "")
        group = ConsistencyGroup.objects.filter(name=group_name).first()
        if group is None:
            raise RemediationError(f'target "{target}": group {group_name} does not exist')
        ranks = Rank.objects.filter(group=group, node__isnull=False).select_related("node")
        if prefix == "rank":
            if not (rank.isascii() and rank.isdigit()):  # "²" passes isdigit(), not int()
                raise RemediationError(f'target "{target}": rank must be a number')
            ranks = ranks.filter(rank=int(rank))
        # A group-wide action runs on the agent of its lowest rank (the group's leader).
        member = ranks.order_by("rank").first()
        return (member.node if member else None), "", group
    raise RemediationError(f'target "{target}" must start with node:, gpu:, rank: or group:')
