from __future__ import annotations

from django.urls import path

from console import views

urlpatterns = [
    path("", views.fleet, name="fleet"),
    path("groups/<str:name>/", views.group_page, name="group"),
    path("incidents/<int:pk>/", views.incident_page, name="incident"),
]
