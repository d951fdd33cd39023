"""Console pages: fleet, node (its return form), group, incident (its forms), approvals, audit."""

from __future__ import annotations

from django.urls import path

from console import views

urlpatterns = [
    path("", views.fleet, name="fleet"),
    path("nodes/<str:name>/", views.node_page, name="node"),
    path("nodes/<str:name>/return/", views.node_return, name="node-return"),
    path("groups/<str:name>/", views.group_page, name="group"),
    path("incidents/<int:pk>/", views.incident_page, name="incident"),
    path("reliability/", views.reliability_page, name="reliability"),
    path("incidents/<int:pk>/acknowledge/", views.incident_acknowledge, name="incident-ack"),
    path("incidents/<int:pk>/assign/", views.incident_assign, name="incident-assign"),
    path("incidents/<int:pk>/comment/", views.incident_comment, name="incident-comment"),
    path("incidents/<int:pk>/propose/", views.incident_propose, name="incident-propose"),
]

# Remediation pages: the approvals queue and the read-only audit log.
from console import pages_remediation  # noqa: E402 - appended block, kept together

urlpatterns += [
    path("approvals/", pages_remediation.approvals, name="approvals"),
    path("approvals/<int:pk>/vote/", pages_remediation.vote, name="approvals-vote"),
    path("approvals/<int:pk>/abandon/", pages_remediation.abandon, name="approvals-abandon"),
    path("audit/", pages_remediation.audit, name="audit"),
]
