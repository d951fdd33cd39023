"""A record stamp that the clock-skew correction would push outside the calendar is a 400.

Found by the schema-driven fuzz run (tests/server/test_api_fuzz.py): a batch sent "in the
year 6721" with a record stamped in 1002 made the correction overflow, and ingest answered
500. The agent's fault, so 400, and nothing stored. Since the decoder bounds `sent_at` and
every `ts` to 2000-2100 (docs/contract.md), such a batch is refused there, naming `sent_at`;
the correction's own check (ingest/store/errors.py) stays for stamps inside the bounds.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import make_batch

pytestmark = pytest.mark.django_db


def test_it_refuses_a_stamp_the_skew_correction_cannot_represent(post_batch: Any) -> None:
    from ingest.models import AgentState

    batch = make_batch([{"kind": "heartbeat", "uptime_s": 1.0, "ts": "1002-09-05T04:14:33Z"}],
                       node="n-skew", seq=1)  # fmt: skip
    batch["sent_at"] = "6721-07-22T09:47:53Z"
    response = post_batch(batch)
    assert response.status_code == 400, response.content
    assert "sent_at" in response.json()["error"]
    assert not AgentState.objects.filter(node__name="n-skew").exists()
