"""Server-side fixtures: the cast of users by role, agent tokens, posting batches."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    """Rate-limit and debounce keys live in Redis, and each process remembers what it
    queued or wrote recently: start every test without either."""
    from django.core.cache import cache

    from console import live, pipeline
    from ingest import store

    cache.clear()
    live.forget_recent()
    store.forget_recent()
    pipeline.forget_recent()


@pytest.fixture(autouse=True)
def _fast_passwords(settings: Any) -> None:
    """The cast's five passwords hashed with the shipped PBKDF2 cost 2-6 s of setup per
    test on this 2-core machine; the hash is Django's, not ours to test. Services the
    system tests start keep the shipped hasher."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def cast(db: Any) -> dict[str, Any]:
    """viewer, operator, approver, approver2, admin — each with password 'pw-<name>-123'."""
    from console.actions import create_user

    people = {}
    for name, role in [
        ("viewer", "viewer"),
        ("operator", "operator"),
        ("approver", "approver"),
        ("approver2", "approver"),
        ("admin", "admin"),
    ]:
        people[name] = create_user(
            actor="test", username=name, role=role, password=f"pw-{name}-123"
        )
    return people


@pytest.fixture
def agent_token(db: Any) -> Callable[[str], str]:
    from ingest.auth import issue_token

    return lambda node="node-1": issue_token(node_name=node)


@pytest.fixture
def post_batch(client: Any, agent_token: Callable[[str], str]) -> Callable[..., Any]:
    """POST a batch as the node's agent; returns the response (JSON in .json())."""
    tokens: dict[str, str] = {}

    def post(batch: dict[str, Any], *, token: str | None = None, **headers: str) -> Any:
        node = batch["agent"]["node"]
        if token is None:
            token = tokens.setdefault(node, agent_token(node))
        return client.post(
            "/api/v1/ingest",
            data=json.dumps(batch),
            content_type="application/json",
            headers={"Authorization": f"Bearer {token}", **headers},
        )

    return post


@pytest.fixture
def new_agent_id() -> Callable[[], str]:
    return lambda: f"agent-{uuid.uuid4()}"
