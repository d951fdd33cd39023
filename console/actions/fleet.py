"""Fleet state the console changes: node health, quarantine and cordon marks, GPU isolation.

Owns the writes to Node and Device rows outside ingest's hot path (ingest's COPY and
upserts record what agents report), each audited with its actor and followed by a
`node.changed` push after commit. It must not decide whether a change is wise: the
sweep (health) and a succeeded remediation action (marks) call in.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from django.db import transaction

from console import events, queries
from console.actions.audit import audit
from console.models import Device, Node

NodeMark = Literal["quarantined", "cordoned"]


def publish_node(name: str) -> None:
    """Push the node's fleet card once the transaction commits."""

    def publish() -> None:
        for payload in queries.node_payloads(names=[name]):
            events.publish(events.FLEET, "node.changed", payload)

    transaction.on_commit(publish)


@transaction.atomic
def set_node_health(*, name: str, health: str, actor: str, now: datetime, reason: str = "") -> bool:
    """Set a node's health (e.g. the sweep marks a silent node down); False if unchanged.

    `actor` is the name on the audit entry: "system" for the sweep.
    """
    node = Node.objects.select_for_update().filter(name=name).exclude(health=health).first()
    if node is None:
        return False
    before = node.health
    node.health = health
    node.save(update_fields=["health"])
    audit(actor=actor, verb="node.health", obj=node, reason=reason, now=now,
          data={"before": before, "after": health})  # fmt: skip
    publish_node(name)
    return True


@transaction.atomic
def mark_node(*, node_id: int, mark: NodeMark, actor: str, reason: str, now: datetime) -> None:
    """Mark a node quarantined or cordoned (the effect of a succeeded action)."""
    node = Node.objects.select_for_update().get(pk=node_id)
    setattr(node, mark, True)
    node.save(update_fields=[mark])
    audit(actor=actor, verb=f"node.{mark}", obj=node, now=now, reason=reason)
    publish_node(node.name)


@transaction.atomic
def isolate_gpu(*, uuid: str, actor: str, reason: str, now: datetime) -> None:
    """Mark a GPU isolated (the effect of a succeeded isolate_gpu action)."""
    Device.objects.filter(uuid=uuid).update(isolated=True)
    audit(actor=actor, verb="gpu.isolated", object_type="device", object_id=uuid, now=now,
          reason=reason)  # fmt: skip
