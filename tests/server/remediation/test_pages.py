"""The approvals queue and the audit log pages: server-side role checks, CSRF, filters."""

from __future__ import annotations

import pytest
from django.test import Client

from console.models import Action

pytestmark = pytest.mark.django_db


@pytest.fixture
def held(pool, propose):
    """The third cordon in the pool: above the blast-radius limit."""
    for i in range(2):
        propose(f"node:n-{i:02d}")
    return propose("node:n-02").action


def test_it_shows_the_blast_radius_and_dry_run_before_the_approve_button(client, cast, held):
    client.force_login(cast["approver"])
    page = client.get("/approvals/").content.decode()
    block = page[page.index(f'data-action="{held.pk}"') :]
    blast = block.index("blocked by blast radius: 2 of 10 nodes in pool a100")
    preview = block.index("would hold cordon_node on node:n-02 for 2 human approval(s)")
    button = block.index('value="approve"')
    assert blast < button and preview < button


def test_it_shows_a_viewer_no_buttons_and_refuses_a_forced_post(client, cast, held):
    client.force_login(cast["viewer"])
    page = client.get("/approvals/").content.decode()
    assert 'value="approve"' not in page and "node:n-02" in page
    response = client.post(f"/approvals/{held.pk}/vote/", {"decision": "approve"})
    assert response.status_code == 403
    assert Action.objects.get(pk=held.pk).votes.count() == 0


def test_it_refuses_a_vote_without_a_csrf_token(cast, held):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(cast["approver"])
    response = browser.post(f"/approvals/{held.pk}/vote/", {"decision": "approve"})
    assert response.status_code == 403
    assert Action.objects.get(pk=held.pk).votes.count() == 0


def test_it_records_an_approvers_vote_from_the_page(client, cast, pool, propose):
    action = propose("node:n-04").action
    client.force_login(cast["approver"])
    response = client.post(f"/approvals/{action.pk}/vote/", {"decision": "approve"}, follow=True)
    assert response.status_code == 200
    assert Action.objects.get(pk=action.pk).state == "approved"
    assert f"action {action.pk} is approved" in response.content.decode()


def test_it_filters_the_audit_log_by_verb_and_actor(client, cast, held):
    client.force_login(cast["viewer"])
    page = client.get("/audit/?verb=gate.held").content.decode()
    assert "blocked by blast radius" in page and "action.proposed" not in page
    assert "No audit rows match." in client.get("/audit/?actor=nobody").content.decode()


def test_it_sends_anonymous_visitors_to_the_login_page(client):
    for url in ("/approvals/", "/audit/"):
        response = client.get(url)
        assert response.status_code == 302 and response.url.startswith("/login/")


def _in_flight(pool, propose, vote, now):
    from console import actions

    action = propose("node:n-04").action
    vote(action.pk, "approver")
    actions.dispatch_for_node(node=pool[4], now=now)
    return Action.objects.get(pk=action.pk)


def test_it_shows_in_flight_actions_with_their_deadline_and_lets_an_admin_abandon(
    client, cast, pool, propose, vote, now
):
    action = _in_flight(pool, propose, vote, now)
    client.force_login(cast["approver"])
    page = client.get("/approvals/").content.decode()
    assert 'id="in-flight"' in page and "node:n-04" in page and "Abandon" not in page
    assert client.post(f"/approvals/{action.pk}/abandon/", {"reason": "gone"}).status_code == 403
    client.force_login(cast["admin"])
    assert "Abandon" in client.get("/approvals/").content.decode()
    response = client.post(
        f"/approvals/{action.pk}/abandon/", {"reason": "node reimaged"}, follow=True
    )
    assert "abandoned" in response.content.decode()
    assert Action.objects.get(pk=action.pk).state == "failed"


def test_it_abandons_over_rest_for_an_admin_only(client, cast, pool, propose, vote, now):
    action = _in_flight(pool, propose, vote, now)
    client.force_login(cast["approver"])
    url = f"/api/v1/actions/{action.pk}/abandon/"
    assert client.post(url, {"reason": "x"}, content_type="application/json").status_code == 403
    detail = client.get(f"/api/v1/actions/{action.pk}/").json()
    assert detail["deadline"] is not None
    client.force_login(cast["admin"])
    body = client.post(url, {"reason": "agent lost"}, content_type="application/json").json()
    assert body["action"]["state"] == "failed"
    assert body["action"]["result"]["abandoned"] is True
