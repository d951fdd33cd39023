"""Every remediation endpoint x anonymous, viewer, operator, approver, admin: the exact set."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from console import actions
from console.models import EscalationPolicy

pytestmark = pytest.mark.django_db

ROLES = ["anonymous", "viewer", "operator", "approver", "admin"]
VIEWERS = {"viewer", "operator", "approver", "admin"}
OPERATORS = {"operator", "approver", "admin"}
APPROVERS = {"approver", "admin"}
ADMINS = {"admin"}
STEPS = [{"delay_s": 0, "channels": ["hook"]}]

# (name, method, path with {action}/{silence}/{policy}, body, roles allowed)
ENDPOINTS: list[tuple[str, str, str, dict[str, Any] | None, set[str]]] = [
    ("list actions", "get", "/api/v1/actions/?state=proposed", None, VIEWERS),
    (
        "propose",
        "post",
        "/api/v1/actions/",
        {"kind": "cordon_node", "target": "node:n-05", "reason": "xid 79"},
        OPERATORS,
    ),
    ("action detail", "get", "/api/v1/actions/{action}/", None, VIEWERS),
    ("approve", "post", "/api/v1/actions/{action}/approve/", {}, APPROVERS),
    ("reject", "post", "/api/v1/actions/{action}/reject/", {}, APPROVERS),
    # Cancelling is for the proposer (here: operator) or an admin, not any approver.
    (
        "cancel",
        "post",
        "/api/v1/actions/{action}/cancel/",
        {"reason": "wrong node"},
        {"operator", "admin"},
    ),
    ("audit", "get", "/api/v1/audit/?verb=action.", None, VIEWERS),
    ("list silences", "get", "/api/v1/silences/", None, VIEWERS),
    ("create silence", "post", "/api/v1/silences/", "silence", OPERATORS),
    ("end silence", "delete", "/api/v1/silences/{silence}/", None, OPERATORS),
    ("list policies", "get", "/api/v1/escalation-policies/", None, VIEWERS),
    (
        "create policy",
        "post",
        "/api/v1/escalation-policies/",
        {"name": "new", "steps": STEPS},
        ADMINS,
    ),
    ("change policy", "patch", "/api/v1/escalation-policies/{policy}/", {"position": 5}, ADMINS),
    ("delete policy", "delete", "/api/v1/escalation-policies/{policy}/", None, ADMINS),
    ("list channels", "get", "/api/v1/notification-channels/", None, ADMINS),
    ("read breaker", "get", "/api/v1/breaker/", None, VIEWERS),
    ("open breaker", "post", "/api/v1/breaker/", {"open": True, "reason": "storm"}, OPERATORS),
    ("close breaker", "post", "/api/v1/breaker/", {"open": False, "reason": "fixed"}, ADMINS),
    # Agent-facing: a console user (even an admin) is not an agent.
    ("agent poll", "get", "/api/v1/agents/actions", None, set()),
    ("agent result", "post", "/api/v1/actions/{action}/result", {"status": "failed"}, set()),
]


@pytest.fixture
def world(pool, cast, now):
    action = actions.propose_action(
        kind="cordon_node", target="node:n-01", reason="xid 79", actor=cast["operator"], now=now
    ).action
    silence = actions.create_silence(
        matchers={"group": "llama"},
        starts_at=now,
        ends_at=now + timedelta(hours=1),
        reason="maintenance",
        actor=cast["operator"],
        now=now,
    )
    policy = EscalationPolicy.objects.create(name="default", steps=STEPS)
    actions.set_breaker(open=True, actor=cast["operator"], reason="storm", now=now)
    return {"action": action.pk, "silence": silence.pk, "policy": policy.pk, "now": now}


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize(
    ("name", "method", "path", "body", "allowed"), ENDPOINTS, ids=[e[0] for e in ENDPOINTS]
)
def test_it_allows_exactly_the_listed_roles(
    client, cast, world, role, name, method, path, body, allowed
):
    if role != "anonymous":
        client.force_login(cast[role])
    if body == "silence":
        body = {
            "matchers": {"node": "n-09"},
            "reason": "reboot",
            "ends_at": (world["now"] + timedelta(hours=2)).isoformat(),
        }
    url = path.format(**world)
    call = getattr(client, method)
    response = call(url, body, content_type="application/json") if body is not None else call(url)
    if role in allowed:
        assert 200 <= response.status_code < 300, (response.status_code, response.content)
    elif role == "anonymous" or not allowed:
        assert response.status_code == 401, response.content
    else:
        assert response.status_code == 403, response.content
        assert response.json()  # a JSON body naming the problem, never an HTML page
