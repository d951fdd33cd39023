"""Windows an agent built from vLLM/SGLang metrics, through real ingest, storage and the API:
the engine-only fields are kept, a quiet engine window is quiet, and what the engine could
not measure stays unmeasured rather than zero."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from console import snapshots
from console.diagnosis import diagnose
from ingest.models import ServingWindow
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db

GOLDEN = (
    Path(__file__).parents[2] / "agents" / "fixtures" / "contract" / "serving_engine_windows.json"
)


def _records() -> list[dict]:
    records = json.loads(GOLDEN.read_text())["records"]
    for rec in records:
        del rec["ts"]  # stamped now by make_batch
    return records


def test_it_stores_an_engine_windows_fields_and_serves_the_worker(post_batch, client, cast):
    assert post_batch(make_batch(_records(), node="node-021")).status_code == 202
    stored = {w.worker: w for w in ServingWindow.objects.all()}
    vllm = stored["node-021:8901"]
    assert (vllm.model_version, vllm.kv_schema, vllm.ready) == ("tiny-llama", "auto-b128", True)
    assert vllm.window["prefill_ms_p99"] == 297.0 and vllm.window["prefix_hit_pct"] == 64.67
    assert vllm.window["unmeasured"] == ["evictions", "oom", "timeouts", "retries",
                                         "duplicate_tokens"]  # fmt: skip
    assert stored["node-021:30000"].window["graph_miss_pct"] == 0.58
    client.force_login(cast["viewer"])
    overview = client.get("/api/v1/groups/chat-cpu/serving/").json()
    (worker,) = overview["workers"]
    assert (worker["worker"], worker["requests"], worker["slo_met_ratio"]) == (
        "node-021:8901", 24, 1.0,
    )  # fmt: skip


def test_an_engine_window_meeting_its_slo_raises_no_finding(post_batch):
    records = [r for r in _records() if r["group"] == "chat-cpu"]
    assert post_batch(make_batch(records, node="node-021")).status_code == 202
    now = datetime.now(UTC)
    snap = snapshots.load(group_name="chat-cpu", now=now)
    assert snap is not None
    assert [f.kind for f in diagnose(snap, now).findings] == []


def test_an_engine_that_answers_health_before_its_kv_cache_exists_is_caught(post_batch):
    (rec,) = [r for r in _records() if r["group"] == "chat-cpu"]
    del rec["kv_schema"]  # the scrape found no cache_config_info yet
    assert post_batch(make_batch([rec], node="node-021")).status_code == 202
    now = datetime.now(UTC)
    snap = snapshots.load(group_name="chat-cpu", now=now)
    assert snap is not None
    assert [f.kind for f in diagnose(snap, now).findings] == ["ready_before_loaded"]
