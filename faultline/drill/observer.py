"""The telemetry-backend-down row: the observer must not drag the workload down.

Owns the `telemetry_down` drill: a 2-rank job runs, the whole Faultline service (web,
workers, Postgres, Valkey: its process group) is SIGSTOPped for `OUTAGE_S` mid-run and
then continued. Measured from the trainer's per-step log: the median step time before
and during the outage (must change by less than 1 %), the time one reporter call takes
during it against before it (no growth beyond noise, none over `REPORT_MAX_MS`: the
reporter never blocks), records dropped on the rank side (none), and, once the service
is back, whether every step the ranks reported reached the database (the agent's spool
replays everything). Must not stop anything it did not start.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import time
from typing import Any

from faultline.drill.invariants import log_lines
from faultline.testing.service import BIN, service_env

Drill = Any  # faultline.drill.runner.Drill (runner imports this module: no cycle)

OUTAGE_S = 8.0
BASELINE_S = 6.0
REPORT_GROWTH = 1.5  # p99 of one reporter call during the outage vs before it ...
REPORT_SLACK_MS = 1.0  # ... plus this much scheduling noise (2 shared cores)
REPORT_MAX_MS = 50.0  # the slowest one (an outage is 8,000 ms: a blocked send shows)
STEP_CHANGE_LIMIT_PCT = 1.0
REPLAY_TIMEOUT_S = 60.0

_COUNT = """
import json
from ingest.models import StepRecord
rows = StepRecord.objects.filter(group__name={group!r}, generation=1)
print("STEPS=" + json.dumps(sorted(set(rows.values_list("rank", "step")))))
"""


def _stored_steps(drill: Drill) -> set[tuple[int, int]]:
    """(rank, step) pairs the service stored for generation 1, read through its own ORM."""
    out = subprocess.run(
        [str(BIN / "faultline"), "manage", "shell", "-c", _COUNT.format(group=drill.group)],
        env=service_env(drill.service.data_dir), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    for line in out.stdout.splitlines():
        if line.startswith("STEPS="):
            return {(int(a), int(b)) for a, b in json.loads(line[6:])}
    raise RuntimeError(f"could not count the stored steps: {out.stderr.strip()[-200:]}")


def telemetry_down(drill: Drill) -> None:
    r = drill.result
    # No probe here: its fixed-batch forward pass would be timed as reporter time.
    job = drill.launch(1, ["--ckpt-every", "5", "--probe-every", "0"])
    deadline = time.monotonic() + 90
    while job.step() < 8 and job.alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    if job.step() < 8:
        raise RuntimeError(f"generation 1 never reached step 8: {job.why()}")
    time.sleep(BASELINE_S)
    pgid = drill.service.proc.pid  # `faultline up` leads its own session and group
    stopped_at = time.time()
    os.killpg(pgid, signal.SIGSTOP)
    try:
        time.sleep(OUTAGE_S)
    finally:
        os.killpg(pgid, signal.SIGCONT)
    resumed_at = time.time()
    time.sleep(5.0)
    # Judged before the drill stops its own job (that exit is no fault of the workload).
    found = drill.new_incidents(stopped_at)
    drill._transition("stopped", 1, from_state="running", reason="drill_done")
    job.stop()
    lines = [(rk, ln) for rk in range(drill.spec.world) for ln in log_lines(job, rk)]
    before = [ln["step_ms"] for _, ln in lines if ln["ts"] < stopped_at and ln["step"] > 3]
    during = [ln for _, ln in lines if stopped_at <= ln["ts"] <= resumed_at]
    if not before or not during:
        raise RuntimeError("too few steps around the outage to measure")
    base = statistics.median(before)
    out = statistics.median(ln["step_ms"] for ln in during)
    change = (out - base) / base * 100.0
    worst = max(ln["report_ms"] for ln in during)
    p99 = sorted(ln["report_ms"] for ln in during)[int(0.99 * (len(during) - 1))]
    p99_before = sorted(
        ln["report_ms"] for _, ln in lines if ln["ts"] < stopped_at and ln["step"] > 3
    )[int(0.99 * (len(before) - 1))]
    dropped = max(ln["dropped"] for _, ln in lines)
    r.measured.update(
        outage_s=OUTAGE_S,
        steps_during_outage=len(during),
        median_step_ms_before=round(base, 2),
        median_step_ms_during=round(out, 2),
        step_time_change_pct=round(change, 2),
        reporter_max_ms_during=round(worst, 3),
        reporter_p99_ms_during=round(p99, 3),
        reporter_p99_ms_before=round(p99_before, 3),
        dropped_by_reporter=dropped,
    )
    reported = {(rk, ln["step"]) for rk, ln in lines}
    began = time.monotonic()
    stored: set[tuple[int, int]] = set()
    while time.monotonic() - began < REPLAY_TIMEOUT_S:
        stored = _stored_steps(drill)
        if reported <= stored:
            break
        time.sleep(2.0)
    r.measured["replay_s"] = round(time.time() - resumed_at, 1)
    r.measured["steps_reported"] = len(reported)
    r.measured["steps_missing_after_replay"] = len(reported - stored)
    r.invariants = {
        # A faster step (the paused service freed CPU on a 2-core box) is no drag.
        "step_time_change_under_1pct": change < STEP_CHANGE_LIMIT_PCT,
        # Blocking is time the outage adds: a blocked send would stall for the outage
        # (seconds). What a call costs anyway (encoding the collective window) is measured
        # before the outage; during it the p99 may not grow beyond noise, the max is bounded.
        "reporter_never_blocks": p99 <= REPORT_GROWTH * p99_before + REPORT_SLACK_MS
        and worst < REPORT_MAX_MS,
        "no_record_dropped_by_reporter": dropped == 0,
        "spool_replays_everything": reported <= stored,
    }
    # Nothing failed in the workload: the console must not page a root cause for it.
    r.other_root_causes = sorted({i["kind"] for i in found})
    r.invariants["no_root_cause_paged"] = not found
    r.found_root_cause = None
