"""Changes people make to a consistency group: its serving SLO overrides and its recovery
objectives.

Owns validating and storing a group's SLO (keys are console.diagnosis.records.ServingSlo's
fields, the one definition) and the operator's recovery objectives (keys and
values are agents.protocol.Objectives', validated by console.policy.objectives), the audit
entry and the re-diagnosis after commit. It must not touch the group's live state (ingest
and the pipeline own that) nor the launcher's declaration (ingest stores it beside).
"""

from __future__ import annotations

from dataclasses import fields
from datetime import datetime
from typing import Any

from django.db import transaction

from console import events, scheduling
from console.actions.audit import actor_name, audit, require
from console.actions.errors import ObjectivesError, SloError
from console.diagnosis.records import ServingSlo
from console.models import ConsistencyGroup
from console.policy import objectives as pure_objectives
from console.policy.inputs import PolicyError
from console.policy.roles import Permission
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
    require(actor, Permission.SET_GROUP_OBJECTIVES)
    values = validated_slo(slo)
    group = ConsistencyGroup.objects.select_for_update(no_key=True).get(name=group_name)
    before = group.slo
    group.slo = values
    group.save(update_fields=["slo"])
    audit(
        actor=actor_name(actor),
        verb="group.slo_changed",
        obj=group,
        now=now,
        data={"before": before, "after": values},
    )
    events.publish_on_commit(
        events.group_channel(group.name), "group.changed", {"name": group.name}
    )
    transaction.on_commit(lambda: scheduling.schedule_diagnosis(group.name))
    return group


@transaction.atomic
def set_group_objectives(
    *, group_name: str, objectives: dict[str, Any], actor: Actor, now: datetime
) -> ConsistencyGroup:
    """Replace the operator's recovery objectives of a group (absent keys fall back to the
    launcher's, then the pool's). `goodput_target` is the group's SLO key and is stored
    there too, so the serving SLO and the objectives agree on one value."""
    require(actor, Permission.SET_GROUP_OBJECTIVES)
    try:
        values = pure_objectives.validated(objectives)
    except PolicyError as exc:
        raise ObjectivesError(str(exc)) from None
    group = ConsistencyGroup.objects.select_for_update(no_key=True).get(name=group_name)
    before = dict(group.objectives or {})
    group.objectives = {**before, pure_objectives.OPERATOR: values}
    fields_changed = ["objectives"]
    slo_before = dict(group.slo)
    if "goodput_target" in values:
        group.slo = {**group.slo, "goodput_target": float(values["goodput_target"])}
        fields_changed.append("slo")
    elif "goodput_target" in before.get(pure_objectives.OPERATOR, {}):
        group.slo = {k: v for k, v in group.slo.items() if k != "goodput_target"}
        fields_changed.append("slo")
    group.save(update_fields=fields_changed)
    audit(
        actor=actor_name(actor),
        verb="group.objectives_changed",
        obj=group,
        now=now,
        data={
            "before": before.get(pure_objectives.OPERATOR, {}),
            "after": values,
            "slo_before": slo_before,
            "slo_after": group.slo,
        },
    )
    events.publish_on_commit(
        events.group_channel(group.name), "group.changed", {"name": group.name}
    )
    transaction.on_commit(lambda: scheduling.schedule_diagnosis(group.name))
    return group
