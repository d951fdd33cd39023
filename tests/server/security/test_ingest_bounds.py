"""Token holders cannot make ingest answer 500 (low): far timestamps, deep JSON."""

from __future__ import annotations

import json

import pytest

from tests.conftest import make_batch

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("when", ["9999-12-31T23:59:59.999Z", "0001-01-01T00:00:00Z"])
def test_it_answers_400_for_a_sent_at_far_outside_any_real_clock(post_batch, when):
    batch = make_batch([{"kind": "heartbeat"}])
    batch["sent_at"] = when
    response = post_batch(batch)
    assert response.status_code == 400, response.content
    assert response.json()["field"] == "sent_at"
    assert "outside 2000-01-01 .. 2100-01-01" in response.json()["error"]


def test_it_names_the_record_whose_ts_is_out_of_range(post_batch):
    batch = make_batch([{"kind": "heartbeat"}, {"kind": "heartbeat", "ts": "9999-01-01T00:00:00Z"}])
    response = post_batch(batch)
    assert response.status_code == 400, response.content
    assert (response.json()["record"], response.json()["field"]) == (1, "ts")


@pytest.mark.parametrize("depth", [200, 100_000])
def test_it_answers_400_for_deeply_nested_json(post_batch, client, agent_token, depth):
    nest = "[" * depth + "]" * depth
    body = json.dumps(make_batch([{"kind": "heartbeat", "dropped": 0}])).replace(
        '"dropped": 0', f'"dropped": {nest}'
    )
    response = client.post(
        "/api/v1/ingest",
        data=body,
        content_type="application/json",
        headers={"Authorization": f"Bearer {agent_token('node-1')}"},
    )
    assert response.status_code == 400, response.content[:300]
    assert response.json()["record"] == 0


def test_it_still_accepts_a_batch_of_today(post_batch):
    assert post_batch(make_batch([{"kind": "heartbeat"}])).status_code == 202


def test_it_accepts_a_batch_between_two_and_a_half_and_eight_mib(post_batch):
    shards = [{"path": f"shard-{i:05d}-" + "p" * 480, "bytes": 1} for i in range(3000)]
    records = [
        {"kind": "checkpoint", "group": "big", "generation": 1, "checkpoint_id": f"c{n}",
         "phase": "written", "manifest": {"shards": shards}}
        for n in range(2)
    ]  # fmt: skip
    batch = make_batch(records)
    assert 2.5 * 1024 * 1024 < len(json.dumps(batch)) < 8 * 1024 * 1024
    response = post_batch(batch)
    assert response.status_code == 202, response.content[:300]
