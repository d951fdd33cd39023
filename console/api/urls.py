"""REST routes under /api/v1/ (the agent-facing ones are ingest/urls.py)."""

from __future__ import annotations

from django.urls import path

from console.api import reliability as reliability_views
from console.api import serving as serving_views
from console.api import views

urlpatterns = [
    path("nodes/", views.NodeList.as_view(), name="api-nodes"),
    path("nodes/<str:name>/", views.NodeDetail.as_view(), name="api-node"),
    path("devices/", views.DeviceList.as_view(), name="api-devices"),
    path("agents/", views.AgentList.as_view(), name="api-agents"),
    path("groups/", views.GroupList.as_view(), name="api-groups"),
    path("groups/<str:name>/", views.GroupDetail.as_view(), name="api-group"),
    path("groups/<str:name>/slo/", serving_views.GroupSlo.as_view(), name="api-group-slo"),
    path(
        "groups/<str:name>/serving/",
        serving_views.GroupServing.as_view(),
        name="api-group-serving",
    ),
    path("incidents/", views.IncidentList.as_view(), name="api-incidents"),
    path("incidents/<int:pk>/", views.IncidentDetail.as_view(), name="api-incident"),
    path("alerts/", views.AlertList.as_view(), name="api-alerts"),
    path("reliability/", reliability_views.ReliabilityReport.as_view(), name="api-reliability"),
]

# Remediation: actions and votes, audit, silences, escalation, breaker. (The agent-facing
# action poll and result are ingest's: ingest/urls.py.)
from console.api import actions as rem  # noqa: E402 - appended block, kept together
from console.api import oversight, paging  # noqa: E402

urlpatterns += [
    path("actions/", rem.ActionList.as_view(), name="api-actions"),
    path("actions/<int:pk>/", rem.ActionDetail.as_view(), name="api-action"),
    path("actions/<int:pk>/approve/", rem.ActionVote.as_view(approve=True), name="api-approve"),
    path("actions/<int:pk>/reject/", rem.ActionVote.as_view(approve=False), name="api-reject"),
    path("actions/<int:pk>/cancel/", rem.ActionCancel.as_view(), name="api-cancel"),
    path("actions/<int:pk>/abandon/", rem.ActionAbandon.as_view(), name="api-abandon"),
    path("audit/", oversight.AuditList.as_view(), name="api-audit"),
    path("silences/", paging.SilenceList.as_view(), name="api-silences"),
    path("silences/<int:pk>/", paging.SilenceDetail.as_view(), name="api-silence"),
    path("escalation-policies/", paging.PolicyList.as_view(), name="api-policies"),
    path("escalation-policies/<int:pk>/", paging.PolicyDetail.as_view(), name="api-policy"),
    path("notification-channels/", paging.ChannelList.as_view(), name="api-channels"),
    path("notification-channels/<str:name>/", paging.ChannelDetail.as_view(), name="api-channel"),
    path(
        "notification-channels/<str:name>/disable/",
        paging.ChannelEnable.as_view(enabled=False),
        name="api-channel-disable",
    ),
    path(
        "notification-channels/<str:name>/enable/",
        paging.ChannelEnable.as_view(enabled=True),
        name="api-channel-enable",
    ),
    path(
        "notification-channels/<str:name>/rotate-secret/",
        paging.ChannelRotateSecret.as_view(),
        name="api-channel-rotate",
    ),
    path("breaker/", oversight.Breaker.as_view(), name="api-breaker"),
]

# The console pages' JSON twins (what a page refetches after an event or a reconnect).
from console.api import pages  # noqa: E402 - appended section; other routes stay untouched

urlpatterns += [
    path("pages/fleet/", pages.FleetPage.as_view(), name="page-fleet"),
    path("pages/groups/<str:name>/", pages.GroupPage.as_view(), name="page-group"),
    path("pages/groups/<str:name>/charts/", pages.GroupCharts.as_view(), name="page-charts"),
    path("pages/incidents/<int:pk>/", pages.IncidentPage.as_view(), name="page-incident"),
]

# Recovery objectives and checkpoint advice of a group.
from console.api import objectives as objective_views  # noqa: E402 - appended section

urlpatterns += [
    path(
        "groups/<str:name>/objectives/",
        objective_views.GroupObjectives.as_view(),
        name="api-group-objectives",
    ),
]
