"""Schemathesis over every operation of the served OpenAPI schema, as every kind of caller.

The API promises "0 5xx across the whole API, all roles". Generated requests (valid and
invalid) go in-process to the WSGI app on the real test Postgres and Valkey. Each case is
replayed as anonymous, a node's agent, viewer, operator, approver and admin, and checked:
no 5xx; responses match the schema where it documents them; a caller below the endpoint's
role gets 401/403, never 2xx; and callers that may not write leave the database as it was.
Generation is derandomized with a fixed example budget, so a run is repeatable in CI.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from django.core.handlers.wsgi import WSGIHandler
from django.core.management import call_command
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from django.urls import Resolver404, resolve
from django.utils import timezone
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
)
from schemathesis.core.failures import Failure, FailureGroup
from schemathesis.core.result import Err, Ok

from faultline.nul import has_nul
from tests.conftest import iso, make_batch

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(600)]

SCHEMA_URL = "/api/schema/"
# Examples per operation and generation mode. With the real-row variants and six callers
# this is ~5,600 requests, ~35 s on a shared 2-vCPU machine; raise it for a deeper run.
EXAMPLES = {GenerationMode.POSITIVE: 10, GenerationMode.NEGATIVE: 8}
# Callers that may not write go first, so they meet the seeded rows intact.
CALLERS = ["anonymous", "viewer", "agent", "operator", "approver", "admin"]
# Who may call each operation (the access policy, stated here independently of the views).
USER_RANK = {"viewer": 1, "operator": 2, "approver": 3, "admin": 4}
ACCESS: dict[tuple[str, str], str] = {
    ("GET", "/api/v1/actions/"): "viewer",
    ("POST", "/api/v1/actions/"): "operator",
    ("GET", "/api/v1/actions/{id}/"): "viewer",
    ("POST", "/api/v1/actions/{id}/approve/"): "approver",
    ("POST", "/api/v1/actions/{id}/reject/"): "approver",
    ("POST", "/api/v1/actions/{id}/cancel/"): "operator",
    ("POST", "/api/v1/actions/{id}/abandon/"): "admin",
    ("POST", "/api/v1/actions/{id}/result"): "agent",
    ("GET", "/api/v1/agents/"): "viewer",
    ("GET", "/api/v1/agents/actions"): "agent",
    ("POST", "/api/v1/alertmanager"): "alertmanager",
    ("GET", "/api/v1/alerts/"): "viewer",
    ("GET", "/api/v1/audit/"): "viewer",
    ("GET", "/api/v1/breaker/"): "viewer",
    ("POST", "/api/v1/breaker/"): "operator",
    ("GET", "/api/v1/devices/"): "viewer",
    ("GET", "/api/v1/escalation-policies/"): "viewer",
    ("POST", "/api/v1/escalation-policies/"): "admin",
    ("GET", "/api/v1/escalation-policies/{id}/"): "viewer",
    ("PUT", "/api/v1/escalation-policies/{id}/"): "admin",
    ("PATCH", "/api/v1/escalation-policies/{id}/"): "admin",
    ("DELETE", "/api/v1/escalation-policies/{id}/"): "admin",
    ("GET", "/api/v1/groups/"): "viewer",
    ("GET", "/api/v1/groups/{name}/"): "viewer",
    ("GET", "/api/v1/groups/{name}/serving/"): "viewer",
    ("GET", "/api/v1/groups/{name}/slo/"): "viewer",
    ("PUT", "/api/v1/groups/{name}/slo/"): "operator",
    ("GET", "/api/v1/groups/{name}/objectives/"): "viewer",
    ("PUT", "/api/v1/groups/{name}/objectives/"): "operator",
    ("GET", "/api/v1/incidents/"): "viewer",
    ("GET", "/api/v1/incidents/{id}/"): "viewer",
    ("POST", "/api/v1/ingest"): "agent",
    ("GET", "/api/v1/nodes/"): "viewer",
    ("GET", "/api/v1/nodes/{name}/"): "viewer",
    ("GET", "/api/v1/notification-channels/"): "admin",
    ("POST", "/api/v1/notification-channels/"): "admin",
    ("GET", "/api/v1/notification-channels/{name}/"): "admin",
    ("PATCH", "/api/v1/notification-channels/{name}/"): "admin",
    ("POST", "/api/v1/notification-channels/{name}/disable/"): "admin",
    ("POST", "/api/v1/notification-channels/{name}/enable/"): "admin",
    ("POST", "/api/v1/notification-channels/{name}/rotate-secret/"): "admin",
    ("GET", "/api/v1/pages/fleet/"): "viewer",
    ("GET", "/api/v1/pages/groups/{name}/"): "viewer",
    ("GET", "/api/v1/pages/groups/{name}/charts/"): "viewer",
    ("GET", "/api/v1/pages/incidents/{id}/"): "viewer",
    ("GET", "/api/v1/reliability/"): "viewer",
    ("GET", "/api/v1/silences/"): "viewer",
    ("POST", "/api/v1/silences/"): "operator",
    ("GET", "/api/v1/silences/{id}/"): "viewer",
    ("DELETE", "/api/v1/silences/{id}/"): "operator",
}
CHECKS = [
    not_a_server_error,
    response_schema_conformance,
    content_type_conformance,
    response_headers_conformance,
]


def allowed(caller: str, method: str, path: str) -> bool:
    need = ACCESS[(method, path)]
    if need == "alertmanager":
        return False  # only FAULTLINE_ALERTMANAGER_TOKEN's holder; no caller here has it
    if need == "agent" or caller in ("anonymous", "agent"):
        return caller == need
    return USER_RANK[caller] >= USER_RANK[need]


@dataclass
class Tally:
    requests: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)
    writes: dict[str, dict[str, int]] = field(default_factory=dict)
    ingest: set[int] = field(default_factory=set)  # statuses the agent got from ingest


@contextmanager
def wsgi_app() -> Iterator[WSGIHandler]:
    """Django's WSGI app keeping one connection across requests, as the test client does.

    Per-request close_old_connections would reconnect to Postgres for every request
    (CONN_MAX_AGE=0), which would cost more than the requests themselves.
    """
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield WSGIHandler()
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


def generated_cases(operation: Any) -> list[Any]:
    """A fixed, derandomized sample of valid and invalid requests for one operation."""
    cases: list[Any] = []
    for mode, budget in EXAMPLES.items():

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=budget,
            derandomize=True,
            database=None,
            deadline=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        def collect(case: Any) -> None:
            cases.append(case)

        try:
            collect()
        except Unsatisfiable:  # nothing to make invalid (e.g. a GET without parameters)
            continue
    return cases


def telemetry(start: datetime, *, ranks: int = 4, steps: int = 12) -> list[dict[str, Any]]:
    """A training group "llama" on n-01: steps (NaN loss from step 10), a checkpoint."""
    out: list[dict[str, Any]] = [
        {"kind": "transition", "group": "llama", "generation": 1, "from_state": "initializing",
         "to_state": "running", "restart_count": 0, "world_size": ranks, "ts": iso(start)},
        {"kind": "checkpoint", "group": "llama", "generation": 1, "checkpoint_id": "ckpt-2",
         "step": 2, "phase": "committed", "ts": iso(start + timedelta(seconds=2))},
    ]  # fmt: skip
    for rank, step in itertools.product(range(ranks), range(steps)):
        out.append(
            {"kind": "step", "group": "llama", "generation": 1, "rank": rank, "step": step,
             "tokens": 2048, "duration_ms": 1000.0 + 300 * (rank == 3),
             "phases": {"compute": 700.0, "collective": 250.0},
             "loss": "NaN" if step >= 10 else 2.5, "ts": iso(start + timedelta(seconds=step))}
        )  # fmt: skip
    return out


def seed_fleet(cast: dict[str, Any], post_batch: Callable[..., Any]) -> dict[str, list[Any]]:
    """Real rows for path parameters to hit: telemetry, an incident, actions in each state."""
    from console import actions, pipeline
    from console.models import ConsistencyGroup, Device, Incident, Node
    from ingest.models import AgentState

    now = timezone.now()
    nodes = [Node.objects.create(name=f"n-{i:02d}", pool="a100") for i in range(6)]
    for i, node in enumerate(nodes):
        Device.objects.create(uuid=f"GPU-{i:04d}", node=node, index=0)
    start = now - timedelta(seconds=30)
    assert post_batch(make_batch(telemetry(start), node="n-01", sent_at=start)).status_code == 202
    pipeline.diagnose(group_name="llama", now=start + timedelta(seconds=15))
    incident = Incident.objects.get(group__name="llama", kind="nan_loss")
    ConsistencyGroup.objects.create(name="chat", kind="serving", state="running")
    AgentState.objects.create(node=nodes[0], agent_id="agent-n-00", version="test")

    def propose(target: str, by: str, kind: str = "cordon_node") -> Any:
        return actions.propose_action(
            kind=kind, target=target, reason="xid 79 storm", actor=cast[by], now=now
        ).action

    def approve(action: Any) -> Any:
        actions.vote_on_action(action_id=action.pk, actor=cast["approver2"], approve=True, now=now)
        return action

    made = [
        propose("node:n-02", "operator"),
        propose("node:n-03", "approver2"),
        approve(propose("node:n-00", "operator")),
        approve(propose("node:n-00", "operator", kind="drain_node")),
        propose("node:n-04", "admin"),
    ]
    actions.dispatch_for_node(node=nodes[0], now=now)
    silence = actions.create_silence(
        matchers={"subject": "gpu:*"},
        starts_at=now,
        ends_at=now + timedelta(hours=1),
        reason="maintenance",
        actor=cast["operator"],
        now=now,
    )
    policy = actions.save_escalation_policy(
        actor=cast["admin"], now=now, name="default", steps=[{"delay_s": 0, "channels": ["ops"]}]
    )
    actions.save_channel(
        actor=cast["admin"],
        now=now,
        name="ops",
        kind="webhook",
        url="http://127.0.0.1:9/hook",
        secret="s3cret",
    )
    return {
        "actions": [a.pk for a in made],
        "incidents": [incident.pk],
        "nodes": [n.name for n in nodes],
        "groups": ["llama", "chat"],
        "silences": [silence.pk],
        "escalation-policies": [policy.pk],
        "notification-channels": ["ops"],
    }


def test_the_schema_generates_without_warnings(tmp_path: Path) -> None:
    """An operation drf-spectacular cannot describe would be fuzzed blind (no response schema)."""
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(tmp_path / "s.yml"))


def test_every_operation_as_every_caller(
    cast: dict[str, Any], agent_token: Callable[[str], str], post_batch: Callable[..., Any]
) -> None:
    from django.utils import timezone

    from console import models as c_models
    from console.actions import issue_api_token

    known = seed_fleet(cast, post_batch)
    now = timezone.now()
    headers = {
        "anonymous": {},
        "agent": {"Authorization": f"Bearer {agent_token('n-00')}"},
        **{
            role: {
                "Authorization": "Token "
                + issue_api_token(username=cast[role].username, actor="test", now=now)
            }
            for role in USER_RANK
        },
    }
    # Using a token stamps its last_used_at (at most every 5 min): bookkeeping, not a write
    # by the caller, so stamp it before the snapshots compare rows.
    c_models.ApiToken.objects.update(last_used_at=now)
    started = time.monotonic()
    tally = Tally()
    with wsgi_app() as app:
        # The schema is served to logged-in callers only (viewer and up).
        schema = schemathesis.openapi.from_wsgi(SCHEMA_URL, app, headers=headers["viewer"])
        results = list(schema.get_all_operations())
        assert [r.err() for r in results if isinstance(r, Err)] == []  # every one is usable
        operations = [r.ok() for r in results if isinstance(r, Ok)]
        assert sorted((op.method.upper(), op.path) for op in operations) == sorted(ACCESS)
        plan = [(op, list(with_known_ids(generated_cases(op), known))) for op in operations]
        for caller in CALLERS:
            before = snapshot()
            for _, cases in plan:
                for case in cases:
                    check(case, caller, headers[caller], tally)
            changed = changed_rows(before, snapshot())
            tally.writes[caller] = {table: len(pks) for table, pks in changed.items()}
            tally.failures += unexpected_writes(caller, changed)
    elapsed = time.monotonic() - started
    print(
        f"\nfuzz: operations={len(plan)} callers={len(CALLERS)} "
        f"cases={sum(len(c) for _, c in plan)} requests={tally.requests} "
        f"statuses={dict(sorted(tally.statuses.items()))} seconds={elapsed:.1f}\n"
        f"rows changed by caller: {tally.writes}"
    )
    assert not tally.failures, "\n".join(tally.failures)
    # Generated batches were stored, and invalid ones got the documented 400.
    assert {202, 400} <= tally.ingest, tally.ingest


def with_known_ids(cases: list[Any], known: dict[str, list[Any]]) -> Iterator[Any]:
    """Each generated case, and for paths with parameters a copy aimed at a real row."""
    for n, case in enumerate(cases):
        yield case
        if case.operation.path == "/api/v1/ingest":
            yield from own_node_batch(case, seq=n)
            continue
        if not case.path_parameters:
            continue
        parts = case.operation.path.split("/")  # /api/v1/[pages/]<collection>/{param}/...
        rows = known[parts[4] if parts[3] == "pages" else parts[3]]
        yield case.operation.Case(
            path_parameters={key: rows[n % len(rows)] for key in case.path_parameters},
            query=case.query,
            headers=case.headers,
            body=case.body,
            media_type=case.media_type,
        )


def own_node_batch(case: Any, *, seq: int) -> Iterator[Any]:
    """A generated batch re-addressed to the agent's own node (n-00), so valid ones are
    stored rather than all refused for naming another node; a fresh seq each, sent now
    (a generated sent_at is almost never inside the decoder's stamp bounds, 2000..2100)."""
    body = case.body
    if not (isinstance(body, dict) and isinstance(body.get("agent"), dict)):
        return
    sent = timezone.now().isoformat()
    yield case.operation.Case(
        query=case.query,
        headers=case.headers,
        body={
            **body,
            "agent": {**body["agent"], "node": "n-00"},
            "seq": 10_000 + seq,
            "sent_at": sent,
        },
        media_type=case.media_type,
    )


def check(case: Any, caller: str, headers: dict[str, str], tally: Tally) -> None:
    method, path = case.method.upper(), case.operation.path
    response = case.call(headers=headers)
    status = response.status_code
    tally.requests += 1
    tally.statuses[status] = tally.statuses.get(status, 0) + 1
    if caller == "agent" and path == "/api/v1/ingest":
        tally.ingest.add(status)
    problems = []
    if not allowed(caller, method, path) and status not in (401, 403):
        # Refused for everyone before authentication: a path Django cannot route (a float
        # where an int belongs) is 404, NUL in the path or query string is 400.
        unroutable = status == 404 and not routable(case.formatted_path)
        nul = status == 400 and has_nul([case.formatted_path, case.query])
        if not (unroutable or nul):
            problems.append(f"{caller} must be refused (401/403), got {status}")
    try:
        case.validate_response(response, checks=CHECKS, headers=headers)
    except Failure as exc:
        problems.append(exc.title)
    except FailureGroup as group:
        problems += sorted({f.title + ": " + first_line(f.message) for f in group.exceptions})
    for problem in problems:
        key = f"{caller} {method} {path}: {problem}"
        if key not in tally.seen:
            tally.seen.add(key)
            body = first_line(response.text)[:200]
            tally.failures.append(f"{key}\n    -> {status} {body}\n    {case.as_curl_command()}")


def first_line(text: str) -> str:
    return next((line for line in text.strip().splitlines() if line.strip()), "")


def routable(path: str) -> bool:
    try:
        resolve(path)
    except Resolver404:
        return False
    return True


# -- what callers that may not write must leave untouched -----------------------------------


def _models() -> list[Any]:
    from django.contrib.auth import get_user_model

    from console import models as c
    from ingest import models as i

    return [
        get_user_model(), c.ApiToken, c.Membership, c.Node, c.Device, c.ConsistencyGroup, c.Rank,
        c.Incident, c.Alert, c.IncidentComment, c.Action, c.Vote, c.AuditLog, c.BreakerState,
        c.Silence, c.EscalationPolicy, c.NotificationChannel, c.IncidentEscalation,
        c.NotificationDelivery, i.AgentCredential, i.AgentState,
    ]  # fmt: skip


def snapshot() -> dict[str, dict[Any, tuple[Any, ...]]]:
    """Every row of the tables the API can write, by primary key."""
    return {
        model.__name__: {row[0]: row for row in model.objects.order_by("pk").values_list()}
        for model in _models()
    }


def changed_rows(before: dict[str, Any], after: dict[str, Any]) -> dict[str, set[Any]]:
    """Primary keys added, removed or modified, per table (tables without changes left out)."""
    changed = {
        table: {pk for pk in before[table].keys() | after[table].keys()
                if before[table].get(pk) != after[table].get(pk)}
        for table in before
    }  # fmt: skip
    return {table: pks for table, pks in changed.items() if pks}


def unexpected_writes(caller: str, changed: dict[str, set[Any]]) -> list[str]:
    """Anonymous and viewer may change nothing; the agent only its own node's actions."""
    if caller in ("operator", "approver", "admin"):
        return []
    changed = dict(changed)
    problems = []
    if caller == "agent":
        from console.models import Action, AuditLog, Node

        own = Node.objects.get(name="n-00")
        others = Action.objects.filter(pk__in=changed.pop("Action", set())).exclude(node=own)
        problems += [f"agent changed action {a.pk} of node {a.node}" for a in others]
        if changed.pop("Node", set()) - {own.pk}:
            problems.append("agent changed another node")
        actors = set(
            AuditLog.objects.filter(pk__in=changed.pop("AuditLog", set())).values_list(
                "actor", flat=True
            )
        )
        if actors - {"agent:n-00", "system"}:
            problems.append(f"agent wrote audit rows as {sorted(actors)}")
        changed.pop("BreakerState", None)  # results feed the breaker's failure count
        # Ingest: its own node's GPUs and agent state, the groups and ranks it reports on
        # (docs/security.md lists what an agent token may write).
        from console.models import Device
        from ingest.models import AgentState

        devices = Device.objects.filter(pk__in=changed.pop("Device", set())).exclude(node=own)
        problems += [f"agent wrote GPU {d.uuid} of node {d.node}" for d in devices]
        states = AgentState.objects.filter(pk__in=changed.pop("AgentState", set()))
        problems += [f"agent wrote agent state of {s.node}" for s in states.exclude(node=own)]
        changed.pop("ConsistencyGroup", None)
        changed.pop("Rank", None)
    problems += [f"{caller} changed {table} rows {sorted(pks)}" for table, pks in changed.items()]
    return problems
