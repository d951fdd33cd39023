"""The incident page: root cause first, folded symptoms, and the operator's forms."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from console.models import Action, Alert, Incident

pytestmark = pytest.mark.django_db


def _url(incident: Incident, action: str = "") -> str:
    return f"/incidents/{incident.pk}/" + (f"{action}/" if action else "")


def _add_symptoms(incident: Incident, count: int) -> None:
    now = datetime.now(UTC)
    Alert.objects.bulk_create(
        [
            Alert(
                incident=incident,
                finding_id=f"s{i}",
                kind="rank_hang" if i % 3 else "straggler",
                subject=f"rank:llm-pages/{i}",
                role="symptom",
                severity="minor",
                summary=f"rank {i} waits",
                first_seen=now,
                last_seen=now,
            )
            for i in range(count)
        ]
    )


def test_it_puts_the_root_cause_with_its_evidence_first(client, cast, training_group):
    client.force_login(cast["viewer"])
    incident = training_group["incident"]
    html = client.get(_url(incident)).content.decode()
    assert incident.kind == "nan_loss"
    assert html.index(incident.summary) < html.index('id="symptoms"')
    assert "first step" in html  # evidence keys are spelled out
    assert "is NOT safe" in html


def test_it_folds_symptoms_by_kind_with_counts_and_the_reason(client, cast, training_group):
    client.force_login(cast["viewer"])
    incident = training_group["incident"]
    _add_symptoms(incident, 9)
    html = client.get(_url(incident)).content.decode()
    assert '<span class="count">6</span><code>rank_hang</code>' in html
    assert '<span class="count">3</span><code>straggler</code>' in html
    assert f"explained by root cause nan_loss on {incident.subject}" in html


def test_it_renders_the_incident_page_in_queries_independent_of_symptoms(
    client, cast, training_group, django_assert_max_num_queries
):
    client.force_login(cast["operator"])
    incident = training_group["incident"]
    _add_symptoms(incident, 300)
    # + the incident's actions; + 3 bounded telemetry reads for its recovery costs
    # (transitions since its first evidence, when the failed generation last stepped, its
    # steps of the 2 min before that by step); + the group's nodes, for the pool whose
    # default objectives the costs are judged against; + the exit the group's launcher
    # named its root cause (console.queries.launcher).
    with django_assert_max_num_queries(13):
        assert client.get(_url(incident)).status_code == 200


def test_it_shows_a_viewer_no_action_buttons(client, cast, training_group):
    client.force_login(cast["viewer"])
    html = client.get(_url(training_group["incident"])).content.decode()
    assert 'id="incident-actions"' not in html and 'id="ack-button"' not in html


def test_it_refuses_a_forced_acknowledge_from_a_viewer(client, cast, training_group):
    client.force_login(cast["viewer"])
    incident = training_group["incident"]
    assert client.post(_url(incident, "acknowledge")).status_code == 403
    incident.refresh_from_db()
    assert incident.state == "open"


def test_it_refuses_a_forced_comment_from_a_viewer(client, cast, training_group):
    client.force_login(cast["viewer"])
    incident = training_group["incident"]
    assert client.post(_url(incident, "comment"), {"body": "hi"}).status_code == 403
    assert incident.comments.count() == 0


@pytest.mark.parametrize("name", ["approver", "nobody-by-this-name", ""])
def test_a_viewers_forced_assign_is_refused_alike_whoever_it_names(
    client, cast, training_group, name
):
    # The same 403 for a real user, an unknown name and none: no oracle for which names exist.
    client.force_login(cast["viewer"])
    incident = training_group["incident"]
    response = client.post(_url(incident, "assign"), {"assignee": name})
    assert response.status_code == 403
    incident.refresh_from_db()
    assert incident.assignee is None


def test_an_operator_naming_an_unknown_user_is_told_and_nothing_changes(
    client, cast, training_group
):
    client.force_login(cast["operator"])
    incident = training_group["incident"]
    response = client.post(
        _url(incident, "assign"), {"assignee": "nobody-by-this-name"}, follow=True
    )
    assert "no active user named &#x27;nobody-by-this-name&#x27;" in response.content.decode()
    incident.refresh_from_db()
    assert incident.assignee is None


def test_it_acknowledges_through_the_form_and_shows_it_on_the_timeline(
    client, cast, training_group
):
    client.force_login(cast["operator"])
    incident = training_group["incident"]
    response = client.post(_url(incident, "acknowledge"), {"version": incident.version})
    assert response.status_code == 302
    incident.refresh_from_db()
    assert (incident.state, incident.acknowledged_by) == ("acknowledged", cast["operator"])
    html = client.get(_url(incident)).content.decode()
    assert "· acknowledged</div>" in html


def test_it_refuses_an_acknowledge_against_a_stale_version(client, cast, training_group):
    client.force_login(cast["operator"])
    incident = training_group["incident"]
    response = client.post(
        _url(incident, "acknowledge"), {"version": incident.version - 1}, follow=True
    )
    assert "reload and try again" in response.content.decode()
    incident.refresh_from_db()
    assert incident.state == "open"


def test_it_assigns_and_comments_through_the_forms(client, cast, training_group):
    client.force_login(cast["operator"])
    incident = training_group["incident"]
    client.post(_url(incident, "assign"), {"assignee": "approver", "version": incident.version})
    client.post(_url(incident, "comment"), {"body": "draining node-p1"})
    incident.refresh_from_db()
    assert incident.assignee == cast["approver"]
    data = client.get(f"/api/v1/pages/incidents/{incident.pk}/").json()
    assert data["assignee"] == "approver"
    assert [t["body"] for t in data["timeline"] if t["kind"] == "comment"] == ["draining node-p1"]


def test_it_refuses_a_get_on_the_acknowledge_url(client, cast, training_group):
    client.force_login(cast["operator"])
    assert client.get(_url(training_group["incident"], "acknowledge")).status_code == 405


def test_it_shows_why_the_policy_will_not_restart_after_nan(client, cast, training_group):
    client.force_login(cast["viewer"])
    html = client.get(_url(training_group["incident"])).content.decode()
    block = html[html.index('id="remediation"') :]
    assert 'id="no-restart"' in block and "no automatic restart after nan_loss" in block
    assert "Nothing proposed for this incident." in block
    assert 'id="propose-form"' not in html


def test_it_lets_an_operator_propose_from_the_incident_page(client, cast, training_group):
    incident = training_group["incident"]
    client.force_login(cast["operator"])
    response = client.post(
        _url(incident, "propose"),
        {"kind": "cordon_node", "target": "node:node-p1", "reason": "NaN came from this node"},
        follow=True,
    )
    html = response.content.decode()
    action = Action.objects.get(incident=incident)
    assert (action.kind, action.target, action.proposed_by.username) == (
        "cordon_node",
        "node:node-p1",
        "operator",
    )
    assert f"action {action.pk} is proposed" in html
    assert f'data-action="{action.pk}"' in html[html.index('id="remediation"') :]


def test_it_refuses_a_forced_proposal_from_a_viewer(client, cast, training_group):
    client.force_login(cast["viewer"])
    data = {"kind": "cordon_node", "target": "node:node-p1", "reason": "x y z"}
    assert client.post(_url(training_group["incident"], "propose"), data).status_code == 403
    assert Action.objects.count() == 0
