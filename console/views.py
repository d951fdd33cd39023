"""Server-rendered pages and the incident forms: build the page's data, render. Thin.

Page data comes from console.api.pages (the same dicts the JSON twins return, so a live
page refetches exactly what it rendered); incident changes go through console.actions.
"""

from __future__ import annotations

import html
from typing import Any

from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import SafeString, mark_safe
from django.views.decorators.http import require_POST
from rest_framework.exceptions import ValidationError

from agents.vocab import HEALTH_OK
from console import actions, formats, queries, remediation_queries
from console.api import objectives as objective_views
from console.api import pages
from console.api.reliability import DEFAULT_DAYS, days_of
from console.choices import GroupState
from console.policy.lifecycle import ActionKind
from console.policy.roles import Permission
from console.queries import recovery
from console.roles import allowed


@login_required
def fleet(request: HttpRequest) -> HttpResponse:
    data = pages.fleet_data(
        label=request.GET.get("label"),
        state=request.GET.get("state"),
        hardware=request.GET.get("hardware"),
    )
    grid = _node_grid(data["nodes"])
    return render(
        request, "console/fleet.html", {**data, "states": GroupState.values, "node_grid": grid}
    )


def _node_grid(nodes: list[dict[str, Any]]) -> SafeString:
    """The fleet grid's markup, every node in order: a compact tile or a card with its GPUs.

    Built here, not in the template: the template engine spent more on 2,048 tiles (and
    on each sick card's GPU cells) than the queries did. The same markup the
    template wrote, and the same as static/console/fleet.js draws for a live push; every
    value is escaped as the template's autoescape did (`html.escape`, which Django's
    `escape` wraps: 3,000 calls through Django's lazy wrapper were a third of the grid).
    """
    parts: list[str] = []
    for n in nodes:
        name = _esc(n["name"])
        if n["compact"]:
            gpus = n["gpus"]
            parts.append(
                f'<div class="node compact health-{HEALTH_OK}" data-node="{name}" '
                f'data-gpus="{gpus}" title="{name} · {gpus} GPUs {HEALTH_OK}">'
                f'<span class="node-name">{name}</span></div>'
            )
        else:
            parts.append(_node_card(n, name))
    return mark_safe("\n    ".join(parts))  # noqa: S308 - every value escaped above


def _node_card(n: dict[str, Any], name: str) -> str:
    worst, lifecycle = _esc(n["worst"]), _esc(n["lifecycle"])
    marks = (" quarantined" if n["quarantined"] else "") + (" cordoned" if n["cordoned"] else "")
    latched = n["lifecycle"] != "healthy"
    flags = ""
    if latched:
        reason = _esc(n["lifecycle_reason"])
        out_by = f" · out by {_esc(n['taken_out_by'])}" if n["taken_out_by"] else ""
        since = ""
        if ts := formats.parse(n["lifecycle_since"]):
            at, utc = _esc(ts.isoformat()), formats.absolute(ts)
            rel = formats.relative(ts, timezone.now())
            since = f' · <time class="since" datetime="{at}" title="{utc}">{rel}</time>'
        flags = (
            f'<span class="flag lifecycle lifecycle-{lifecycle}" data-lifecycle="{lifecycle}" '
            f'title="{reason}{out_by}">{lifecycle}{since}</span>'
        )
    if n["replace_flagged"]:
        flags += '<span class="flag flag-replace">replace</span>'
    if n["quarantined"]:
        flags += '<span class="flag flag-quarantined">quarantined</span>'
    if n["cordoned"]:
        flags += '<span class="flag flag-cordoned">cordoned</span>'
    url = _esc(reverse("node", args=[n["name"]]))
    reason_row = (
        f'<div class="node-reason muted small">{_esc(n["lifecycle_reason"])}</div>'
        if latched
        else ""
    )
    cells = "".join(
        f'<span class="gpu health-{_esc(d["health"])}" data-gpu="{_esc(d["uuid"])}" '
        f'title="GPU {d["index"]} · {_esc(d["health"])} · {_or_unknown(d["temp_c"])} °C · '
        f'{_or_unknown(d["util_pct"])} %">{d["index"]}</span>'
        for d in n["devices"]
    )
    return (
        f'<div class="node health-{worst}{marks}" data-node="{name}" '
        f'data-lifecycle="{lifecycle}">\n'
        f'      <div class="node-head"><span class="node-name"><a href="{url}">{name}</a>{flags}'
        f'</span><span class="badge">{worst}</span></div>\n'
        f"      {reason_row}\n"
        f'      <div class="gpus">{cells}</div>\n'
        f"    </div>"
    )


def _or_unknown(value: Any) -> str:
    return "?" if value is None else _esc(value)


def _esc(value: Any) -> str:
    return html.escape(str(value))


@login_required
def reliability_page(request: HttpRequest) -> HttpResponse:
    """The fleet's reliability record: tables server-side, Plotly charts from the same dict."""
    try:
        days = days_of(request.GET)
    except ValidationError:
        days = DEFAULT_DAYS
    report = recovery.fleet_report(days=days, now=timezone.now())
    return render(request, "console/reliability.html", {"r": report, "days": days})


@login_required
def node_page(request: HttpRequest, name: str) -> HttpResponse:
    detail = queries.node_detail(name)
    if detail is None:
        raise Http404(f"node {name} is not in the fleet inventory")
    can_return = allowed(request.user, Permission.RETURN_TO_SERVICE)
    return render(request, "console/node.html", {"d": detail, "can_return": can_return})


@login_required
@require_POST
def node_return(request: HttpRequest, name: str) -> HttpResponse:
    """An approver states why the node is repaired; the write path checks the role."""
    try:
        actions.return_to_service(
            node_name=name,
            actor=request.user,
            reason=request.POST.get("reason", ""),
            now=timezone.now(),
        )
    except (actions.ChangeError, actions.NotAllowed, actions.NotFound) as exc:
        messages.error(request, str(exc))
    return redirect("node", name=name)


@login_required
def group_page(request: HttpRequest, name: str) -> HttpResponse:
    group = get_object_or_404(queries.groups_overview(), name=name)
    return render(
        request,
        "console/group.html",
        {"group": pages.group_data(group), "objectives": objective_views.payload(group)},
    )


@login_required
def incident_page(request: HttpRequest, pk: int) -> HttpResponse:
    incident = pages.incident_with_related(pk)
    people = []
    if allowed(request.user, Permission.ASSIGN):
        people = list(
            get_user_model()
            .objects.filter(is_active=True)
            .order_by("username")
            .values_list("username", flat=True)[:500]
        )
    data = pages.incident_data(incident)
    return render(
        request,
        "console/incident.html",
        {
            "incident": data,
            "people": people,
            "remediation": remediation_queries.for_incident(pk),
            "action_kinds": [k.value for k in ActionKind],
            "default_target": _default_target(incident.subject, incident.root_cause),
            "no_restart": (incident.timeline or {}).get("no_restart", ""),
            "remediation_waits": (incident.timeline or {}).get("remediation_waits") or [],
        },
    )


def _default_target(subject: str, root_cause: dict[str, Any]) -> str:
    """What the propose form starts with: the faulty node, else the incident's subject."""
    node = (root_cause.get("evidence") or {}).get("node") if root_cause else None
    return f"node:{node}" if node else subject


@login_required
@require_POST
def incident_propose(request: HttpRequest, pk: int) -> HttpResponse:
    """An operator proposes an action for this incident (the gates decide who must approve)."""
    try:
        outcome = actions.propose_action(
            kind=request.POST.get("kind", ""),
            target=request.POST.get("target", "").strip(),
            reason=request.POST.get("reason", "")[:2000],
            actor=request.user,
            incident_id=pk,
            dry_run=request.POST.get("dry_run") == "on",
            now=timezone.now(),
        )
    except actions.NotAllowed as exc:
        raise PermissionDenied(str(exc)) from None
    except actions.RemediationError as exc:
        messages.error(request, str(exc))
    else:
        messages.info(
            request,
            f"action {outcome.action.pk} is {outcome.action.state}: " + "; ".join(outcome.reasons),
        )
    return redirect("incident", pk=pk)


def _version(request: HttpRequest) -> int | None:
    raw = request.POST.get("version", "")
    # isdigit() alone lets "²" through, which int() refuses (a 500): ASCII digits only.
    return int(raw) if raw.isascii() and raw.isdigit() else None


@login_required
@require_POST
def incident_acknowledge(request: HttpRequest, pk: int) -> HttpResponse:
    try:
        actions.acknowledge_incident(
            incident_id=pk,
            actor=request.user,
            now=timezone.now(),
            expected_version=_version(request),
        )
    except actions.NotAllowed as exc:  # a viewer sees no buttons; a forced POST is refused
        raise PermissionDenied(str(exc)) from None
    except actions.IncidentChangeError as exc:
        messages.error(request, str(exc))
    return redirect("incident", pk=pk)


@login_required
@require_POST
def incident_assign(request: HttpRequest, pk: int) -> HttpResponse:
    try:
        actions.assign_incident(
            incident_id=pk,
            assignee=request.POST.get("assignee", "").strip(),
            actor=request.user,
            now=timezone.now(),
            expected_version=_version(request),
        )
    except actions.NotAllowed as exc:  # a viewer sees no buttons; a forced POST is refused
        raise PermissionDenied(str(exc)) from None
    except actions.IncidentChangeError as exc:
        messages.error(request, str(exc))
    return redirect("incident", pk=pk)


@login_required
@require_POST
def incident_comment(request: HttpRequest, pk: int) -> HttpResponse:
    try:
        actions.comment_on_incident(
            incident_id=pk,
            actor=request.user,
            body=request.POST.get("body", ""),
            now=timezone.now(),
        )
    except actions.NotAllowed as exc:  # a viewer sees no buttons; a forced POST is refused
        raise PermissionDenied(str(exc)) from None
    except actions.IncidentChangeError as exc:
        messages.error(request, str(exc))
    return redirect("incident", pk=pk)
