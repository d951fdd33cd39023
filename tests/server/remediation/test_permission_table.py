"""Every verb a person calls x every actor: allowed exactly when the permission table says.

The cases are generated: VERBS names each verb once with the Permission it needs (and
whether the actor owns the object), the expectation comes from console.policy.roles.can.
A verb that forgets its check, checks the wrong permission or disagrees with the table
fails here; a new verb taking a person's `actor` fails the registry test until it is
listed (or named in SELF_SERVICE with why).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import AnonymousUser

from console import actions
from console.actions import create_user, notifications
from console.models import Action, EscalationPolicy, Incident, NotificationChannel
from console.policy.roles import Permission, Role, can
from console.policy.votes import VoteRefused

pytestmark = pytest.mark.django_db

STEPS = [{"delay_s": 0, "channels": ["hook"]}]

# A verb's call: (actor, the objects `setup` made, now) -> anything.
Call = Callable[[Any, dict[str, Any], datetime], Any]


@dataclass(frozen=True)
class Verb:
    name: str
    permission: Permission
    call: Call
    own: bool = False  # the actor owns the object (OWNER_MAY applies)
    system_acts: bool = False  # actor=None is the system (automation), not a refusal


def _incident(now: datetime) -> Incident:
    return Incident.objects.create(
        fingerprint="fp-perm", kind="xid", subject="node:n-05", severity="warning",
        summary="xid 79 on n-05", opened_at=now,
    )  # fmt: skip


def _rule_proposal(now: datetime) -> Action:
    return actions.propose_action(
        kind="cordon_node", target="node:n-06", reason="xid 79 storm", actor=None,
        rule="perm-test", now=now,
    ).action  # fmt: skip


def setup_objects(cast: dict[str, Any], actor: Any, now: datetime) -> dict[str, Any]:
    """What any verb below needs: an incident, proposals (the actor's own and another's),
    a dispatched action, a silence, a policy, a channel, a user to edit, an open breaker."""
    other = create_user(
        actor="test", username="proposer", role="operator", password="pw-proposer-123"
    )
    own = _rule_proposal(now)
    if getattr(actor, "pk", None) is not None:
        Action.objects.filter(pk=own.pk).update(proposed_by=actor)
    theirs = _rule_proposal(now)
    Action.objects.filter(pk=theirs.pk).update(proposed_by=other)
    sent = _rule_proposal(now)
    Action.objects.filter(pk=sent.pk).update(state="dispatched", dispatched_at=now)
    admin = cast["admin"]
    actions.set_breaker(open=True, actor=admin, reason="perm test", now=now)
    silence = actions.create_silence(
        matchers={"node": "n-0*"}, starts_at=now, ends_at=now + timedelta(hours=1),
        reason="maintenance", actor=admin, now=now,
    )  # fmt: skip
    return {
        "incident": _incident(now),
        "own": own,
        "theirs": theirs,
        "sent": sent,
        "silence": silence,
        "policy": EscalationPolicy.objects.create(name="perm", steps=STEPS),
        "channel": NotificationChannel.objects.create(
            name="hook", kind="slack", url="https://hooks.slack.com/services/x"
        ),
        "user": create_user(
            actor="test", username="edited", role="viewer", password="pw-edited-123"
        ),
        "other": other,
    }


VERBS: list[Verb] = [
    # incidents
    Verb("acknowledge_incident", Permission.ACKNOWLEDGE,
         lambda a, o, now: actions.acknowledge_incident(
             incident_id=o["incident"].pk, actor=a, now=now)),
    Verb("assign_incident", Permission.ASSIGN,
         lambda a, o, now: actions.assign_incident(
             incident_id=o["incident"].pk, assignee=o["other"].username, actor=a, now=now)),
    Verb("comment_on_incident", Permission.COMMENT,
         lambda a, o, now: actions.comment_on_incident(
             incident_id=o["incident"].pk, actor=a, body="looking", now=now)),
    # remediation
    Verb("propose_action", Permission.PROPOSE,
         lambda a, o, now: actions.propose_action(
             kind="cordon_node", target="node:n-05", reason="xid 79 storm", actor=a,
             rule="" if a is not None else "perm-test", now=now),
         system_acts=True),
    Verb("vote_on_action (approve)", Permission.APPROVE,
         lambda a, o, now: actions.vote_on_action(
             action_id=o["theirs"].pk, actor=a, approve=True, now=now)),
    Verb("vote_on_action (reject)", Permission.REJECT,
         lambda a, o, now: actions.vote_on_action(
             action_id=o["theirs"].pk, actor=a, approve=False, now=now)),
    Verb("cancel_action (own)", Permission.CANCEL_ANY,
         lambda a, o, now: actions.cancel_action(
             action_id=o["own"].pk, actor=a, reason="wrong node", now=now),
         own=True),
    Verb("cancel_action (another's)", Permission.CANCEL_ANY,
         lambda a, o, now: actions.cancel_action(
             action_id=o["theirs"].pk, actor=a, reason="wrong node", now=now)),
    Verb("abandon_action", Permission.ABANDON,
         lambda a, o, now: actions.abandon_action(
             action_id=o["sent"].pk, actor=a, reason="agent is gone", now=now)),
    # automation and the fleet
    Verb("set_breaker (open)", Permission.OPEN_BREAKER,
         lambda a, o, now: actions.set_breaker(open=True, actor=a, reason="storm", now=now)),
    Verb("set_breaker (close)", Permission.CLOSE_BREAKER,
         lambda a, o, now: actions.set_breaker(open=False, actor=a, reason="fixed", now=now)),
    Verb("return_to_service", Permission.RETURN_TO_SERVICE,
         lambda a, o, now: actions.return_to_service(
             node_name="n-07", actor=a, reason="board replaced", now=now)),
    Verb("set_group_slo", Permission.SET_GROUP_OBJECTIVES,
         lambda a, o, now: actions.set_group_slo(group_name="llama", slo={}, actor=a, now=now)),
    Verb("set_group_objectives", Permission.SET_GROUP_OBJECTIVES,
         lambda a, o, now: actions.set_group_objectives(
             group_name="llama", objectives={}, actor=a, now=now)),
    # paging
    Verb("create_silence", Permission.MANAGE_SILENCES,
         lambda a, o, now: actions.create_silence(
             matchers={"node": "n-1*"}, starts_at=now, ends_at=now + timedelta(hours=1),
             reason="maintenance", actor=a, now=now)),
    Verb("expire_silence", Permission.MANAGE_SILENCES,
         lambda a, o, now: actions.expire_silence(
             silence_id=o["silence"].pk, actor=a, now=now)),
    Verb("save_escalation_policy", Permission.MANAGE_POLICIES,
         lambda a, o, now: actions.save_escalation_policy(
             actor=a, now=now, name="new", steps=STEPS)),
    Verb("delete_escalation_policy", Permission.MANAGE_POLICIES,
         lambda a, o, now: actions.delete_escalation_policy(
             policy_id=o["policy"].pk, actor=a, now=now)),
    Verb("save_channel", Permission.MANAGE_CHANNELS,
         lambda a, o, now: actions.save_channel(
             actor=a, now=now, name="chat", kind="slack",
             url="https://hooks.slack.com/services/y")),
    Verb("update_channel", Permission.MANAGE_CHANNELS,
         lambda a, o, now: notifications.update_channel(
             actor=a, now=now, name="hook", enabled=False)),
    Verb("set_channel_enabled", Permission.MANAGE_CHANNELS,
         lambda a, o, now: notifications.set_channel_enabled(
             actor=a, now=now, name="hook", enabled=False)),
    Verb("rotate_channel_secret", Permission.MANAGE_CHANNELS,
         lambda a, o, now: notifications.rotate_channel_secret(
             actor=a, now=now, name="hook", secret="s3cret-s3cret")),
    # accounts
    Verb("save_user", Permission.MANAGE_USERS,
         lambda a, o, now: actions.save_user(
             actor=a, user=o["user"], changed=["email"], created=False, now=now)),
    Verb("delete_user", Permission.MANAGE_USERS,
         lambda a, o, now: actions.delete_user(actor=a, user=o["user"], now=now)),
    Verb("record_password_change", Permission.MANAGE_USERS,
         lambda a, o, now: actions.record_password_change(actor=a, user=o["user"], now=now)),
    Verb("set_role", Permission.MANAGE_USERS,
         lambda a, o, now: actions.set_role(actor=a, user=o["user"], role="operator", now=now)),
    Verb("remove_role", Permission.MANAGE_USERS,
         lambda a, o, now: actions.remove_role(actor=a, user=o["user"], now=now)),
]  # fmt: skip

# Verbs with a person's `actor` that the table does not gate, and why.
SELF_SERVICE = {
    "record_sso_sign_in": "the signing-in user acts on their own account; the IdP decides",
}

# Who acts: each role's user, an anonymous request's user, and nobody at all.
ACTORS = [role.value for role in Role] + ["anonymous", "none"]


def _actor(name: str, cast: dict[str, Any]) -> Any:
    if name == "anonymous":
        return AnonymousUser()
    if name == "none":
        return None
    return cast[name]


def _expected(verb: Verb, actor: str) -> bool:
    if actor == "none" and verb.system_acts:
        return True
    role = actor if actor in {r.value for r in Role} else None
    return can(role, verb.permission, own=verb.own)


@pytest.mark.parametrize("actor", ACTORS)
@pytest.mark.parametrize("verb", VERBS, ids=[v.name for v in VERBS])
def test_the_verb_allows_exactly_what_the_table_says(
    verb: Verb, actor: str, pool: Any, cast: dict[str, Any], now: datetime
) -> None:
    who = _actor(actor, cast)
    objects = setup_objects(cast, who, now)
    if _expected(verb, actor):
        verb.call(who, objects, now)  # any refusal or error fails the case
    else:
        with pytest.raises((actions.NotAllowed, VoteRefused)) as refused:
            verb.call(who, objects, now)
        if isinstance(refused.value, VoteRefused):  # a vote's refusal is audited, then raised
            assert "needs the approver role" in str(refused.value)


def _person_verbs() -> set[str]:
    """Every public function in console.actions.* with an `actor` typed as a person."""
    found = set()
    for info in pkgutil.iter_modules(actions.__path__):
        module = importlib.import_module(f"console.actions.{info.name}")
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if name.startswith("_") or fn.__module__ != module.__name__:
                continue
            param = inspect.signature(fn).parameters.get("actor")
            if param is not None and "Actor" in str(param.annotation):
                found.add(name)
    return found


def test_every_verb_a_person_calls_is_in_the_registry() -> None:
    listed = {v.name.split(" ")[0] for v in VERBS}
    assert _person_verbs() - listed - set(SELF_SERVICE) == set()
    assert listed <= _person_verbs()


def test_every_permission_is_checked_by_some_verb_or_view() -> None:
    # VIEW is the API's and the pages' default; the rest each gate a verb above.
    used = {v.permission for v in VERBS} | {Permission.VIEW, Permission.CANCEL_OWN}
    assert set(Permission) == used


# A token acts as its user: through the API, the same table decides (a write reaches the
# verb; the view decides nothing). One request per API write family.
TOKEN_CALLS: list[tuple[Permission, str, str, dict[str, Any]]] = [
    (Permission.PROPOSE, "post", "/api/v1/actions/",
     {"kind": "cordon_node", "target": "node:n-05", "reason": "xid 79 storm"}),
    (Permission.CLOSE_BREAKER, "post", "/api/v1/breaker/", {"open": False, "reason": "fixed"}),
    (Permission.MANAGE_SILENCES, "post", "/api/v1/silences/",
     {"matchers": {"node": "n-1*"}, "ends_at": "in an hour", "reason": "maint"}),
    (Permission.MANAGE_POLICIES, "post", "/api/v1/escalation-policies/",
     {"name": "new", "steps": STEPS}),
    (Permission.SET_GROUP_OBJECTIVES, "put", "/api/v1/groups/llama/slo/", {}),
]  # fmt: skip


@pytest.mark.parametrize("role", [r.value for r in Role])
@pytest.mark.parametrize(
    ("permission", "method", "path", "body"), TOKEN_CALLS, ids=[c[0].value for c in TOKEN_CALLS]
)
def test_a_token_is_allowed_exactly_what_its_users_role_is(
    role: str, permission: Permission, method: str, path: str, body: dict[str, Any],
    client: Any, pool: Any, cast: dict[str, Any], now: datetime,
) -> None:  # fmt: skip
    from console.actions import issue_api_token

    actions.set_breaker(open=True, actor=cast["admin"], reason="perm test", now=now)
    token = issue_api_token(username=role, actor="admin", now=now)
    if body.get("ends_at") == "in an hour":
        body = {**body, "ends_at": (now + timedelta(hours=1)).isoformat()}
    response = getattr(client, method)(
        path, body, content_type="application/json", headers={"Authorization": f"Token {token}"}
    )
    if can(role, permission):
        assert response.status_code < 400, response.content
    else:
        assert response.status_code == 403, response.content
