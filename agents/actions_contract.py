"""The action contract between the service and the node agent's executor.

Owns the wire-level action vocabulary: the kinds an agent can be handed (the key of its
hook table), the two outcomes it reports, and the shape of an action on the wire
(`GET /api/v1/agents/actions`, the ingest response's `actions`). The service's state
machine (console/policy/lifecycle.py) imports these; this module must stay standard
library only and must not rename a value (agents in the field and stored rows use them).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, TypedDict


class ActionKind(StrEnum):
    QUARANTINE_NODE = "quarantine_node"
    CORDON_NODE = "cordon_node"
    DRAIN_NODE = "drain_node"
    ISOLATE_GPU = "isolate_gpu"
    ISOLATE_RANK = "isolate_rank"
    RESTART_GROUP = "restart_group"
    ROLLBACK_MODEL = "rollback_model"
    PAGE_HUMAN = "page_human"


class ResultStatus(StrEnum):
    """What the executor reports in `POST /api/v1/actions/<id>/result`."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"


class AgentAction(TypedDict):
    """One action as the agent receives it; `params` carries `reason` and `dry_run`."""

    id: int
    kind: str
    target: str
    group: str | None
    generation: int | None
    params: dict[str, Any]
