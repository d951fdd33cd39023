from __future__ import annotations

import json
from datetime import timedelta

import pytest

from console.notify.webhook import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    SignatureError,
    request,
    sign,
    verify,
)
from tests.notify.cast import NOW, notification

SECRET = "s3cret-for-tests"


def test_it_sends_the_incident_as_json() -> None:
    body, headers = request(notification(), SECRET, NOW)
    doc = json.loads(body)
    assert doc["event"] == "trigger"
    assert doc["dedup_key"] == "faultline:inc-42"
    assert doc["evidence"] == {"xid": 79, "node": "node-017"}
    assert headers["Content-Type"] == "application/json"


def test_it_verifies_its_own_signature() -> None:
    body, headers = request(notification(), SECRET, NOW)
    verify(body, headers, SECRET, NOW + timedelta(seconds=30))


def test_it_rejects_a_tampered_body() -> None:
    body, headers = request(notification(), SECRET, NOW)
    with pytest.raises(SignatureError, match="does not match"):
        verify(body.replace(b"critical", b"info"), headers, SECRET, NOW)


def test_it_rejects_the_wrong_secret() -> None:
    body, headers = request(notification(), SECRET, NOW)
    with pytest.raises(SignatureError):
        verify(body, headers, "other", NOW)


def test_it_rejects_a_replay_outside_the_tolerance() -> None:
    body, headers = request(notification(), SECRET, NOW)
    with pytest.raises(SignatureError, match="replayed or clock skew"):
        verify(body, headers, SECRET, NOW + timedelta(minutes=6))


def test_it_rejects_a_new_timestamp_on_an_old_signature() -> None:
    body, headers = request(notification(), SECRET, NOW)
    later = NOW + timedelta(minutes=10)
    forged = {**headers, TIMESTAMP_HEADER: str(int(later.timestamp()))}
    with pytest.raises(SignatureError, match="does not match"):
        verify(body, forged, SECRET, later)


def test_it_accepts_any_of_several_signatures_during_rotation() -> None:
    body = b'{"a":1}'
    old = sign(body, "old", NOW)[SIGNATURE_HEADER]
    new = sign(body, "new", NOW)
    headers = {**new, SIGNATURE_HEADER: f"{old}, {new[SIGNATURE_HEADER]}"}
    verify(body, headers, "old", NOW)
    verify(body, headers, "new", NOW)


def test_it_reads_headers_case_insensitively() -> None:
    body, headers = request(notification(), SECRET, NOW)
    verify(body, {k.lower(): v for k, v in headers.items()}, SECRET, NOW)


def test_it_rejects_missing_headers() -> None:
    with pytest.raises(SignatureError, match="missing"):
        verify(b"{}", {}, SECRET, NOW)


def test_it_refuses_to_sign_without_a_secret() -> None:
    with pytest.raises(ValueError, match="secret is required"):
        sign(b"{}", "", NOW)
