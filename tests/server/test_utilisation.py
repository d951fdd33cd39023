"""MFU, HFU, HBM and network utilisation through the service: ingest stores the fields, a
diagnosis pass puts the figures in the group's summary, and the group page, the REST API
and /metrics show them; a run without a known GPU shows them absent, never as 0."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agents import flops
from console import pipeline
from console.models import ConsistencyGroup, Device
from ingest.models import DeviceSample, NetSample, StepRecord
from tests.conftest import iso, make_batch

from .test_metrics import TOKEN, scrape, value

pytestmark = pytest.mark.django_db

H100 = "NVIDIA H100 80GB HBM3"
FLOPS = 4e14  # per step; at one second a step on an H100: 40.4 % MFU
STEPS = 6


def _records(group: str, start: datetime, *, gpus: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"kind": "transition", "group": group, "generation": 0, "to_state": "running",
         "world_size": 2, "ts": iso(start)},
        {"kind": "net_sample", "port": "mlx5_0/1", "link": "ib", "state": "ACTIVE",
         "interval_s": 2.0, "counters": {"tx_bytes": 40_000_000_000, "rx_bytes": 0},
         "ts": iso(start + timedelta(seconds=STEPS))},
    ]  # fmt: skip
    for rank in range(2):
        gpu = f"GPU-{group}-{rank}"
        process = {"kind": "process", "group": group, "generation": 0, "rank": rank,
                   "event": "started", "pid": 100 + rank, "ts": iso(start)}  # fmt: skip
        if gpus:
            process["gpu"] = gpu
            out.append(
                {"kind": "device_sample", "gpu": gpu, "index": rank, "name": H100,
                 "mem_util_pct": 35.0 + rank, "ts": iso(start + timedelta(seconds=STEPS))}
            )  # fmt: skip
        out.append(process)
        for s in range(1, STEPS + 1):
            out.append(
                {"kind": "step", "group": group, "generation": 0, "rank": rank, "step": s,
                 "tokens": 1024, "duration_ms": 1000.0, "loss": 2.0, "lr": 3e-4,
                 "model_flops": FLOPS, "hw_flops": FLOPS * 4 / 3,
                 "ts": iso(start + timedelta(seconds=s))}
            )  # fmt: skip
    return out


def _run(post_batch: Any, group: str, *, gpus: bool) -> ConsistencyGroup:
    start = datetime.now(UTC) - timedelta(seconds=30)
    response = post_batch(make_batch(_records(group, start, gpus=gpus), node=f"{group}-node"))
    assert response.status_code == 202, response.content
    pipeline.diagnose(group_name=group, now=start + timedelta(seconds=STEPS + 2))
    return ConsistencyGroup.objects.get(name=group)


def test_ingest_stores_the_flops_learning_rate_memory_use_and_port_span(post_batch) -> None:
    _run(post_batch, "u-store", gpus=True)
    step = StepRecord.objects.filter(group__name="u-store", rank=1, step=3).get()
    assert (step.model_flops, step.hw_flops, step.lr) == (FLOPS, FLOPS * 4 / 3, 3e-4)
    assert DeviceSample.objects.get(gpu="GPU-u-store-1").mem_util_pct == 36.0
    assert Device.objects.get(uuid="GPU-u-store-1").last_sample["name"] == H100
    assert NetSample.objects.get(node__name="u-store-node").interval_s == 2.0


def test_a_gpu_run_gets_mfu_and_hfu_per_rank_and_for_the_group(post_batch) -> None:
    use = _run(post_batch, "u-gpu", gpus=True).summary["utilisation"]
    mfu = round(FLOPS / flops.peak(H100).flops, 4)
    assert (use["mfu"], use["hfu"]) == (mfu, round(FLOPS * 4 / 3 / flops.peak(H100).flops, 4))
    rows = {r["rank"]: r for r in use["per_rank"]}
    assert [rows[r]["mfu"] for r in (0, 1)] == [mfu, mfu]
    assert [rows[r]["hbm_util_pct"] for r in (0, 1)] == [35.0, 36.0]
    assert rows[0]["node_net_bytes_per_s"] == 20_000_000_000  # 40 GB over its 2 s


def test_a_cpu_run_shows_mfu_absent_with_the_reason_never_zero(post_batch) -> None:
    use = _run(post_batch, "u-cpu", gpus=False).summary["utilisation"]
    assert (use["mfu"], use["hfu"], use["ranks_with_flops"]) == (None, None, 2)
    assert use["absent"] == [{"reason": "no GPU", "ranks": 2}]


@pytest.fixture
def scraper(settings: Any) -> None:
    settings.METRICS_TOKEN = TOKEN
    settings.METRICS_ALLOW_CIDRS = []


def test_metrics_export_the_group_figures_and_leave_an_absent_one_out(
    post_batch, client, scraper
) -> None:
    gpu = _run(post_batch, "u-gpu", gpus=True).summary["utilisation"]
    _run(post_batch, "u-cpu", gpus=False)
    s = scrape(client)
    assert value(s, "faultline_group_mfu_ratio", group="u-gpu") == gpu["mfu"]
    assert value(s, "faultline_group_hfu_ratio", group="u-gpu") == gpu["hfu"]
    assert value(s, "faultline_group_lowest_rank_mfu_ratio", group="u-gpu") == gpu["mfu"]
    for name in ("mfu", "hfu", "lowest_rank_mfu"):
        assert (f"faultline_group_{name}_ratio", (("group", "u-cpu"),)) not in s
    assert not any("rank" in dict(labels) for _, labels in s)  # never a rank label


def test_the_group_page_and_the_api_show_them(post_batch, client, cast) -> None:
    _run(post_batch, "u-gpu", gpus=True)
    _run(post_batch, "u-cpu", gpus=False)
    client.force_login(cast["viewer"])

    def section(name: str) -> str:
        page = client.get(f"/groups/{name}/").content.decode()
        return page[page.index('id="utilisation"') :].split("</section>")[0]

    gpu = section("u-gpu")
    assert "40.42 %" in gpu and H100 in gpu
    cpu = section("u-cpu")
    assert "absent: no GPU" in cpu and " %" not in cpu.split("HBM busy")[1]
    api = client.get("/api/v1/groups/u-gpu/").json()
    assert api["utilisation"]["mfu"] == pytest.approx(0.4042, abs=1e-4)
