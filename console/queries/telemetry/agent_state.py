"""Ingest's bookkeeping of its agents (sequence, gaps, spool) for the agents API. Must not
write.
"""

from __future__ import annotations

from django.db.models import QuerySet

from ingest import models as m

# The model console.api.serializers describes agents with (a ModelSerializer needs it).
AgentState = m.AgentState


def agents() -> QuerySet[AgentState]:
    """Every agent's bookkeeping (sequence, gaps, spool), by node then agent id."""
    return AgentState.objects.select_related("node").order_by("node__name", "agent_id")
