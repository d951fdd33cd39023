"""Pages for remediation: the approvals queue and the audit log.

Thin: read through console.remediation_queries, render, and for the vote and abandon forms
call `console.actions.vote_on_action` / `abandon_action`. The verbs check the permission
table on every POST (a hidden button is not a permission; a refusal is a 403 here, a
refused vote is audited and shown) and Django's CSRF middleware guards the forms.
The audit page is read-only.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from console import actions, remediation_queries
from console.policy.roles import Permission
from console.policy.votes import VoteRefused
from console.roles import allowed


@login_required
@require_GET
def approvals(request: HttpRequest) -> HttpResponse:
    can_vote = allowed(request.user, Permission.APPROVE)
    return render(
        request,
        "console/approvals.html",
        {
            "can_vote": can_vote,
            "waiting": remediation_queries.waiting_for(request.user),
            "proposed": remediation_queries.proposed()[:200],
            "in_flight": remediation_queries.in_flight(),
            "can_abandon": allowed(request.user, Permission.ABANDON),
            "breaker": actions.breaker_payload(),
        },
    )


@login_required
@require_POST
def vote(request: HttpRequest, pk: int) -> HttpResponse:
    decision = request.POST.get("decision")
    if decision not in ("approve", "reject"):
        return HttpResponse('decision must be "approve" or "reject"', status=400)
    needed = Permission.APPROVE if decision == "approve" else Permission.REJECT
    try:  # the verb's own table entry, asked before any lookup (a forced POST: 403)
        actions.require(request.user, needed)
    except actions.NotAllowed as exc:
        return HttpResponseForbidden(str(exc))
    try:
        outcome = actions.vote_on_action(
            action_id=pk,
            actor=request.user,
            approve=decision == "approve",
            now=timezone.now(),
            reason=request.POST.get("reason", "")[:512],
        )
    except VoteRefused as exc:
        messages.error(request, str(exc))
    except actions.NotFound as exc:
        return HttpResponse(str(exc), status=404)
    else:
        messages.info(
            request, f"action {pk} is {outcome.action.state}: " + "; ".join(outcome.reasons)
        )
    return redirect("approvals")


@login_required
@require_POST
def abandon(request: HttpRequest, pk: int) -> HttpResponse:
    try:
        outcome = actions.abandon_action(
            action_id=pk,
            actor=request.user,
            reason=request.POST.get("reason", "")[:512],
            now=timezone.now(),
        )
    except actions.NotAllowed as exc:
        return HttpResponseForbidden(str(exc))
    except actions.NotFound as exc:
        return HttpResponse(str(exc), status=404)
    except actions.RemediationError as exc:
        messages.error(request, str(exc))
    else:
        messages.info(request, f"action {pk} is {outcome.action.state}: abandoned")
    return redirect("approvals")


@login_required
@require_GET
def audit(request: HttpRequest) -> HttpResponse:
    verb = request.GET.get("verb", "").strip()
    actor = request.GET.get("actor", "").strip()
    rows = remediation_queries.audit_log(verb=verb or None, actor=actor or None)
    page = Paginator(rows, 100).get_page(request.GET.get("page"))
    return render(request, "console/audit.html", {"page": page, "verb": verb, "actor": actor})
