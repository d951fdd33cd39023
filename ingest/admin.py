from __future__ import annotations

from django.contrib import admin

from ingest.models import AgentCredential, AgentState, ContractViolation, GroupMember


@admin.register(AgentCredential)
class AgentCredentialAdmin(admin.ModelAdmin):
    list_display = ["prefix", "node", "launcher_group", "created", "revoked_at"]
    readonly_fields = ["token_hash", "prefix"]


@admin.register(AgentState)
class AgentStateAdmin(admin.ModelAdmin):
    list_display = ["agent_id", "node", "last_seq", "batches", "duplicates", "gaps", "last_seen"]


@admin.register(ContractViolation)
class ContractViolationAdmin(admin.ModelAdmin):
    """Read-only: ingest's findings, including ownership refusals with no group."""

    list_display = ["ts", "kind", "subject", "group", "agent_id"]
    list_filter = ["kind"]
    search_fields = ["subject", "agent_id"]

    def has_add_permission(self, request: object) -> bool:
        return False

    def has_change_permission(self, request: object, obj: object = None) -> bool:
        return False


@admin.register(GroupMember)
class GroupMemberAdmin(admin.ModelAdmin):
    """Read-only: the nodes of a group's rendezvous (docs/security.md, "Who owns a group")."""

    list_display = ["group", "node", "left_generation"]
    search_fields = ["group__name", "node"]

    def has_add_permission(self, request: object) -> bool:
        return False

    def has_change_permission(self, request: object, obj: object = None) -> bool:
        return False
