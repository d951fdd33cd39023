"""A small training group reported through ingest, with one NaN-loss incident diagnosed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from console import pipeline
from console.models import Incident
from tests.conftest import iso, make_batch

GROUP = "llm-pages"
RANKS = 8
SLOW_RANK = 5


def _records(start: datetime, steps: int, *, nan_at: int | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"kind": "transition", "group": GROUP, "generation": 1, "from_state": "initializing",
         "to_state": "running", "restart_count": 0, "world_size": RANKS, "ts": iso(start)},
        {"kind": "checkpoint", "group": GROUP, "generation": 1, "checkpoint_id": "ckpt-2",
         "step": 2, "phase": "committed", "ts": iso(start + timedelta(seconds=2)),
         "manifest": {"shards": [{"path": "s0", "bytes": 10, "sha256": "ab" * 32}],
                      "total_bytes": 10, "format": "dcp"}},
    ]  # fmt: skip
    for rank in range(RANKS):
        out.append(
            {"kind": "device_sample", "gpu": f"GPU-p-{rank}", "index": rank, "temp_c": 60.0,
             "ts": iso(start)}
        )  # fmt: skip
        for s in range(steps):
            slow = rank == SLOW_RANK
            out.append(
                {"kind": "step", "group": GROUP, "generation": 1, "rank": rank, "step": s,
                 "tokens": 2048, "duration_ms": 1600.0 if slow else 1000.0,
                 "phases": {"compute": 1300.0 if slow else 700.0, "collective": 250.0,
                            "input": 50.0},
                 "loss": "NaN" if nan_at is not None and s >= nan_at else 2.5,
                 "ts": iso(start + timedelta(seconds=s))}
            )  # fmt: skip
    return out


@pytest.fixture
def training_group(post_batch: Any) -> dict[str, Any]:
    start = datetime.now(UTC) - timedelta(seconds=30)
    post_batch(make_batch(_records(start, 12, nan_at=10), node="node-p1", sent_at=start))
    pipeline.diagnose(group_name=GROUP, now=start + timedelta(seconds=15))
    incident = Incident.objects.get(group__name=GROUP, kind="nan_loss")
    # The pass at which its verdict settles: the remediation policy has had its say.
    pipeline.diagnose(group_name=GROUP, now=incident.settles_at)
    incident.refresh_from_db()
    return {"name": GROUP, "incident": incident, "start": start}
