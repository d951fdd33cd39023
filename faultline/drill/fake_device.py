"""Device rows that need a GPU or NVLink, run here with fakes (labelled so in the matrix).

Owns `clock_throttle` and `intra_node_link`: a real gloo job whose rank 1 is bound to a
fake GPU of the drill agent (agents/fake_nvml.py, scripted through the drill's control
directory) and the hardware signal written there. For `clock_throttle` the slowdown is
real too: every rank does the same real arithmetic in its compute phase (`--compute-ms`:
matmuls sized to ~150 ms of this box's core), and from the moment the fake GPU reports
the thermal slowdown (SM clock x 0.5) the drill duty-cycles rank 1's process (SIGSTOP
half of every 100 ms, SIGCONT the other half: `DutyCycle`), so its compute really takes
about twice as long and the group waits for it. The console must tie the straggler to
the throttled GPU (the `straggler` on rank 1 a symptom in the `thermal_throttle`
incident) and name no healthy rank, GPU or node: the fake NVML signal alone (a minor
throttle) does not pass. Detection is judged through the REST API like every other row;
no restart is needed for either, so the job keeps its one generation and the row checks
it skipped nothing. The fake GPU is cleared and the process resumed afterwards (another
row must not inherit them). Must not judge faults itself. (`long_kernel` needs no fake
GPU: the trainer's `long_kernel` fault blocks rank 1 in its compute phase, the generic
inside-fault path runs it.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Any

from agents.fake_nvml import fake_uuid
from faultline.drill import invariants
from faultline.drill.util import all_alive
from faultline.drill.util import wait as _until

Drill = Any  # faultline.drill.runner.Drill (runner imports this module: no cycle)

GPU_INDEX = {"clock_throttle": 6, "intra_node_link": 5}  # fake GPUs no other row uses
SCRIPT = {"clock_throttle": "thermal_throttle", "intra_node_link": "nvlink_errors"}
FAULT_STEP = 12
DETECT_TIMEOUT_S = 25.0
ROWS = frozenset(GPU_INDEX)
# The compute phase's real work, sized on the box at start (trainer --compute-ms): a fixed
# 96 matmuls was ~80 ms on one box and too little on a faster one, where a rank whose
# compute doubled stayed under the straggler ratio (busy = the 150 ms input sleep + it).
COMPUTE_MS = 150.0
# Stopped half of every 100 ms: the share it runs matches fake NVML's SM clock x 0.5. The
# stops are shorter than the 150 ms input sleep, so they stretch compute, not input (a
# throttled rank whose input phase dominated would be an undetermined straggler).
THROTTLE_PERIOD_S = 0.1
THROTTLE_RUNNING = 0.5
SETTLE_S = 3.0  # after naming: any second story the fault opens shows within this


class DutyCycle:
    """A real slowdown of one process: SIGSTOP for (1 - running) of every period, SIGCONT
    for the rest, until stopped (then SIGCONT). Everything the process does slows, sleeps
    aside, the way a lower clock slows every kernel: on this CPU job, its compute."""

    def __init__(self, pid: int, period_s: float, running: float) -> None:
        self.pid, self.period_s, self.running = pid, period_s, running
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="duty-cycle", daemon=True)
        self.cycles = 0

    def start(self) -> DutyCycle:
        self._thread.start()
        return self

    def _run(self) -> None:
        off, on = self.period_s * (1 - self.running), self.period_s * self.running
        try:
            while not self._stop.is_set():
                os.kill(self.pid, signal.SIGSTOP)
                self._stop.wait(off)
                os.kill(self.pid, signal.SIGCONT)
                self.cycles += 1
                self._stop.wait(on)
        except ProcessLookupError:
            return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2.0)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGCONT)


def _script(drill: Drill, line: str) -> None:
    with open(drill.work / "nvml-control" / "drill-node", "a") as fh:
        fh.write(line + "\n")


def _straggler_tied(incident: dict[str, Any], subject: str) -> bool:
    """The incident carries the rank's straggler as an active symptom of its root cause."""
    return any(
        s["kind"] == "straggler" and s["subject"] == subject and s["active"]
        for s in incident.get("symptoms") or ()
    )


def run(drill: Drill) -> None:
    from faultline.drill.matrix import FAULT_RANK

    spec, r = drill.spec, drill.result
    index = GPU_INDEX[spec.name]
    throttle = spec.name == "clock_throttle"
    drill.gpus[FAULT_RANK] = fake_uuid("drill-node", index)
    extra = ["--ckpt-every", "5"]
    if throttle:
        extra += ["--compute-ms", str(COMPUTE_MS)]
    slowed: DutyCycle | None = None
    straggler = f"rank:{drill.group}/{FAULT_RANK}"
    try:
        job = drill.launch(1, extra)
        if not _until(lambda: job.step() >= 8 or not all_alive(job), 90) or job.step() < 8:
            raise RuntimeError(f"generation 1 never reached step 8: {job.why()}")
        if throttle:
            _until(lambda: job.step() >= FAULT_STEP, 30, 0.02)
        # The GPU reports the slowdown and (clock_throttle) its rank really slows, at once.
        _script(drill, f"{index}:{SCRIPT[spec.name]}")
        t0 = time.time()
        if throttle:
            slowed = DutyCycle(job.procs[FAULT_RANK].pid, THROTTLE_PERIOD_S, THROTTLE_RUNNING)
            slowed.start()
        found: list[dict[str, Any]] = []
        deadline = time.monotonic() + DETECT_TIMEOUT_S
        hit: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            found = drill.new_incidents(t0) or found
            hit = [i for i in found if i["kind"] == spec.expected_root_cause]
            # A throttle is named for what it does: the straggler tied to it, not the
            # fake GPU's throttle reasons alone.
            if throttle:
                hit = [i for i in hit if _straggler_tied(i, straggler)]
            if hit:
                r.detection_s = round(time.time() - t0, 2)
                r.found_root_cause = spec.expected_root_cause
                recovery = hit[0].get("recovery") or {}
                r.auto_restart_safe = recovery.get("auto_restart_safe")
                r.advice_correct = r.auto_restart_safe == spec.expected_auto_restart_safe
                r.measured["named_subject"] = hit[0]["subject"]
                break
            time.sleep(0.1)
        if hit:
            # A second story (a healthy rank, GPU or node named) may open a moment later.
            time.sleep(SETTLE_S)
            found = drill.new_incidents(t0) or found
        named = hit[0]["id"] if hit else None
        r.other_root_causes = sorted({i["kind"] for i in found if i["id"] != named})
        if throttle and slowed is not None:
            # What the workload felt, named or not: the slowdown is the row's claim.
            r.measured["duty_cycles"] = slowed.cycles
            r.measured["step_ms"] = _step_ms(drill, job)
            r.measured["straggler"] = next(
                (
                    s["summary"]
                    for i in found
                    for s in i.get("symptoms") or ()
                    if s["subject"] == straggler and s["kind"] == "straggler"
                ),
                None,
            )
        if r.found_root_cause is None:
            kinds = [i["kind"] for i in found]
            r.found_root_cause = kinds[0] if kinds else None
            why = " tied to rank 1's straggler" if throttle else ""
            raise RuntimeError(
                f"{spec.expected_root_cause}{why} not named within {DETECT_TIMEOUT_S:.0f}s; "
                f"active findings: {drill.active_findings() or 'none'}"
            )
        r.measured["named_gpu"] = r.measured["named_subject"].endswith(drill.gpus[FAULT_RANK])
        slowed_stop(slowed)
        slowed = None
        for running in drill.jobs:
            running.stop()
        r.invariants = invariants.without_restore(drill)
        r.invariants["fault_located_on_the_rank_s_gpu"] = bool(r.measured["named_gpu"])
    finally:
        slowed_stop(slowed)
        _script(drill, f"{index}:clear")


def slowed_stop(slowed: DutyCycle | None) -> None:
    if slowed is not None:
        slowed.stop()


def _step_ms(drill: Drill, job: Any) -> dict[str, float]:
    """Median step time of rank 0 (every rank waits for the slowest) before and after the
    throttle: the slowdown as the workload felt it."""
    import json
    from statistics import median

    before: list[float] = []
    after: list[float] = []
    with contextlib.suppress(OSError, ValueError):
        for line in (job.status / "rank0.steps").read_text().splitlines():
            row = json.loads(line)
            (before if row["step"] < FAULT_STEP else after).append(row["step_ms"])
    return {
        "before": round(median(before), 1) if before else 0.0,
        "after": round(median(after), 1) if after else 0.0,
    }
