from __future__ import annotations

from django.contrib import admin

from ingest.models import AgentCredential, AgentState


@admin.register(AgentCredential)
class AgentCredentialAdmin(admin.ModelAdmin):
    list_display = ["prefix", "node", "created", "revoked_at"]
    readonly_fields = ["token_hash", "prefix"]


@admin.register(AgentState)
class AgentStateAdmin(admin.ModelAdmin):
    list_display = ["agent_id", "node", "last_seq", "batches", "duplicates", "gaps", "last_seen"]
