"""An incident's measured recovery costs: the write half of console.queries.recovery.

Owns storing the seed's five costs on a resolved incident (`Incident.costs`), audited once
when they become final, so the incident page, its REST and the fleet's reliability record
read one stored answer instead of re-reading telemetry. Must not read telemetry or compute
the costs: console.queries.recovery measures, console.pipeline sequences.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction

from console.actions.audit import audit
from console.actions.incidents import publish_incident
from console.models import Incident


@transaction.atomic
def record_incident_costs(
    *, incident_id: int, costs: dict[str, Any], actor: str, now: datetime
) -> bool:
    """Store `costs` on the incident; True when they changed. Audited when they are final."""
    incident = (
        Incident.objects.select_for_update(of=("self",), no_key=True)
        .select_related("group")
        .get(pk=incident_id)
    )
    stored = {**costs, "measured_at": now.isoformat()}
    if {k: v for k, v in (incident.costs or {}).items() if k != "measured_at"} == costs:
        return False
    incident.costs = stored
    incident.save(update_fields=["costs", "updated_at"])
    if costs.get("complete"):
        audit(
            actor=actor,
            verb="incident.costs_measured",
            obj=incident,
            now=now,
            data={
                k: costs.get(k)
                for k in ("detection_s", "quiesce_s", "lost_steps", "restore_s", "repeated_steps")
            },
        )
    publish_incident(incident)
    return True
