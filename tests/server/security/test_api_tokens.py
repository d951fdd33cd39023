"""User API tokens are stored as hashes and shown once."""

from __future__ import annotations

import hashlib
import io
import re

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from console.actions import issue_api_token, revoke_api_tokens
from console.models import ApiToken, AuditLog

pytestmark = pytest.mark.django_db


def _get(client, token: str):
    return client.get("/api/v1/groups/", headers={"Authorization": f"Token {token}"})


def test_it_authenticates_a_token_it_stores_only_as_a_hash(client, cast):
    token = issue_api_token(username="approver", actor="admin", now=timezone.now())
    assert _get(client, token).status_code == 200
    row = ApiToken.objects.get(user=cast["approver"])
    assert row.key_hash == hashlib.sha256(token.encode()).hexdigest()
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM console_apitoken")
        stored = repr(cursor.fetchall())
    assert token not in stored
    assert ApiToken.objects.get(pk=row.pk).last_used_at is not None


def test_it_refuses_an_unknown_token_and_the_stored_hash_itself(client, cast):
    token = issue_api_token(username="viewer", actor="admin", now=timezone.now())
    stolen_hash = ApiToken.objects.get().key_hash
    assert _get(client, "0" * 40).status_code == 401
    assert _get(client, stolen_hash).status_code == 401
    assert _get(client, token).status_code == 200


def test_it_stops_accepting_a_revoked_token_and_audits_without_the_token(client, cast):
    token = issue_api_token(username="operator", actor="admin", now=timezone.now())
    assert revoke_api_tokens(username="operator", actor="admin", now=timezone.now()) == 1
    assert _get(client, token).status_code == 401
    verbs = list(AuditLog.objects.filter(object_type="apitoken").values_list("verb", "data"))
    assert [v for v, _ in verbs] == ["token.revoked", "token.issued"]
    assert token not in repr(verbs) and token[:8] in repr(verbs)


def test_it_prints_a_working_token_once_from_the_command(client, cast):
    out = io.StringIO()
    call_command("api_token", "create", "viewer", "--name", "ci", stdout=out)
    token = re.search(r"\b[0-9a-f]{40}\b", out.getvalue()).group(0)
    assert _get(client, token).status_code == 200
    assert ApiToken.objects.get().name == "ci"


def test_it_moves_drf_plaintext_tokens_to_hashes_in_the_migration(client, cast):
    import importlib

    migration = importlib.import_module("console.migrations.0006_api_token_hashes")
    with connection.cursor() as cursor:
        # The table DRF's authtoken app left behind on an upgraded database.
        cursor.execute(
            "CREATE TABLE authtoken_token (key varchar(40) PRIMARY KEY, created timestamptz"
            " NOT NULL, user_id integer NOT NULL)"
        )
        cursor.execute(
            "INSERT INTO authtoken_token VALUES (%s, now(), %s)",
            ["a" * 40, cast["viewer"].pk],
        )

    class Editor:
        pass

    editor = Editor()
    editor.connection = connection  # type: ignore[attr-defined]  # a stand-in schema editor
    migration.hash_drf_tokens(None, editor)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM authtoken_token")
        assert cursor.fetchone() == (0,)
    assert _get(client, "a" * 40).status_code == 200
