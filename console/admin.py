"""The Django admin: a read-only window on audited state, and user/role management.

Owns which models the admin shows and that it cannot change the audited ones (incidents,
alerts, actions, votes, nodes, GPUs, groups, ranks, the audit log): every such change
goes through console.actions, which names the actor in the audit log. Users and roles are
edited here, but every save, delete and password change goes through
console.actions.accounts in the admin's transaction, with an audit row; a user's staff and
superuser flags follow the role and are not edited directly, and Django's groups and
permissions (unused by Faultline's roles) are not offered. It must not offer edits that
bypass that path, and never lists users' API tokens.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.contrib.auth.forms import AdminPasswordChangeForm
from django.contrib.auth.models import Group
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from console import actions
from console.actions.accounts import role_change_problem
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


class MembershipForm(forms.ModelForm):
    """Refuses what set_role would refuse, as a form error rather than a 500."""

    class Meta:
        model = Membership
        fields = ["user", "role"]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        user = data.get("user") or getattr(self.instance, "user", None)
        if user is not None and data.get("role"):
            problem = role_change_problem(user, data["role"])
            if problem is not None:
                raise forms.ValidationError(problem)
        return data


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    """A user's role; saved through console.actions.set_role (flags, audit)."""

    form = MembershipForm
    list_display = ["user", "role"]
    list_select_related = ["user"]
    fields = ["user", "role"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return ["user"] if obj is not None else []

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        actions.set_role(actor=request.user, user=obj.user, role=obj.role, now=timezone.now())

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        actions.remove_role(actor=request.user, user=obj.user, now=timezone.now())

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        for obj in queryset.select_related("user"):
            self.delete_model(request, obj)


class AuditedUserAdmin(UserAdmin):
    """Django's user admin, saving through console.actions.accounts."""

    fieldsets = (
        (None, {"fields": ("username", "password")}),
        ("Personal info", {"fields": ("first_name", "last_name", "email")}),
        ("Access", {"fields": ("is_active", "is_staff", "is_superuser")}),
        ("Important dates", {"fields": ("last_login", "date_joined")}),
    )
    readonly_fields = ("is_staff", "is_superuser", "last_login", "date_joined")
    list_filter = ("is_staff", "is_superuser", "is_active")
    filter_horizontal = ()

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        actions.save_user(
            actor=request.user,
            user=obj,
            changed=list(form.changed_data),
            created=not change,
            now=timezone.now(),
        )

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        actions.delete_user(actor=request.user, user=obj, now=timezone.now())

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        with transaction.atomic():
            for obj in queryset:
                self.delete_model(request, obj)

    def user_change_password(self, request: HttpRequest, id: str, form_url: str = "") -> Any:
        with transaction.atomic():  # the form's save and its audit row commit together
            return super().user_change_password(request, id, form_url)

    def construct_change_message(
        self, request: HttpRequest, form: Any, formsets: Any, add: bool = False
    ) -> Any:
        # Django calls this right after the password form saved (user_change_password).
        if isinstance(form, AdminPasswordChangeForm):
            actions.record_password_change(actor=request.user, user=form.user, now=timezone.now())
        return super().construct_change_message(request, form, formsets, add)


admin.site.unregister(get_user_model())
admin.site.register(get_user_model(), AuditedUserAdmin)
admin.site.unregister(Group)  # Faultline's roles are memberships, not Django groups


# User API tokens (console.ApiToken) are not registered: only their hashes are stored, and
# DRF's authtoken app (which registered clear tokens here) is no longer installed.
