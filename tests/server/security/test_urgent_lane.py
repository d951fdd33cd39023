"""An established group's device event reaches its own diagnosis lane.

On a saturated worker the young groups' diagnoses (a flood's invented groups) ran ahead of
a real Xid's: the worker holds countdown tasks in memory and runs them in countdown order.
Now an established group's device event is also queued, without countdown, on the urgent
queue that a worker of its own drains. Real batches with real agent tokens through
POST /api/v1/ingest; only the broker send is captured.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.core.cache import cache

from console import live, scheduling, tasks
from console.models import ConsistencyGroup
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    live.forget_recent()
    calls: list[dict[str, Any]] = []

    def capture(name: str, *args: Any, **options: Any) -> None:
        calls.append({"name": name, "args": args, **options})

    monkeypatch.setattr(scheduling, "enqueue", capture)
    yield calls
    live.forget_recent()


def urgent(calls: list[dict[str, Any]]) -> list[str]:
    return [c["args"][0] for c in calls if c.get("queue") == scheduling.URGENT_QUEUE]


def start(group: str, gpus: list[str]) -> list[dict]:
    records: list[dict] = [{"kind": "transition", "group": group, "generation": 1,
                            "to_state": "running"}]  # fmt: skip
    for rank, gpu in enumerate(gpus):
        records += [
            {"kind": "process", "group": group, "generation": 1, "rank": rank,
             "event": "started", "gpu": gpu},
            {"kind": "device_sample", "gpu": gpu, "index": rank, "temp_c": 50.0},
        ]  # fmt: skip
    return records


def xid(gpu: str) -> dict:
    return {"kind": "device_event", "gpu": gpu, "event": "xid", "code": 79}


def establish(*groups: str) -> None:
    """As if created longer than DIAGNOSIS_YOUNG_GROUP_S ago (the mark's expiry)."""
    assert all(cache.get(scheduling.young_key(g)) for g in groups)  # ingest marked them
    cache.delete_many([scheduling.young_key(g) for g in groups])


def test_an_established_groups_xid_goes_to_the_urgent_lane_ahead_of_a_flood(post_batch, sent):
    real = start("ul-real", ["GPU-ul-good-0"])
    assert post_batch(make_batch(real, node="ul-good")).status_code == 202
    establish("ul-real")
    flood = [{"kind": "step", "group": f"ul-new-{i:02d}", "generation": 1, "rank": 0,
              "step": 1, "tokens": 1, "duration_ms": 900.0} for i in range(15)]  # fmt: skip
    assert post_batch(make_batch(flood, node="ul-evil")).status_code == 202
    # A run of the real group is pending on the ordinary lane (its steps), as in the bench.
    stepped = [{"kind": "step", "group": "ul-real", "generation": 1, "rank": 0, "step": 1,
                "tokens": 1, "duration_ms": 900.0}]  # fmt: skip
    assert post_batch(make_batch(stepped, node="ul-good")).status_code == 202
    assert cache.get(scheduling.pending_key("ul-real"))
    sent.clear()
    assert post_batch(make_batch([xid("GPU-ul-good-0")], node="ul-good")).status_code == 202
    lane = [c for c in sent if c.get("queue") == scheduling.URGENT_QUEUE]
    assert [c["args"] for c in lane] == [("ul-real", scheduling.URGENT, "ul-good")]
    assert lane[0].get("countdown") is None  # at once, not behind anyone's countdown
    assert not any(c["args"][0].startswith("ul-new-") for c in sent)


def test_a_young_groups_device_event_stays_on_the_ordinary_lane(post_batch, sent):
    """A flood's invented groups are young: their node's Xids must not reach the lane."""
    records = start("ul-young", ["GPU-ul-evil2-0"])
    assert post_batch(make_batch(records, node="ul-evil2")).status_code == 202
    sent.clear()
    assert post_batch(make_batch([xid("GPU-ul-evil2-0")], node="ul-evil2")).status_code == 202
    assert urgent(sent) == []
    assert cache.get(scheduling.urgent_key("ul-young")) is None  # claimed, then released
    assert cache.get(scheduling.pending_key("ul-young"))  # its ordinary run is queued


def test_one_node_spends_only_its_own_urgent_budget(post_batch, sent, settings):
    """A token whose groups grew old can report Xids for all of them: at most
    DIAGNOSIS_URGENT_PER_S a second take the lane, the rest wait on the ordinary one."""
    settings.DIAGNOSIS_URGENT_PER_S = 2
    groups = [f"ul-old-{i}" for i in range(5)]
    records = [r for i, g in enumerate(groups) for r in start(g, [f"GPU-ul-many-{i}"])]
    assert post_batch(make_batch(records, node="ul-many")).status_code == 202
    other = start("ul-other", ["GPU-ul-other-0"])
    assert post_batch(make_batch(other, node="ul-other")).status_code == 202
    establish(*groups, "ul-other")
    sent.clear()
    events = [xid(f"GPU-ul-many-{i}") for i in range(5)]
    assert post_batch(make_batch(events, node="ul-many")).status_code == 202
    assert post_batch(make_batch([xid("GPU-ul-other-0")], node="ul-other")).status_code == 202
    lane = urgent(sent)
    assert len([g for g in lane if g.startswith("ul-old-")]) <= 2  # a clock second may tick
    assert "ul-other" in lane  # another node's budget is its own
    # Every group is still diagnosed: a run is queued on the ordinary lane.
    assert all(cache.get(scheduling.pending_key(g)) for g in groups)


def test_the_urgent_run_clears_its_own_key_not_the_ordinary_one():
    ConsistencyGroup.objects.create(name="ul-task", generation=1)
    cache.set(scheduling.urgent_key("ul-task"), 1, 5)
    cache.set(scheduling.pending_key("ul-task"), 1, 5)
    tasks.diagnose_group("ul-task", scheduling.URGENT)
    assert cache.get(scheduling.urgent_key("ul-task")) is None
    assert cache.get(scheduling.pending_key("ul-task")) == 1  # the ordinary run still queued
    tasks.diagnose_group("ul-task")
    assert cache.get(scheduling.pending_key("ul-task")) is None


def test_off_the_lane_sends_nothing_there(post_batch, sent, settings):
    settings.DIAGNOSIS_URGENT_LANE = False
    records = start("ul-off", ["GPU-ul-off-0"])
    assert post_batch(make_batch(records, node="ul-off")).status_code == 202
    establish("ul-off")
    assert post_batch(make_batch([xid("GPU-ul-off-0")], node="ul-off")).status_code == 202
    assert urgent(sent) == []
    assert cache.get(scheduling.pending_key("ul-off"))


def test_the_shipped_topologies_run_a_worker_for_each_queue_and_beat_routes_the_sweeps():
    """`faultline up` and docker-compose (as shipped): one worker drains the lane, one
    beat's sweeps, one the default queue, each its own queue alone. The ordinary worker
    must not reserve lane or sweep messages while it is busy (it held sweeps behind its
    passes until they expired), and the lane's worker must not spend device events' time
    on the sweeps."""
    from pathlib import Path

    import yaml

    from faultline import bootstrap

    commands = bootstrap.service_commands(
        host="127.0.0.1", port=1, ws_port=2, workers=1, worker_concurrency=2, directory=Path(".")
    )
    compose = yaml.safe_load((Path(__file__).parents[3] / "docker-compose.yml").read_text())
    want = {
        "worker": ["celery"],
        "worker-urgent": [scheduling.URGENT_QUEUE],
        "worker-housekeeping": [scheduling.HOUSEKEEPING_QUEUE],
        "worker-notify": [scheduling.NOTIFY_QUEUE],
    }
    for role, queues in want.items():
        for command in (commands[role], compose["services"][role]["command"]):
            assert "-Q" not in command
            assert command[command.index("--queues") + 1].split(",") == queues, role
            if role != "worker":  # a node name of its own beside the ordinary worker's
                assert "--hostname" in command
            if role in ("worker-urgent", "worker-housekeeping"):
                assert command[command.index("--concurrency") + 1] == "1"
            if role == "worker-notify":  # sends wait on endpoints: threads, several
                assert command[command.index("--pool") + 1] == "threads"
                assert int(command[command.index("--concurrency") + 1]) >= 2
    from faultline.celery import app

    beat = app.conf.beat_schedule
    # Pages, fleet health, silence and the charts' bins wait for no pass; what may run for
    # seconds stays on the default queue, where a late run is still run.
    for entry in ("sweep", "sweep-nodes", "escalation-sweep", "step-bins", "analyze-partitions"):
        assert beat[entry]["options"]["queue"] == scheduling.HOUSEKEEPING_QUEUE, entry
    for entry in ("recovery-costs", "rollup", "maintain-telemetry"):
        assert "queue" not in beat[entry].get("options", {}), entry
    assert beat["sweep-nodes"]["task"] == "console.sweep_nodes"
    assert beat["sweep"]["task"] == "console.sweep"
