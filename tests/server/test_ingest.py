"""POST /api/v1/ingest: strict, idempotent, fenced; nothing of a bad batch is stored."""

from __future__ import annotations

import gzip
import json
from datetime import UTC, datetime, timedelta

import pytest

from console.models import ConsistencyGroup, Device, Node, Rank
from ingest.auth import revoke_tokens
from ingest.models import (
    AgentState,
    BatchReceipt,
    CheckpointRecord,
    ContractViolation,
    DeviceEvent,
    DeviceSample,
    StepRecord,
)
from tests.conftest import iso, make_batch

pytestmark = pytest.mark.django_db


def sample(gpu: str = "GPU-0", index: int = 0, **fields: object) -> dict:
    return {"kind": "device_sample", "gpu": gpu, "index": index, "temp_c": 51.0, **fields}


def step(rank: int, step_no: int, *, group: str = "job", gen: int = 1, **fields: object) -> dict:
    return {
        "kind": "step",
        "group": group,
        "generation": gen,
        "rank": rank,
        "step": step_no,
        "tokens": 1024,
        "duration_ms": 900.0,
        **fields,
    }


def transition(to: str, *, group: str = "job", gen: int = 1, **fields: object) -> dict:
    return {"kind": "transition", "group": group, "generation": gen, "to_state": to, **fields}


def test_it_stores_heartbeats_and_device_samples_and_lists_them(post_batch, cast, client):
    response = post_batch(
        make_batch([{"kind": "heartbeat", "uptime_s": 5}, sample(), sample("GPU-1", 1)])
    )
    assert response.status_code == 202
    assert response.json()["duplicate"] is False
    assert DeviceSample.objects.count() == 2
    client.force_login(cast["viewer"])
    devices = client.get("/api/v1/devices/?node=node-1").json()["results"]
    assert [d["uuid"] for d in devices] == ["GPU-0", "GPU-1"]
    assert devices[0]["last_sample"]["temp_c"] == 51.0


def test_it_acknowledges_a_replayed_batch_without_changing_anything(post_batch):
    batch = make_batch([sample()])
    assert post_batch(batch).json() == {
        "ack_seq": batch["seq"],
        "duplicate": False,
        "actions": [],
        "high_water": None,
        "gaps": [],
    }
    replay = post_batch(batch)
    assert replay.status_code == 202
    assert replay.json()["duplicate"] is True
    assert DeviceSample.objects.count() == 1
    state = AgentState.objects.get()
    assert (state.batches, state.duplicates) == (1, 1)


def test_it_rejects_a_bad_record_naming_index_field_and_value_and_stores_nothing(post_batch):
    batch = make_batch([sample(), {"kind": "heartbeat"}, sample(temp_c="hot")])
    response = post_batch(batch)
    assert response.status_code == 400
    body = response.json()
    assert body["record"] == 2 and body["field"] == "temp_c"
    assert '"hot"' in body["error"]
    assert DeviceSample.objects.count() == 0
    assert BatchReceipt.objects.count() == 0


def test_it_refuses_unknown_fields(post_batch):
    response = post_batch(make_batch([sample(prompt="secret user text")]))
    assert response.status_code == 400
    assert response.json()["field"] == "prompt"
    assert "not part of contract v1" in response.json()["error"]


def test_it_refuses_an_unknown_record_kind(post_batch):
    response = post_batch(make_batch([{"kind": "gossip"}]))
    assert response.status_code == 400
    assert response.json()["record"] == 0


def test_it_keeps_a_nan_loss(post_batch):
    post_batch(make_batch([step(0, 7, loss="NaN", grad_norm="Infinity")]))
    row = StepRecord.objects.get()
    assert row.loss != row.loss  # NaN is the only value unequal to itself
    assert row.grad_norm == float("inf")


def test_it_stores_values_exactly_even_with_copy_escape_characters(post_batch):
    """Rows travel as COPY text: tabs, newlines, backslashes, quotes and non-ASCII text,
    inside plain and JSON columns, and extreme floats must come back as they were sent."""
    odd = 'tab\there\nnew "quote" back\\slash\r ünï 🙂'
    gpu = "GPU-\\odd\tid"
    post_batch(
        make_batch(
            [
                sample(gpu, 3, temp_c=-49.5, power_w=1e-300, mem_used_bytes=2**62),
                {"kind": "device_event", "gpu": gpu, "event": "xid", "code": -7, "detail": odd},
                step(0, 7, loss="-Infinity", grad_norm=1.7976931348623157e308, overflow=False),
                {
                    "kind": "checkpoint", "group": "job", "generation": 1, "checkpoint_id": "c1",
                    "phase": "written", "step": 7,
                    "manifest": {"shards": [{"path": odd, "bytes": 1}], "format": "dcp"},
                },
            ]
        )
    )  # fmt: skip
    row = DeviceSample.objects.get()
    assert (row.gpu, row.index, row.temp_c, row.power_w) == (gpu, 3, -49.5, 1e-300)
    assert row.mem_used_bytes == 2**62 and row.throttle_reasons == []
    event = DeviceEvent.objects.get()
    assert (event.gpu, event.code) == (gpu, -7)
    assert event.detail == odd  # scrubbing leaves this text alone: no path, no long number
    step_row = StepRecord.objects.get()
    assert step_row.loss == float("-inf") and step_row.grad_norm == 1.7976931348623157e308
    assert step_row.overflow is False and step_row.data_cursor is None
    assert CheckpointRecord.objects.get().manifest["shards"][0]["path"] == odd


def test_it_accepts_gzip():
    batch = make_batch([sample()])
    from django.test import Client

    from ingest.auth import issue_token

    token = issue_token(node_name="node-1")
    response = Client().post(
        "/api/v1/ingest",
        data=gzip.compress(json.dumps(batch).encode()),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}", "Content-Encoding": "gzip"},
    )
    assert response.status_code == 202
    assert DeviceSample.objects.count() == 1


def test_it_refuses_a_batch_naming_another_node(post_batch, agent_token):
    token = agent_token("node-1")
    response = post_batch(make_batch([sample()], node="node-2"), token=token)
    assert response.status_code == 403
    assert "node-1" in response.json()["error"]
    assert DeviceSample.objects.count() == 0


def test_it_refuses_revoked_and_missing_tokens(post_batch, agent_token, client):
    token = agent_token("node-1")
    revoke_tokens(node_name="node-1")
    assert post_batch(make_batch([sample()]), token=token).status_code == 401
    assert (
        client.post("/api/v1/ingest", data="{}", content_type="application/json").status_code == 401
    )
    assert DeviceSample.objects.count() == 0


def test_it_rate_limits_an_agent_with_retry_after(post_batch, settings):
    settings.INGEST_RATE_PER_MIN = 2
    codes = [post_batch(make_batch([sample()])).status_code for _ in range(3)]
    assert codes[:2] == [202, 202]
    last = post_batch(make_batch([sample()]))
    assert last.status_code == 429
    assert int(last["Retry-After"]) > 0


def test_it_rejects_records_far_in_the_future_of_their_batch(post_batch):
    ahead = datetime.now(UTC) + timedelta(minutes=10)
    response = post_batch(make_batch([sample(ts=iso(ahead))]))
    assert response.status_code == 400
    assert 'field "ts"' in response.json()["error"]
    assert DeviceSample.objects.count() == 0


def test_it_records_sequence_gaps_and_fills_them_when_late_batches_arrive(post_batch, cast, client):
    for seq in (1, 2, 6):
        post_batch(make_batch([sample()], seq=seq, agent_id="agent-gaps-0001"))
    state = AgentState.objects.get(agent_id="agent-gaps-0001")
    assert (state.last_seq, state.gaps, state.gap_ranges) == (6, 3, [[3, 5]])
    post_batch(make_batch([sample()], seq=4, agent_id="agent-gaps-0001"))
    state.refresh_from_db()
    assert (state.gaps, state.gap_ranges) == (2, [[3, 3], [5, 5]])
    client.force_login(cast["viewer"])
    row = client.get("/api/v1/agents/").json()["results"][0]
    assert row["gaps"] == 2 and row["batches"] == 4 and row["clock_skew_ms"] is not None


def test_each_202_reports_the_agents_receipts_as_the_batch_found_them(post_batch):
    """What an agent compares with the batches it saw acknowledged (agents/replay.py): the
    high-water mark and gap ranges before this batch; a replay reports them as they are."""

    def post(seq: int) -> tuple[bool, int | None, list[list[int]]]:
        reply = post_batch(make_batch([sample()], seq=seq, agent_id="agent-hw-0001"))
        assert reply.status_code == 202
        body = reply.json()
        assert body["ack_seq"] == seq
        return body["duplicate"], body["high_water"], body["gaps"]

    assert post(5) == (False, None, [])  # nothing of this agent before
    assert post(6) == (False, 5, [])
    assert post(9) == (False, 6, [])
    assert post(8) == (False, 9, [[7, 8]])  # the gap 9 opened, 8 in it
    assert post(8) == (True, 9, [[7, 7]])  # a replay: the receipts as they are now
    assert post(7) == (False, 9, [[7, 7]])
    assert post(10) == (False, 9, [])


def test_it_measures_clock_skew_and_keeps_a_skewed_agents_records(post_batch):
    skewed = datetime.now(UTC) + timedelta(minutes=10)
    response = post_batch(make_batch([sample()], sent_at=skewed))
    assert response.status_code == 202
    state = AgentState.objects.get()
    assert 590_000 < state.clock_skew_ms < 610_000
    stored = DeviceSample.objects.get().ts
    assert abs((stored - datetime.now(UTC)).total_seconds()) < 30  # corrected by the skew


def test_it_moves_the_generation_only_through_a_transition(post_batch):
    post_batch(make_batch([transition("running", gen=1), step(0, 1)]))
    post_batch(make_batch([step(0, 50, gen=2)]))  # ahead of the active generation
    group = ConsistencyGroup.objects.get(name="job")
    assert group.generation == 1
    assert Rank.objects.get(group=group, rank=0).last_step == 1
    post_batch(make_batch([transition("recovering", gen=2, restart_count=1), step(0, 40, gen=2)]))
    group.refresh_from_db()
    assert (group.generation, group.state, group.restart_count) == (2, "recovering", 1)
    assert Rank.objects.get(group=group, rank=0).last_step == 40


def test_it_stores_and_flags_records_of_a_stale_generation_without_moving_live_state(post_batch):
    post_batch(make_batch([transition("running", gen=3), step(0, 10, gen=3)]))
    response = post_batch(make_batch([step(0, 99, gen=2)]))
    assert response.status_code == 202
    stale = StepRecord.objects.get(generation=2)
    assert stale.stale is True
    assert Rank.objects.get(rank=0).last_step == 10
    violation = ContractViolation.objects.get()
    assert violation.kind in {"stale_generation", "split_brain"}
    assert violation.evidence["active_generation"] == 3


def test_it_flags_a_restart_count_that_goes_backwards(post_batch):
    post_batch(make_batch([transition("running", gen=1, restart_count=2)]))
    post_batch(make_batch([transition("recovering", gen=1, restart_count=1)]))
    violation = ContractViolation.objects.get()
    assert violation.kind == "non_monotonic"
    assert violation.evidence == {"field": "restart_count", "was": 2, "now": 1}


def test_it_flags_a_rank_data_cursor_regression(post_batch):
    post_batch(make_batch([step(0, 1, data_cursor=1000)]))
    post_batch(make_batch([step(0, 2, data_cursor=400)]))
    violation = ContractViolation.objects.get()
    assert violation.kind == "data_cursor_regression"
    assert violation.subject == "rank:job/0"


def test_it_judges_each_rank_against_its_own_state_when_a_batch_spans_groups(post_batch):
    """Rank state is read for every named group x every named rank number; each record must
    still be checked against its own (group, rank) only."""
    post_batch(
        make_batch([step(0, 5, group="a", data_cursor=100), step(1, 7, group="b", data_cursor=50)])
    )
    post_batch(
        make_batch(
            [
                step(1, 1, group="a", data_cursor=10),  # new rank: nothing to regress from
                step(0, 1, group="b", data_cursor=20),  # new rank
                step(0, 6, group="a", data_cursor=90),  # a/0 went 100 -> 90
                step(1, 8, group="b", data_cursor=60),  # b/1 moved on
            ]
        )
    )
    (violation,) = ContractViolation.objects.all()
    assert (violation.kind, violation.subject) == ("data_cursor_regression", "rank:a/0")
    state = {(r.group.name, r.rank): (r.last_step, r.data_cursor) for r in Rank.objects.all()}
    assert state == {("a", 0): (6, 90), ("a", 1): (1, 10), ("b", 0): (1, 20), ("b", 1): (8, 60)}


def test_it_marks_a_gpu_with_double_bit_errors_critical(post_batch):
    post_batch(make_batch([sample(ecc_dbe=1)]))
    assert Device.objects.get().health == "critical"
    assert Node.objects.get(name="node-1").health == "critical"


def _xid_event(code: int, gpu: str = "GPU-0", **fields: object) -> dict:
    return {"kind": "device_event", "ts": iso(), "gpu": gpu, "event": "xid", "code": code,
            **fields}  # fmt: skip


@pytest.mark.parametrize(
    ("code", "recovery", "critical"),
    [
        (79, None, True),  # hardware: fallen off the bus
        (46, None, True),  # hardware: RESET_GPU
        (13, None, False),  # application: the program faulted, the GPU is fine
        (94, None, False),  # application: contained to one program
        (45, None, False),  # consequence
        (63, None, False),  # informational
        (31337, None, False),  # unknown: a human looks, the node stays
        (154, "node_reboot", True),  # the driver asks for a reboot
        (154, "none", False),
    ],
)
def test_it_marks_a_gpu_critical_only_for_a_hardware_xid(post_batch, code, recovery, critical):
    post_batch(make_batch([sample(), _xid_event(code, recovery_action=recovery)]))
    expected = "critical" if critical else "ok"
    assert Device.objects.get().health == expected
    assert Node.objects.get(name="node-1").health == expected
    assert DeviceEvent.objects.get().recovery_action == recovery


def test_it_stores_a_late_delivery_from_before_the_fence_without_flagging_it(post_batch):
    """Another node's agent ships generation 1's last step after the restart was fenced."""
    before = datetime.now(UTC) - timedelta(seconds=30)
    post_batch(
        make_batch([transition("running", gen=1, ts=iso(before)), step(0, 1, ts=iso(before))])
    )
    post_batch(make_batch([step(1, 8, gen=1, ts=iso(before))], node="node-2"))  # hosts rank 1
    post_batch(
        make_batch([transition("recovering", gen=2, ts=iso(before + timedelta(seconds=20)))])
    )
    late = step(1, 9, gen=1, ts=iso(before + timedelta(seconds=10)))  # made before the fence
    assert post_batch(make_batch([late], node="node-2")).status_code == 202
    assert StepRecord.objects.get(rank=1, step=9).stale is True
    assert ContractViolation.objects.count() == 0


@pytest.mark.parametrize("kind", ["step", "checkpoint"])
def test_it_flags_progress_written_past_a_fence_that_arrived_before_the_fence(post_batch, kind):
    """The launcher's node delivered the restart late (an outage, its spool replayed): the
    old generation's progress stamped after the fence reached the service first. It is
    split brain as it is when it arrives after the fence; progress stamped before is not."""
    before = datetime.now(UTC) - timedelta(seconds=30)
    post_batch(
        make_batch([transition("running", gen=1, ts=iso(before)), step(0, 1, ts=iso(before))])
    )
    fence = before + timedelta(seconds=10)
    early = step(1, 8, gen=1, ts=iso(fence - timedelta(seconds=1)))
    late = (
        step(1, 9, gen=1, ts=iso(fence + timedelta(seconds=2)))
        if kind == "step"
        else {"kind": "checkpoint", "ts": iso(fence + timedelta(seconds=2)), "group": "job",
              "generation": 1, "checkpoint_id": "c9", "step": 9, "phase": "committed"}
    )  # fmt: skip
    post_batch(make_batch([early, late], node="node-2"))
    assert ContractViolation.objects.count() == 0
    post_batch(make_batch([transition("recovering", gen=2, ts=iso(fence))]))
    (v,) = ContractViolation.objects.all()
    assert (v.kind, v.subject, v.generation) == ("split_brain", "group:job", 1)
    assert v.evidence["record_kind"] == kind


def test_it_pushes_the_nodes_fleet_card_as_committed_at_most_once_a_second(post_batch, monkeypatch):
    """The card rides in ingest's last statement; it must be the card the fleet page shows,
    pushed once a second per node, and at once for a critical device event."""
    from console import live, queries

    pushed = []
    monkeypatch.setattr(live, "publish", lambda channel, kind, data: pushed.append(data))
    post_batch(
        make_batch([sample(), sample("GPU-1", 1, temp_c=91.0, throttle_reasons=["hw_slowdown"])])
    )
    (card,) = pushed
    assert card == queries.node_payloads(names=["node-1"])[0]
    assert card["health"] == "warning" and [d["health"] for d in card["devices"]] == [
        "ok",
        "warning",
    ]
    assert card["devices"][1]["throttle_reasons"] == ["hw_slowdown"]

    post_batch(make_batch([sample(temp_c=60.0)]))
    assert len(pushed) == 1  # within the second: the next due push carries it

    post_batch(make_batch([{"kind": "device_event", "gpu": "GPU-0", "event": "xid", "code": 79}]))
    assert len(pushed) == 2 and pushed[1]["health"] == "critical"
    assert pushed[1] == queries.node_payloads(names=["node-1"])[0]
    assert pushed[1]["devices"][0]["temp_c"] == 60.0  # the batch in between is in it


def _committed(ckpt: str, at_step: int, gen: int) -> dict:
    return {"kind": "checkpoint", "group": "job", "generation": gen, "checkpoint_id": ckpt,
            "phase": "committed", "step": at_step}  # fmt: skip


def test_it_judges_checkpoint_order_within_a_generation_not_across_a_rollback(post_batch):
    """`faultline demo` after a NaN loss: the newest checkpoints (60-80) were poisoned, the
    next generation restored step 50 and committed step 60 again, which was flagged as a
    MAJOR `non_monotonic` page although it is what a rollback does."""
    post_batch(make_batch([transition("running"), _committed("c60", 60, 1),
                           _committed("c80", 80, 1)]))  # fmt: skip
    post_batch(make_batch([transition("running", gen=2), _committed("c60b", 60, 2)]))
    assert not ContractViolation.objects.exists()
    post_batch(make_batch([_committed("c55", 55, 2)]))  # backwards within generation 2
    violation = ContractViolation.objects.get()
    assert violation.kind == "non_monotonic" and violation.generation == 2
    assert violation.evidence == {"field": "checkpoint_step", "was": 60, "now": 55}
