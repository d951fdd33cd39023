"""Returning validated hardware to service: the sweep's proposals of uncordon/release.

Owns which validated nodes are proposed for return and how: a node whose validation
window passed (console.policy.fleet_health) gets one `uncordon_node` proposal (and a
`release_gpu` per isolated GPU) through `propose_action`, whose gates hold it for an
approver when the node is a repeat offender or someone else took it out. A repeat
offender is not proposed at all: it waits, flagged, for an approver. It must not decide
the gates (console.policy.gates) or move the lifecycle itself (a succeeded action does).
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction

from console import formats
from console.actions.audit import audit
from console.actions.fleet import health_policy, open_node_incident, validated_due
from console.actions.remediation import propose_action
from console.models import Action, Device, HealthEvent, Node
from console.policy.fleet_health import TakenOutBy
from console.policy.lifecycle import ActionKind

RULE = "fleet_health"


def propose_returns(*, now: datetime) -> list[int]:
    """Propose the return of every node whose validation window passed; ids proposed."""
    proposed: list[int] = []
    for node in validated_due(now=now):
        proposed += _propose_for(node, now)
    return proposed


@transaction.atomic
def _propose_for(node: Node, now: datetime) -> list[int]:
    node = Node.objects.select_for_update(no_key=True).get(pk=node.pk)
    since = node.lifecycle_since or now
    if Action.objects.filter(
        node=node,
        kind__in=[k for k in ActionKind if k.spec.effect == "put_back"],
        proposed_at__gte=since,
    ).exists():
        return []  # proposed once per validation: a rejected one waits for a person
    if node.replace_flagged:
        if not HealthEvent.objects.filter(node=node, kind="held", at__gte=since).exists():
            why = "validated, but flagged for replacement: an approver returns it"
            HealthEvent.objects.create(
                node=node,
                kind="held",
                after=node.lifecycle,
                reason=why,
                actor=f"rule:{RULE}",
                at=now,
            )
            audit(actor=f"rule:{RULE}", verb="node.return_held", obj=node, reason=why, now=now)
        return []
    window = health_policy().validation_window
    reason = (
        f"{node.name} ran {formats.duration(window.total_seconds())} after repair with no new "
        "fault; "
        "return it to service"
    )
    if node.taken_out_by not in ("", TakenOutBy.FAULTLINE):
        reason += f" (taken out by the {node.taken_out_by}: an approver decides)"
    incident = open_node_incident(node.name)
    ids = []
    for device in Device.objects.filter(node=node, isolated=True):
        out = propose_action(
            kind=ActionKind.RELEASE_GPU,
            target=f"gpu:{device.uuid}",
            reason=reason,
            actor=None,
            rule=RULE,
            trigger="validated",
            now=now,
            incident_id=incident.pk if incident else None,
            evidence={"lifecycle_since": since.isoformat(), "gpu": device.uuid},
        )
        ids.append(out.action.pk)
    out = propose_action(
        kind=ActionKind.UNCORDON_NODE,
        target=f"node:{node.name}",
        reason=reason,
        actor=None,
        rule=RULE,
        trigger="validated",
        now=now,
        incident_id=incident.pk if incident else None,
        evidence={"lifecycle_since": since.isoformat(), "repair": node.lifecycle_reason},
    )
    ids.append(out.action.pk)
    return ids
