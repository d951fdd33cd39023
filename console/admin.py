"""The Django admin: a read-only window on audited state, and user/role management.

Owns which models the admin shows and that it cannot change the audited ones (incidents,
alerts, actions, votes, nodes, GPUs, groups, ranks, the audit log): every such change
goes through console.actions, which names the actor in the audit log. It must not
offer edits that bypass that path, and never lists users' API tokens.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from console.models import (
    Action,
    Alert,
    AuditLog,
    ConsistencyGroup,
    Device,
    Incident,
    Membership,
    Node,
    Rank,
    Vote,
)


class ReadOnlyAdmin(admin.ModelAdmin):
    """Shows rows; adding, changing and deleting go through the audited write path."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Node)
class NodeAdmin(ReadOnlyAdmin):
    list_display = ["name", "pool", "health", "last_seen", "quarantined", "cordoned"]
    search_fields = ["name"]


@admin.register(Device)
class DeviceAdmin(ReadOnlyAdmin):
    list_display = ["uuid", "node", "index", "health", "last_seen"]
    list_select_related = ["node"]


@admin.register(ConsistencyGroup)
class GroupAdmin(ReadOnlyAdmin):
    list_display = ["name", "kind", "state", "generation", "restart_count", "last_activity"]


@admin.register(Rank)
class RankAdmin(ReadOnlyAdmin):
    list_display = ["group", "rank", "node", "generation", "last_step", "last_step_at"]
    list_select_related = ["group", "node"]


@admin.register(Incident)
class IncidentAdmin(ReadOnlyAdmin):
    list_display = ["pk", "group", "state", "severity", "summary", "opened_at"]
    list_select_related = ["group"]


@admin.register(Alert)
class AlertAdmin(ReadOnlyAdmin):
    list_display = ["pk", "incident", "kind", "subject", "role", "active", "last_seen"]


@admin.register(Action)
class ActionAdmin(ReadOnlyAdmin):
    list_display = ["pk", "kind", "target", "state", "proposed_at", "proposed_by"]
    list_select_related = ["proposed_by"]


@admin.register(Vote)
class VoteAdmin(ReadOnlyAdmin):
    list_display = ["pk", "action", "user", "decision", "cast_at"]
    list_select_related = ["user"]


@admin.register(AuditLog)
class AuditLogAdmin(ReadOnlyAdmin):
    list_display = ["ts", "actor", "verb", "object_type", "object_id", "reason"]
    list_filter = ["object_type"]
    search_fields = ["actor", "verb", "object_id"]


admin.site.register(Membership)


# User API tokens (console.ApiToken) are not registered: only their hashes are stored, and
# DRF's authtoken app (which registered clear tokens here) is no longer installed.
