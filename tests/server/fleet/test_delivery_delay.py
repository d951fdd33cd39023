"""A node's delivery delay: kept per batch by ingest, shown on the node page, on
/api/v1/nodes/<name>/ and per pool on /metrics."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from console.delivery import of_node, percentile
from console.models import Node
from ingest.store.delivery import DELAYS_KEPT
from tests.conftest import iso, make_batch
from tests.server.test_metrics import TOKEN, scrape, value

pytestmark = pytest.mark.django_db


def _ago(seconds: float, *, clock: float = 0.0) -> str:
    """A time `seconds` ago on a node whose clock runs `clock` seconds ahead."""
    return iso(datetime.now(UTC) + timedelta(seconds=clock - seconds))


def _hb(age: float, clock: float = 0.0) -> dict:
    return {"kind": "heartbeat", "ts": _ago(age, clock=clock)}


def _gpu(age: float, clock: float = 0.0) -> dict:
    return {"kind": "device_sample", "gpu": "GPU-d0", "index": 0, "temp_c": 50.0,
            "ts": _ago(age, clock=clock)}  # fmt: skip


def _post(post_batch, records: list[dict], *, clock: float = 0.0, node: str = "node-1", **kw):
    sent = datetime.now(UTC) + timedelta(seconds=clock)
    response = post_batch(make_batch(records, node=node, sent_at=sent, **kw))
    assert response.status_code == 202, response.content
    return response


def _node(name: str = "node-1") -> Node:
    return Node.objects.get(name=name)


def test_it_keeps_the_newest_batchs_delay_from_its_oldest_sample(post_batch):
    _post(post_batch, [_gpu(3.0), _hb(42.0), _gpu(1.0)])
    node = _node()
    assert 42.0 <= node.delivery_delay_s < 45.0
    _post(post_batch, [_hb(2.0), _gpu(2.5)])
    node = _node()
    assert 2.5 <= node.delivery_delay_s < 5.0  # the newest batch's, not the worst
    assert len(node.delivery_delays) == 2 and node.delivery_delays[0] >= 42.0


@pytest.mark.parametrize("clock", [-600.0, -4.0, 4.0, 600.0])
def test_it_reads_the_delay_on_the_services_clock_whatever_the_nodes_clock(post_batch, clock):
    _post(post_batch, [_hb(20.0, clock), _gpu(5.0, clock)], clock=clock)
    # A skew under 5 s is not corrected (ingest.store.batch): it is in the delay, as it is in
    # every time the console shows for the node.
    assert abs(_node().delivery_delay_s - 20.0) < (6.0 if abs(clock) < 5 else 2.0)


def test_a_batch_without_samples_or_a_replay_leaves_the_delay_as_it_was(post_batch):
    batch = make_batch([_hb(7.0)])
    assert post_batch(batch).status_code == 202
    before = _node()
    old_step = {"kind": "step", "group": "g", "generation": 1, "rank": 0, "step": 1,
                "ts": _ago(3600.0)}  # fmt: skip
    _post(post_batch, [old_step])  # an event's time is when it happened, not a delay
    assert post_batch(batch).json()["duplicate"] is True
    after = _node()
    assert after.delivery_delay_s == before.delivery_delay_s
    assert after.delivery_delays == before.delivery_delays


def test_it_keeps_the_newest_batches_oldest_first(post_batch):
    for age in range(1, DELAYS_KEPT + 6):
        _post(post_batch, [_hb(float(age))])
    kept = _node().delivery_delays
    assert len(kept) == DELAYS_KEPT
    assert [round(v) for v in kept] == list(range(6, DELAYS_KEPT + 6))


def test_the_p95_is_a_delay_that_was_seen():
    assert percentile([], 0.95) is None
    assert percentile([3.0], 0.95) == 3.0
    assert percentile([float(v) for v in range(1, 21)], 0.95) == 19.0
    assert percentile([float(v) for v in range(20, 0, -1)], 0.95) == 19.0  # any order
    assert percentile([1.0, 1.0, 60.0], 0.95) == 60.0
    d = of_node(0.4, [0.4, 62.0, 0.5, True, "x"])
    assert (d.newest_s, d.p95_s, d.max_s, d.batches) == (0.4, 62.0, 62.0, 3)
    assert of_node(None, None).batches == 0


def test_the_node_page_and_api_show_the_delay(post_batch, client, cast):
    client.force_login(cast["viewer"])
    _post(post_batch, [_hb(61.0)])
    for age in (0.5, 0.6, 0.7):
        _post(post_batch, [_hb(age)])
    page = client.get("/nodes/node-1/").content.decode()
    field = page.split('data-field="delivery_delay"', 1)[1].split("</dd>", 1)[0]
    assert "newest batch" in field and "worst of the last 4 batches" in field
    assert "1 min 1 s" in field or "1 min 2 s" in field  # the outage's batch is the worst
    detail = client.get("/api/v1/nodes/node-1/").json()
    assert 0.5 <= detail["delivery_delay_s"] < 3.0


def test_a_node_that_never_sent_a_sample_shows_no_delay(client, cast):
    Node.objects.create(name="quiet-1")
    client.force_login(cast["viewer"])
    page = client.get("/nodes/quiet-1/").content.decode()
    field = page.split('data-field="delivery_delay"', 1)[1].split("</dd>", 1)[0]
    assert field.strip().endswith(">—")


def test_metrics_export_the_worst_and_p95_per_pool_of_reporting_nodes(client, settings):
    settings.METRICS_TOKEN, settings.METRICS_ALLOW_CIDRS = TOKEN, []
    for i, delay in enumerate([1.0, 2.0, 3.0, 40.0]):
        Node.objects.create(name=f"a{i}", pool="a100", health="ok", delivery_delay_s=delay)
    Node.objects.create(name="gone", pool="a100", health="down", delivery_delay_s=900.0)
    Node.objects.create(name="b0", health="ok", delivery_delay_s=0.5)
    Node.objects.create(name="b1", pool="h100", health="ok")  # never reported a sample
    s = scrape(client)
    name = "faultline_pool_delivery_delay_seconds"
    assert value(s, name, pool="a100", stat="max") == 40.0  # the silent node's is not news
    assert value(s, name, pool="a100", stat="p95") == 40.0
    assert value(s, name, pool="none", stat="max") == 0.5
    assert (name, (("pool", "h100"), ("stat", "max"))) not in s


def test_the_fleet_card_carries_the_newest_delay_in_the_grid_and_the_live_push(post_batch):
    from django.db import connection

    from console import queries
    from ingest.store.fleet_card import NODE_CARD, node_card

    _post(post_batch, [_hb(33.0), _gpu(1.0)])
    (card,) = queries.node_payloads(names=["node-1"])
    assert 33.0 <= card["delivery_delay_s"] < 36.0
    grid, compact = queries.fleet_grid(compact_above=1000)
    assert not compact and grid[0]["card"] == card
    with connection.cursor() as cur:
        cur.execute(NODE_CARD.replace("%(node)s", str(_node().pk)))
        assert node_card(cur.fetchone()) == card
