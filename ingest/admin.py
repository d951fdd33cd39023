"""Ingest's rows in the Django admin, read-only: tokens are issued and revoked with
`faultline token` (never edited here, where no audit row would name who re-bound a token
to another node), and agent state is ingest's own bookkeeping."""

from __future__ import annotations

from django.contrib import admin

from ingest.models import AgentCredential, AgentState, ContractViolation, GroupMember


class _ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request: object) -> bool:
        return False

    def has_change_permission(self, request: object, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: object, obj: object = None) -> bool:
        return False


@admin.register(AgentCredential)
class AgentCredentialAdmin(_ReadOnly):
    list_display = ["prefix", "node", "launcher_group", "created", "revoked_at"]
    exclude = ["token_hash"]


@admin.register(AgentState)
class AgentStateAdmin(_ReadOnly):
    list_display = ["agent_id", "node", "last_seq", "batches", "duplicates", "gaps", "last_seen"]


@admin.register(ContractViolation)
class ContractViolationAdmin(_ReadOnly):
    """Ingest's findings, including ownership refusals with no group."""

    list_display = ["ts", "kind", "subject", "group", "agent_id"]
    list_filter = ["kind"]
    search_fields = ["subject", "agent_id"]


@admin.register(GroupMember)
class GroupMemberAdmin(_ReadOnly):
    """The nodes of a group's rendezvous (docs/security.md, "Who owns a group")."""

    list_display = ["group", "node", "left_generation"]
    search_fields = ["group__name", "node"]
