"""Run one drill: a real gloo job, a real fault, and what Faultline saw through its REST API.

Owns the drill choreography: launch generation 1 of a 2-rank job (the runner plays the
launcher: it reports its children's transitions and a rank it saw die of a signal, as
torchrun would), wait for a verified checkpoint, inject the fault, poll
`/api/v1/incidents/?group=...` for detection, quiesce the group, restore generation 2 from
the checkpoint the console calls newest valid, and measure. It must not judge faults
itself: `found_root_cause` is whatever the console named.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from agents.reporter import Reporter
from faultline.embedded import free_port
from faultline.testing.service import Service

FAULT_RANK = 1
# Late enough that the step-5 checkpoint is committed AND hashed by the agent: restart
# advice needs a verified checkpoint, and the drill judges that advice.
FAULT_STEP = 14
DETECT_TIMEOUT_S = 25.0


@dataclass(frozen=True)
class Spec:
    """One row of the drill matrix."""

    name: str
    fault: str  # what is injected, in words
    expected_root_cause: str
    expected_auto_restart_safe: bool
    inside: str = ""  # fault fired inside the rank (trainer --fault)
    restore: bool = True
    quick: bool = True
    # Two ranks by default; a straggler needs a majority to be slow against.
    world: int = 2
    fault_step: int = FAULT_STEP  # for inside faults


MATRIX: tuple[Spec, ...] = (
    Spec("kill", "SIGKILL rank 1", "process_exit", True),
    Spec("oom", "torch.OutOfMemoryError in rank 1", "oom", True, inside="oom"),
    Spec("nan", "NaN loss from a poisoned sample in rank 1", "nan_loss", False, inside="nan"),
    Spec("corrupt_checkpoint", "truncate a committed DCP shard", "checkpoint_modified", False),
    # The stopped rank says nothing; its peers block in the next collective and their
    # agents.torch watchdogs report where they wait, so the console names the rank that
    # never arrived (undetermined: no exit or device evidence, so no automatic restart).
    Spec("hang", "SIGSTOP rank 1", "rank_hang", False, quick=False),
    # The step after a checkpoint carries its phase, which excused silence for 30 min;
    # now the grace is relative to the checkpoint's measured duration (10 s floor here).
    Spec(
        "hang_after_checkpoint",
        "rank 1 stops right after the step carrying the step-10 checkpoint",
        "rank_hang",
        False,
        inside="hang_after_ckpt",
        fault_step=11,
    ),
    Spec(
        "slow",
        "rank 1 sleeps in its input phase",
        "input_stall",
        True,
        inside="slow",
        restore=False,
        quick=False,
        world=3,
    ),
    Spec("stale_generation", "restart while generation 1 keeps writing", "split_brain", False),
    # Byzantine-like: nothing crashes, the loss stays finite; only the fixed-input probe
    # (every 5 steps, compared across ranks) says which rank went wrong.
    Spec(
        "silent_corruption",
        "rank 1's weights silently perturbed (3 ranks)",
        "probe_divergence",
        False,
        inside="corrupt_weights",
        fault_step=12,
        world=3,
    ),
)


@dataclass
class Result:
    fault: str
    drill: str
    expected_root_cause: str
    found_root_cause: str | None = None
    other_root_causes: list[str] = field(default_factory=list)
    detection_s: float | None = None
    quiesce_s: float | None = None
    lost_steps: int | None = None
    lost_tokens: int | None = None
    faultline_lost_steps: int | None = None
    restore_s: float | None = None
    repeated_steps: int | None = None
    auto_restart_safe: bool | None = None
    advice_correct: bool | None = None
    checkpoint: str | None = None
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def passed(self) -> bool:
        return self.error is None and self.found_root_cause == self.expected_root_cause


class Job:
    """One generation of the 2-rank job: its own process group, killed as a whole."""

    def __init__(self, drill: Drill, generation: int, extra: list[str]) -> None:
        self.generation = generation
        self.world = drill.spec.world
        self.stopping = False
        self.status = drill.work / "status" / drill.group / f"gen{generation}"
        self.status.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.procs: list[subprocess.Popen[bytes]] = []
        logs = drill.work / "logs"
        logs.mkdir(exist_ok=True)
        self.logs: list[Path] = []
        for rank in range(self.world):
            env = dict(
                os.environ,
                RANK=str(rank),
                WORLD_SIZE=str(self.world),
                LOCAL_RANK=str(rank),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                FAULTLINE_REPORTER_SOCKET=str(drill.socket),
                PYTHONWARNINGS="ignore",
            )
            cmd = [
                sys.executable, "-m", "faultline.drill.trainer", "--group", drill.group,
                "--generation", str(generation), "--ckpt-root", str(drill.ckpt_root),
                "--status-dir", str(self.status), *extra,
            ]  # fmt: skip
            # One process group per generation (same session): killpg reaches every rank.
            pgid = self.pgid if self.procs else 0
            self.logs.append(logs / f"{drill.group}-g{generation}-r{rank}.log")
            log = open(self.logs[-1], "wb")  # noqa: SIM115
            self.procs.append(
                subprocess.Popen(
                    cmd, env=env, stdout=log, stderr=subprocess.STDOUT, process_group=pgid
                )
            )
            log.close()
        for rank, proc in enumerate(self.procs):
            threading.Thread(
                target=self._watch, args=(drill, rank, proc), name=f"rank{rank}", daemon=True
            ).start()

    def _watch(self, drill: Drill, rank: int, proc: subprocess.Popen[bytes]) -> None:
        """Like torchrun's agent: a rank killed by a signal cannot report itself, so its
        launcher reports the exit the moment waitpid returns (not when someone polls)."""
        code = proc.wait()
        if code < 0 and not self.stopping:
            drill.report_signal_death(self.generation, rank, -code)

    @property
    def pgid(self) -> int:
        return self.procs[0].pid

    def step(self) -> int:
        steps = []
        for rank in range(self.world):
            with contextlib.suppress(OSError, ValueError):
                steps.append(json.loads((self.status / f"rank{rank}.json").read_text())["step"])
        return max(steps, default=0)

    def fault_ts(self) -> float | None:
        with contextlib.suppress(OSError, ValueError):
            return float(json.loads((self.status / "fault.json").read_text())["ts"])
        return None

    def why(self) -> str:
        return first_error(self.logs)

    def alive(self) -> bool:
        return any(p.poll() is None for p in self.procs)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGCONT (a stopped rank cannot die), SIGTERM, then SIGKILL the process group."""
        self.stopping = True
        for sig in (signal.SIGCONT, signal.SIGTERM):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pgid, sig)
        deadline = time.monotonic() + timeout
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, signal.SIGKILL)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)


def first_error(logs: list[Path]) -> str:
    """The last error line of the first rank log that has one, and the log's path: what a
    user reads first when a generation never got going (a missing module, a bad port)."""
    for log in logs:
        with contextlib.suppress(OSError):
            lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines()]
            errors = [ln for ln in lines if "Error" in ln or "error:" in ln]
            if errors:
                return f"{errors[-1][:200]} (see {log})"
    where = logs[0].parent if logs else "the work directory's logs/"
    return f"no rank logged an error (see {where})"


def _wait(predicate: Callable[[], Any], timeout: float, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return None


def all_alive(job: Job) -> bool:
    return all(p.poll() is None for p in job.procs)


def _step_of(checkpoint_id: str | None) -> int:
    if not checkpoint_id:
        return 0
    digits = "".join(ch if ch.isdigit() else " " for ch in checkpoint_id).split()
    return int(digits[-1]) if digits else 0


class Drill:
    def __init__(self, spec: Spec, service: Service, work: Path, socket: Path, tag: str) -> None:
        self.spec, self.service, self.work, self.socket = spec, service, work, socket
        self.group = f"drill-{spec.name.replace('_', '-')}-{tag}"
        self.ckpt_root = work / "ckpt"
        self.result = Result(spec.fault, spec.name, spec.expected_root_cause)
        self.jobs: list[Job] = []
        self.launcher = Reporter(socket_path=str(socket), group=self.group)
        self.restart_count = 0

    # -- the launcher's records ------------------------------------------------------
    def _transition(self, to_state: str, generation: int, **kw: Any) -> None:
        self.launcher.transition(to_state, generation=generation, world_size=self.spec.world, **kw)

    def launch(self, generation: int, extra: list[str]) -> Job:
        job = Job(self, generation, extra)
        self.jobs.append(job)
        self._transition(
            "running",
            generation,
            from_state="initializing" if generation == 1 else "recovering",
            reason="launch" if generation == 1 else "restore",
            restart_count=self.restart_count,
            topology={"dp": self.spec.world, "tp": 1, "pp": 1, "ep": 1},
        )
        return job

    def report_signal_death(self, generation: int, rank: int, sig: int) -> None:
        rep = Reporter(
            socket_path=str(self.socket), group=self.group, generation=generation, rank=rank
        )
        rep.process("exited", exit_code=128 + sig, sig=sig, reason="killed")
        rep.close()

    # -- REST ------------------------------------------------------------------------
    def incidents(self) -> list[dict[str, Any]]:
        try:
            data = self.service.api(f"/api/v1/incidents/?group={self.group}")
        except Exception:  # noqa: BLE001 - the group may not exist yet (404)
            return []
        return [i for i in data["results"] if i["role"] in ("root_cause", "undetermined")]

    def new_incidents(self, t0: float | None) -> list[dict[str, Any]]:
        """Open incidents this fault caused: opened after it was injected (1 s slack for
        clock granularity), so findings that predate the drill are not credited to it."""
        if t0 is None:
            return []
        return [
            i
            for i in self.incidents()
            if i["state"] != "resolved"
            and datetime.fromisoformat(i["opened_at"].replace("Z", "+00:00")).timestamp()
            >= t0 - 1.0
        ]

    def active_findings(self) -> str:
        try:
            data = self.service.api(f"/api/v1/alerts/?group={self.group}")
        except Exception:  # noqa: BLE001 - diagnostics only
            return "unavailable"
        kinds = sorted({f"{a['kind']}/{a['role']}" for a in data["results"] if a["active"]})
        return ", ".join(kinds)

    def agent_phase(self, step: int) -> str | None:
        """The drill agent's recorded phase of this group's checkpoint at `step`."""
        state = self.service.data_dir / "agents" / "drill-node" / "checkpoints.json"
        with contextlib.suppress(OSError, ValueError):
            seen = json.loads(state.read_text())
            return seen.get(self._newest_dir(step), {}).get("phase")
        return None

    def group_info(self) -> dict[str, Any] | None:
        try:
            return self.service.api(f"/api/v1/groups/{self.group}/")
        except Exception:  # noqa: BLE001 - not created yet
            return None

    # -- the drill -------------------------------------------------------------------
    def run(self) -> Result:
        try:
            self._run()
        except Exception as exc:  # noqa: BLE001 - one broken drill must not stop the rest
            self.result.error = f"{type(exc).__name__}: {exc}"[:300]
        finally:
            for job in self.jobs:
                job.stop(timeout=3)
            self.launcher.close()
        return self.result

    def _run(self) -> None:
        spec, r = self.spec, self.result
        extra = ["--ckpt-every", "5"]
        if spec.inside:
            extra += ["--fault", spec.inside, "--fault-rank", str(FAULT_RANK)]
            extra += ["--fault-step", str(spec.fault_step)]
        if spec.name == "corrupt_checkpoint":
            extra += ["--ckpt-until", "10"]  # the corrupted one stays the newest
        job = self.launch(1, extra)
        # Past step 6: step 6 carries the step-5 checkpoint's time, which excuses silence.
        warm = 10 if spec.name in ("corrupt_checkpoint", "stale_generation") else 8
        if not _wait(lambda: job.step() >= warm or not all_alive(job), 90) or job.step() < warm:
            raise RuntimeError(f"generation 1 never reached step {warm}: {job.why()}")
        # The node agent's own view: committed and hashed (not the console's verdict).
        verified = ("verified", "corrupt")
        if spec.name in ("corrupt_checkpoint", "stale_generation") and not _wait(
            lambda: self.agent_phase(10) in verified, 30, 0.2
        ):
            raise RuntimeError("the agent never verified the step-10 checkpoint")
        if not spec.inside and not _wait(lambda: self.agent_phase(5) in verified, 30, 0.2):
            raise RuntimeError("the agent never verified the step-5 checkpoint")
        if spec.name == "corrupt_checkpoint":
            time.sleep(3.0)  # let the console digest the verification before we break it
        t0 = self.inject(job)
        # Poll until the console names the injected cause (or time runs out). Other root
        # causes it opens meanwhile are kept: a wrong first page is part of the result.
        detected = None
        deadline = time.monotonic() + DETECT_TIMEOUT_S
        found: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            if t0 is None:
                t0 = job.fault_ts()
            found = self.new_incidents(t0) or found
            if any(i["kind"] == spec.expected_root_cause for i in found):
                detected = time.time()
                break
            time.sleep(0.1)
        if t0 is None:
            raise RuntimeError(f"the {spec.inside} fault never fired in rank {FAULT_RANK}")
        kinds = [i["kind"] for i in found]
        r.other_root_causes = sorted({k for k in kinds if k != spec.expected_root_cause})
        if detected is None:
            r.found_root_cause = kinds[0] if kinds else None  # the newest
            raise RuntimeError(
                f"{spec.expected_root_cause} not named within {DETECT_TIMEOUT_S:.0f}s; "
                f"active findings: {self.active_findings() or 'none'}"
            )
        r.detection_s = round(detected - t0, 2)
        r.found_root_cause = spec.expected_root_cause
        head = next(i for i in found if i["kind"] == r.found_root_cause)
        recovery = head.get("recovery") or {}
        r.auto_restart_safe = recovery.get("auto_restart_safe")
        r.faultline_lost_steps = recovery.get("lost_steps")
        r.advice_correct = r.auto_restart_safe == spec.expected_auto_restart_safe
        if not spec.restore:
            job.stop()
            return
        self.quiesce(job, detected)
        self.restore(job)

    def inject(self, job: Job) -> float | None:
        """External faults now (returns t0); inside faults fire in the rank (t0 later)."""
        victim = job.procs[FAULT_RANK]
        name = self.spec.name
        if name == "kill":
            victim.send_signal(signal.SIGKILL)
        elif name == "hang":
            victim.send_signal(signal.SIGSTOP)
        elif name == "corrupt_checkpoint":
            shard = sorted((self.ckpt_root / f"{self.group}-step_000010").glob("*.distcp"))[-1]
            with open(shard, "r+b") as fh:
                fh.truncate(max(0, shard.stat().st_size // 2))
        elif name == "stale_generation":
            # The scheduler starts generation 2, but generation 1 was never stopped.
            self.restart_count += 1
            self.launch(2, ["--ckpt-every", "5", "--resume", self._newest_dir(10)])
        else:
            return None
        return time.time()

    def _newest_dir(self, step: int) -> str:
        return str(self.ckpt_root / f"{self.group}-step_{step:06d}")

    def quiesce(self, job: Job, detected: float) -> None:
        """Stop every rank of every running generation before touching state."""
        self._transition("quiescing", self.jobs[-1].generation, from_state="running")
        for running in self.jobs:
            running.stop()
        self.result.quiesce_s = round(time.time() - detected, 2)

    def restore(self, job: Job) -> None:
        r = self.result
        last = max(j.step() for j in self.jobs)
        info = self.group_info() or {}
        ckpt = info.get("newest_valid_checkpoint")
        r.checkpoint = ckpt
        resume = _step_of(ckpt)
        r.lost_steps = last - resume
        r.lost_tokens = r.lost_steps * 32 * 64 * self.spec.world
        generation = self.jobs[-1].generation + 1
        self._transition("recovering", generation - 1, from_state="quiescing")
        self.restart_count += 1
        extra = ["--ckpt-every", "5"]
        if ckpt:
            extra += ["--resume", str(self.ckpt_root / ckpt)]
        began = time.time()
        new = self.launch(generation, extra)
        if not _wait(lambda: new.step() > resume, 90):
            raise RuntimeError(f"generation {generation} never stepped after restore")
        r.restore_s = round(time.time() - began, 2)
        # Repeated work, measured: run until the job is back where it stopped.
        _wait(lambda: new.step() >= last or not new.alive(), 60)
        r.repeated_steps = max(0, min(new.step(), last) - resume)
