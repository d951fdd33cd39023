from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

from console.diagnosis import ROOT_CAUSE, RULES, SYMPTOM, diagnose
from tests.diagnosis.factory import (
    GROUP,
    T0,
    collective,
    device_event,
    entry,
    gpu_of,
    heartbeats,
    of_kind,
    snap,
    training,
    transition,
)

ROOT = Path(__file__).resolve().parents[2]
NOW = T0 + timedelta(minutes=5)


def _headline(ranks: int = 1024, bad: int = 133) -> list[dict]:
    recs = training(ranks=ranks, steps=8, jitter=0.05)
    for rk in range(ranks):
        ents = [entry(8800 + i, "completed", T0 - timedelta(seconds=12 - i)) for i in range(12)]
        if rk != bad:
            ents.append(entry(8812, "started", T0 + timedelta(seconds=1)))
        recs.append(collective(rk, NOW - timedelta(seconds=5), ents))
    recs.append(device_event(bad, T0 + timedelta(milliseconds=500), "xid", 79))
    return recs


def test_it_finds_one_xid_root_cause_behind_1023_collective_timeouts() -> None:
    d = diagnose(snap(_headline(), now=NOW, nodes=heartbeats(1024, NOW)), NOW)
    (root,) = d.root_causes
    assert (root.kind, root.subject) == ("xid", f"gpu:{gpu_of(133)}")
    assert root.summary == "Xid 79 on node-17 GPU 5 (rank 133): GPU has fallen off the bus"
    waits = of_kind(d, "collective_timeout")
    assert len(waits) == 1023 and len(d.findings) == 1024
    assert all(w.role == SYMPTOM and w.caused_by == (root.id,) for w in waits)
    assert root.recovery is not None and root.recovery.checkpoint == "ckpt-100"


def test_it_puts_the_root_cause_first() -> None:
    d = diagnose(snap(_headline(ranks=64, bad=13), now=NOW, nodes=heartbeats(64, NOW)), NOW)
    assert d.findings[0].role == ROOT_CAUSE and d.findings[0].kind == "xid"


def test_it_is_deterministic() -> None:
    s = snap(_headline(ranks=64, bad=13), now=NOW, nodes=heartbeats(64, NOW))
    assert diagnose(s, NOW).to_dict() == diagnose(s, NOW).to_dict()


def test_it_renders_a_json_safe_diagnosis() -> None:
    s = snap(_headline(ranks=64, bad=13), now=NOW, nodes=heartbeats(64, NOW))
    text = json.dumps(diagnose(s, NOW).to_dict(), allow_nan=False)
    assert json.loads(text)["recovery"]["checkpoint"] == "ckpt-100"


def test_it_finds_nothing_wrong_with_a_healthy_jittery_group() -> None:
    now = T0 + timedelta(seconds=1)
    d = diagnose(snap(training(ranks=256, jitter=0.15), nodes=heartbeats(256, now)), now)
    assert d.findings == () and d.recovery is None


def test_it_finds_nothing_wrong_with_a_group_mid_checkpoint() -> None:
    now = T0 + timedelta(minutes=8)
    recs = [*training(ranks=64), transition(T0 + timedelta(seconds=1), "running", "checkpointing")]
    d = diagnose(snap(recs, state="checkpointing", nodes=heartbeats(64, now)), now)
    assert d.findings == ()


def test_it_finds_nothing_wrong_with_a_quiet_serving_group() -> None:
    recs = [
        {
            "kind": "serving",
            "ts": T0,
            "group": GROUP,
            "worker": f"w{i}",
            "model_version": "m1",
            "kv_schema": "kv1",
            "ready": True,
            "draining": False,
            "window": {"seconds": 60, "requests": 0, "slo_met": 0},
        }
        for i in range(4)
    ]
    d = diagnose(snap(recs), T0 + timedelta(seconds=30))
    assert d.findings == () and d.goodput.g_serve_requests_per_s == 0.0


def test_it_runs_collective_rules_after_the_evidence_they_link_to() -> None:
    order = [name for name, _ in RULES]
    for evidence in ("device", "nodes", "process"):
        assert order.index(evidence) < order.index("collectives") < order.index("progress")


def test_it_imports_without_django_celery_or_channels() -> None:
    code = (
        "import sys, console.diagnosis; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'django', 'celery', 'channels', 'rest_framework'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
