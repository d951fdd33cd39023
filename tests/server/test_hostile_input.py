"""Token holders cannot cause 500s with hostile input: a `sent_at` at the end
of the calendar on ingest. (Deeply nested JSON: security-misc's tests/server/security/.)"""

from __future__ import annotations

import pytest

from tests.conftest import make_batch

pytestmark = pytest.mark.django_db


def test_it_answers_a_sent_at_in_year_9999_with_a_400(post_batch):
    batch = make_batch([{"kind": "heartbeat", "uptime_s": 1}])
    batch["sent_at"] = "9999-12-31T23:59:59Z"
    batch["records"][0]["ts"] = "9999-12-31T23:59:59Z"
    response = post_batch(batch)
    assert response.status_code == 400, response.content
    assert "sent_at" in response.json()["error"]
