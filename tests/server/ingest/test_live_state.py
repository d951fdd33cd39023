"""GPU and node live state written in one round trip: health, last sample, last_seen."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from console.models import Device, Node
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db


def _sample(gpu: str, **fields: object) -> dict:
    return {"kind": "device_sample", "gpu": gpu, "index": 0, "temp_c": 50.0, **fields}


def test_it_marks_a_gpu_named_only_by_an_xid_critical_and_keeps_its_last_sample(post_batch):
    post_batch(make_batch([_sample("GPU-x", temp_c=61.0)]))
    post_batch(make_batch([{"kind": "device_event", "gpu": "GPU-x", "event": "xid", "code": 79}]))
    device = Device.objects.get(uuid="GPU-x")
    assert device.health == "critical"
    assert device.last_sample["temp_c"] == 61.0
    assert Node.objects.get(name="node-1").health == "critical"


def test_it_creates_a_gpu_first_seen_in_an_event(post_batch):
    post_batch(make_batch([{"kind": "device_event", "gpu": "GPU-new", "event": "gpu_lost"}]))
    device = Device.objects.get(uuid="GPU-new")
    assert (device.health, device.index, device.node.name) == ("critical", 0, "node-1")


def test_it_sets_node_health_to_its_worst_gpu(post_batch):
    post_batch(make_batch([_sample("GPU-a"), _sample("GPU-b", throttle_reasons=["hw_slowdown"])]))
    assert Node.objects.get(name="node-1").health == "warning"
    post_batch(make_batch([_sample("GPU-b")]))
    assert Node.objects.get(name="node-1").health == "ok"


def test_it_never_moves_node_last_seen_backwards(post_batch):
    now = datetime.now(UTC)
    post_batch(make_batch([{"kind": "heartbeat"}], sent_at=now))
    seen = Node.objects.get(name="node-1").last_seen
    old = now - timedelta(minutes=3)
    post_batch(make_batch([{"kind": "heartbeat", "ts": old.isoformat()}], sent_at=now))
    assert Node.objects.get(name="node-1").last_seen == seen


def test_it_stores_only_health_values_the_one_health_ordering_knows():
    from agents.gpu_health import HEALTH_ORDER
    from console.choices import Health

    assert set(Health.values) == set(HEALTH_ORDER)


def test_a_groups_topology_is_kept_whole_even_when_every_degree_is_one(post_batch):
    """The wire omits a degree of 1; stored, `{}` would read as "no shape reported" after a
    resize onto one rank (the topology-change drill's TP 2 -> 1)."""
    from console.models import ConsistencyGroup
    from ingest.models import TransitionRecord

    def running(generation: int, topology: dict) -> dict:
        return {"kind": "transition", "group": "tp-job", "generation": generation,
                "to_state": "running", "world_size": 2, "topology": topology}  # fmt: skip

    post_batch(make_batch([running(1, {"dp": 1, "tp": 2, "pp": 1, "ep": 1})]))
    assert ConsistencyGroup.objects.get(name="tp-job").topology == {
        "dp": 1, "tp": 2, "pp": 1, "ep": 1
    }  # fmt: skip
    post_batch(make_batch([running(2, {"dp": 1, "tp": 1, "pp": 1, "ep": 1})]))
    whole = {"dp": 1, "tp": 1, "pp": 1, "ep": 1}
    assert ConsistencyGroup.objects.get(name="tp-job").topology == whole
    assert TransitionRecord.objects.filter(generation=2).get().topology == whole
