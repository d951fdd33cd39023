from __future__ import annotations

from django.contrib import admin

from console.models import Alert, ConsistencyGroup, Device, Incident, Membership, Node, Rank


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["name", "pool", "health", "last_seen", "quarantined", "cordoned"]
    search_fields = ["name"]


@admin.register(Device)
class DeviceAdmin(admin.ModelAdmin):
    list_display = ["uuid", "node", "index", "health", "last_seen"]
    list_select_related = ["node"]


@admin.register(ConsistencyGroup)
class GroupAdmin(admin.ModelAdmin):
    list_display = ["name", "kind", "state", "generation", "restart_count", "last_activity"]


@admin.register(Rank)
class RankAdmin(admin.ModelAdmin):
    list_display = ["group", "rank", "node", "generation", "last_step", "last_step_at"]
    list_select_related = ["group", "node"]


@admin.register(Incident)
class IncidentAdmin(admin.ModelAdmin):
    list_display = ["pk", "group", "state", "severity", "summary", "opened_at"]
    list_select_related = ["group"]


admin.site.register(Alert)
admin.site.register(Membership)
