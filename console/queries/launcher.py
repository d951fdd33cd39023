"""The launcher's own root cause beside Faultline's, for an incident's page and API.

Owns comparing the exit a launcher named a generation's root cause (TorchElastic's "Root
Cause (first observed failure)": the earliest error-file timestamp in whole seconds, a tie
to the lowest local rank) with the rank the incident's root cause is about. The launcher's
answer is read through console.queries.telemetry; Faultline's is the incident's. Writes
nothing; judges nothing beyond "the same rank or not".
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from console.diagnosis.findings import culprit_of
from console.models import Incident
from console.queries.telemetry import lifecycle

# How the console names each launcher that reports a root cause of its own.
LAUNCHER_NAMES = {"torchelastic": "torchrun (TorchElastic)"}


def _view(incident: Incident, row: dict[str, Any] | None) -> dict[str, Any] | None:
    if row is None:
        return None
    root = incident.root_cause or {}
    culprit = culprit_of(incident.subject, root.get("evidence") or {})
    faultline_rank = culprit[1] if culprit is not None and culprit[0] == "rank" else None
    return {
        "launcher": row["launcher_root_cause"],
        "launcher_name": LAUNCHER_NAMES.get(row["launcher_root_cause"], row["launcher_root_cause"]),
        "rank": row["rank"],
        "at": row["ts"].isoformat(),
        "exit_code": row["exit_code"],
        "signal": row["signal"],
        "reason": row["reason"],
        "error_type": row["error_type"],
        "message": row["message"],
        "faultline_rank": faultline_rank,
        # None: Faultline's root cause is about no single rank (a GPU, a node, the group).
        "agrees": None if faultline_rank is None else faultline_rank == row["rank"],
    }


def launcher_root_causes(incidents: Iterable[Incident]) -> dict[int, dict[str, Any] | None]:
    """Incident id -> its generation's launcher root cause compared (None: none named)."""
    wanted = [i for i in incidents if i.group_id is not None]
    rows = lifecycle.launcher_root_causes({(i.group_id, i.generation) for i in wanted})
    return {i.pk: _view(i, rows.get((i.group_id, i.generation))) for i in wanted}


def launcher_root_cause(incident: Incident) -> dict[str, Any] | None:
    return launcher_root_causes([incident]).get(incident.pk)
