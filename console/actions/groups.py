"""Changes people make to a consistency group: its serving SLO overrides.

Owns validating and storing a group's SLO (keys are console.diagnosis.records.ServingSlo's
fields, the one definition), the audit entry and the re-diagnosis after commit. It must
not touch the group's live state (ingest and the pipeline own that).
"""

from __future__ import annotations

from dataclasses import fields
from datetime import datetime
from typing import Any

from django.db import transaction

from console import events, scheduling
from console.actions.audit import actor_name, audit
from console.actions.errors import SloError
from console.diagnosis.records import ServingSlo
from console.models import ConsistencyGroup
from console.roles import Actor

SLO_KEYS = frozenset(f.name for f in fields(ServingSlo))
RATIO_KEYS = frozenset({"goodput_target"})
MAX_MS = 3_600_000


def validated_slo(raw: dict[str, Any]) -> dict[str, float]:
    """The overrides as floats; raises SloError naming the key, the value and the range."""
    unknown = sorted(set(raw) - SLO_KEYS)
    if unknown:
        raise SloError(f"unknown SLO key(s) {', '.join(unknown)}; allowed: {sorted(SLO_KEYS)}")
    out: dict[str, float] = {}
    for key, value in raw.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SloError(f"{key} must be a number, got {value!r}")
        if key in RATIO_KEYS and not 0 < value <= 1:
            raise SloError(f"{key} must be in (0, 1], got {value}")
        if key not in RATIO_KEYS and not 0 < value <= MAX_MS:
            raise SloError(f"{key} must be a positive number of milliseconds, got {value}")
        out[key] = float(value)
    return out


@transaction.atomic
def set_group_slo(
    *, group_name: str, slo: dict[str, Any], actor: Actor, now: datetime
) -> ConsistencyGroup:
    """Replace a serving group's SLO overrides (absent keys fall back to defaults)."""
    values = validated_slo(slo)
    group = ConsistencyGroup.objects.select_for_update().get(name=group_name)
    before = group.slo
    group.slo = values
    group.save(update_fields=["slo"])
    audit(actor=actor_name(actor), verb="group.slo_changed", obj=group, now=now,
          data={"before": before, "after": values})  # fmt: skip
    events.publish_on_commit(
        events.group_channel(group.name), "group.changed", {"name": group.name}
    )
    transaction.on_commit(lambda: scheduling.schedule_diagnosis(group.name))
    return group
