"""Agent-facing routes under /api/v1/ (the batch endpoint itself is in faultline/urls.py)."""

from __future__ import annotations

from django.urls import path

from ingest import agent_actions

urlpatterns = [
    path("actions/<int:pk>/result", agent_actions.ActionResult.as_view(), name="api-action-result"),
    path("agents/actions", agent_actions.AgentActions.as_view(), name="api-agent-actions"),
]
