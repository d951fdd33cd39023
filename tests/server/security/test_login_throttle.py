"""Login throttle: the counter keys on the name Django authenticates."""

from __future__ import annotations

import pytest
from django.test import override_settings

pytestmark = pytest.mark.django_db


@override_settings(LOGIN_FAILURE_LIMIT=3)
def test_it_keeps_a_locked_out_user_locked_out_under_a_look_alike_name(client, cast):
    for _ in range(3):
        response = client.post("/login/", {"username": "viewer", "password": "wrong"})
        assert response.status_code == 200  # the form again, with its error
    # Fullwidth "viewer" (U+FF56...) is NFKC-normalised to "viewer" by Django's login form.
    look_alike = "\uff56\uff49\uff45\uff57\uff45\uff52"
    response = client.post("/login/", {"username": look_alike, "password": "pw-viewer-123"})
    assert response.status_code == 429
    assert "_auth_user_id" not in client.session


@override_settings(LOGIN_FAILURE_LIMIT=3)
def test_it_counts_look_alike_failures_against_the_real_name(client, cast):
    look_alike = "\uff56\uff49\uff45\uff57\uff45\uff52"
    for _ in range(3):
        client.post("/login/", {"username": look_alike, "password": "wrong"})
    response = client.post("/login/", {"username": "viewer", "password": "pw-viewer-123"})
    assert response.status_code == 429


@override_settings(LOGIN_FAILURE_LIMIT=3)
def test_it_still_lets_the_right_password_in_below_the_limit(client, cast):
    client.post("/login/", {"username": "viewer", "password": "wrong"})
    response = client.post("/login/", {"username": "viewer", "password": "pw-viewer-123"})
    assert response.status_code == 302
