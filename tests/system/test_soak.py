"""The CI soak: a real `faultline up` under steady ingest, diagnosis and a live websocket
for one minute; no errors, websocket messages flowing, every process reported.

The 30-minute run with the memory rule is `python bench/soak.py` (docs/reliability.md); a
short run never leaves the warm-up, so its memory figures are advisory (one minute finds
what two did: an error, a silent websocket, a process that stopped reporting).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path("test-artifacts")


def test_a_minute_of_steady_load_without_an_error():
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "soak.py"), "--minutes", "1"],
        capture_output=True, text=True, timeout=420, cwd=ROOT,
    )  # fmt: skip
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "soak-1min.log").write_text(run.stdout + run.stderr)
    verdict = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr[-2000:]
    assert run.returncode == 0, verdict
    assert verdict.startswith("soak: OK"), verdict
    fields = dict(re.findall(r"(\w+)=(\S+)", verdict))
    assert fields["errors"] == "0"
    assert int(fields["batches"]) >= 60 * 4 * 4 * 0.9  # 4 nodes x 4 batches/s, 1 min
    assert int(fields["ws_messages"]) > 0
    minutes = [line for line in run.stdout.splitlines() if line.startswith("minute ")]
    assert len(minutes) == 1, run.stdout
    for line in minutes:  # every role's memory was sampled each minute
        for role in ("web", "ws", "worker", "beat", "postgres"):
            assert f'"{role}"' in line, line
