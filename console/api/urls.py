from __future__ import annotations

from django.urls import path

from console.api import views

urlpatterns = [
    path("nodes/", views.NodeList.as_view(), name="api-nodes"),
    path("devices/", views.DeviceList.as_view(), name="api-devices"),
    path("agents/", views.AgentList.as_view(), name="api-agents"),
    path("groups/", views.GroupList.as_view(), name="api-groups"),
    path("groups/<str:name>/", views.GroupDetail.as_view(), name="api-group"),
    path("incidents/", views.IncidentList.as_view(), name="api-incidents"),
    path("incidents/<int:pk>/", views.IncidentDetail.as_view(), name="api-incident"),
    path("alerts/", views.AlertList.as_view(), name="api-alerts"),
]
