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

from agents.fake_nvml import fake_uuid
from agents.reporter import Reporter
from faultline.drill import invariants
from faultline.drill.matrix import FAULT_RANK, MATRIX, NOT_HERE, Spec
from faultline.drill.netns import DrillNet
from faultline.embedded import free_port
from faultline.testing.service import Service

DETECT_TIMEOUT_S = 25.0
CONVERGE_S = 10.0
CKPT_FAULTS = frozenset(
    {"corrupt_checkpoint", "ckpt_shard_missing", "ckpt_shard_duplicated", "ckpt_partial_manifest"}
)
XID_GPU_INDEX = 7  # the fake GPU the xid row breaks (no other row's rank uses it)
PARTITIONED_NODE = 2  # the partition row cuts node 2 off from nodes 0 and 1
TOKENS_PER_RANK_STEP = 32 * 64

__all__ = ["MATRIX", "Drill", "Result", "Spec", "first_error"]


@dataclass
class Result:
    fault: str
    drill: str
    expected_root_cause: str | None
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
    runs: str = "real"
    layer: str = ""
    note: str | None = None  # why a row did not run, or what was faked
    # The seed's invariants, checked after recovery: name -> held (None: not applicable).
    invariants: dict[str, bool] = field(default_factory=dict)
    measured: dict[str, Any] = field(default_factory=dict)  # row-specific figures

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["passed"] = self.passed
        return out

    @property
    def passed(self) -> bool | None:
        """Invariants held, the error was located, the advice was right (None: not run)."""
        if self.runs == NOT_HERE:
            return None
        return (
            self.error is None
            and self.found_root_cause == self.expected_root_cause
            and self.advice_correct is not False
            and all(self.invariants.values())
        )


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
                MASTER_ADDR=drill.master_addr,
                MASTER_PORT=str(port),
                FAULTLINE_REPORTER_SOCKET=str(drill.socket_of(rank)),
                PYTHONWARNINGS="ignore",
                **drill.rank_env(rank),
            )
            cmd = [
                *drill.prefix(rank), sys.executable, "-m", "faultline.drill.trainer",
                "--group", drill.group,
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


_NODE_AGENTS: dict[str, Path] = {}


def node_agents(service: Service, count: int) -> list[Path]:
    """Reporter sockets of `count` agents `drill-net-<i>` (started once per session): the
    network rows' ranks each live on a node of their own, so the console can tell them
    apart by node."""
    out = []
    for i in range(count):
        name = f"drill-net-{i}"
        if name not in _NODE_AGENTS:
            service.start_agent(name, "--interval", "0.5")
            _NODE_AGENTS[name] = service.data_dir / "agents" / name / "reporter.sock"
        out.append(_NODE_AGENTS[name])
    if not _wait(lambda: all(p.exists() for p in out), 30):
        raise RuntimeError("the network rows' node agents never opened their sockets")
    return out


def _step_of(checkpoint_id: str | None) -> int:
    if not checkpoint_id:
        return 0
    digits = "".join(ch if ch.isdigit() else " " for ch in checkpoint_id).split()
    return int(digits[-1]) if digits else 0


class Drill:
    def __init__(self, spec: Spec, service: Service, work: Path, socket: Path, tag: str) -> None:
        self.spec, self.service, self.work, self.socket = spec, service, work, socket
        self.tag = tag
        self.group = f"drill-{spec.name.replace('_', '-')}-{tag}"
        self.ckpt_root = work / "ckpt"
        self.result = Result(spec.fault, spec.name, spec.expected_root_cause)
        self.jobs: list[Job] = []
        self.launcher = Reporter(socket_path=str(socket), group=self.group)
        self.restart_count = 0
        self.net: DrillNet | None = None  # network rows: ranks in namespaces of their own
        self.node_sockets: list[Path] = []  # network rows: one agent per namespace node
        self.gpus: dict[int, str] = {}  # fake-NVML rows: rank -> fake GPU UUID
        self.broken: set[int] = set()  # checkpoint steps this drill broke on purpose
        self.result.runs, self.result.layer = spec.runs, spec.layer
        self.result.note = spec.why or None

    # -- where ranks run -------------------------------------------------------------
    @property
    def master_addr(self) -> str:
        return "127.0.0.1" if self.net is None else self.net.ip(0)

    def socket_of(self, rank: int) -> Path:
        return self.node_sockets[rank] if self.node_sockets else self.socket

    def prefix(self, rank: int) -> list[str]:
        return [] if self.net is None else self.net.prefix(rank)

    def rank_env(self, rank: int) -> dict[str, str]:
        env: dict[str, str] = {}
        if self.net is not None:
            env["GLOO_SOCKET_IFNAME"] = "eth0"  # gloo's traffic on the drill's own link
        if rank in self.gpus:
            env["FAULTLINE_GPU"] = self.gpus[rank]
        return env

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
            socket_path=str(self.socket_of(rank)),
            group=self.group,
            generation=generation,
            rank=rank,
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
        if self.spec.runs == NOT_HERE:
            return self.result
        try:
            if self.spec.name == "telemetry_down":
                from faultline.drill.observer import telemetry_down

                telemetry_down(self)
            else:
                self._run()
        except Exception as exc:  # noqa: BLE001 - one broken drill must not stop the rest
            self.result.error = f"{type(exc).__name__}: {exc}"[:300]
        finally:
            for job in self.jobs:
                job.stop(timeout=3)
            self.launcher.close()
            if self.net is not None:
                self.net.remove()  # always: the namespaces, links, qdiscs and rules go
            if self.spec.name == "xid":
                with open(self.work / "nvml-control" / "drill-node", "a") as fh:
                    fh.write(f"{XID_GPU_INDEX}:clear\n")
        return self.result

    def _run(self) -> None:
        spec, r = self.spec, self.result
        extra = ["--ckpt-every", "5"]
        if spec.network:
            self.net = DrillNet(f"{self.tag[:4]}{spec.name[:3]}", spec.world).create()
            self.node_sockets = node_agents(self.service, spec.world)
        if spec.name == "xid":
            self.gpus[FAULT_RANK] = fake_uuid("drill-node", XID_GPU_INDEX)
        if spec.inside:
            extra += ["--fault", spec.inside, "--fault-rank", str(FAULT_RANK)]
            extra += ["--fault-step", str(spec.fault_step)]
        after_ten = spec.name in CKPT_FAULTS or spec.name == "stale_generation"
        if spec.name in CKPT_FAULTS:
            extra += ["--ckpt-until", "10"]  # the broken one stays the newest
        job = self.launch(1, extra)
        # Past step 6: step 6 carries the step-5 checkpoint's time, which excuses silence.
        warm = 10 if after_ten else 8
        if not _wait(lambda: job.step() >= warm or not all_alive(job), 90) or job.step() < warm:
            raise RuntimeError(f"generation 1 never reached step {warm}: {job.why()}")
        # The node agent's own view: committed and hashed (not the console's verdict).
        verified = ("verified", "corrupt")
        if after_ten and not _wait(lambda: self.agent_phase(10) in verified, 30, 0.2):
            raise RuntimeError("the agent never verified the step-10 checkpoint")
        if not spec.inside and not _wait(lambda: self.agent_phase(5) in verified, 30, 0.2):
            raise RuntimeError("the agent never verified the step-5 checkpoint")
        if spec.name in CKPT_FAULTS:
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
            for running in self.jobs:
                running.stop()
            r.invariants = invariants.without_restore(self)
            return
        self.quiesce(job, detected)
        self.restore(job)
        r.invariants = invariants.check(self)

    def inject(self, job: Job) -> float | None:
        """External faults now (returns t0); inside faults fire in the rank (t0 later)."""
        victim = job.procs[FAULT_RANK]
        name = self.spec.name
        if name == "kill":
            victim.send_signal(signal.SIGKILL)
        elif name == "hang":
            victim.send_signal(signal.SIGSTOP)
        elif name in CKPT_FAULTS:
            self._break_checkpoint(name, Path(self._newest_dir(10)))
        elif name == "xid":
            control = self.work / "nvml-control" / "drill-node"
            with open(control, "a") as fh:
                fh.write(f"{XID_GPU_INDEX}:xid79\n")
        elif name == "slow_link" and self.net is not None:
            self.net.slow(FAULT_RANK)
        elif name == "lossy_link" and self.net is not None:
            self.net.lossy(FAULT_RANK)
        elif name == "partition" and self.net is not None:
            self.net.partition(PARTITIONED_NODE)
        elif name == "stale_generation":
            # The scheduler starts generation 2, but generation 1 was never stopped.
            self.restart_count += 1
            self.launch(2, ["--ckpt-every", "5", "--resume", self._newest_dir(10)])
        else:
            return None
        return time.time()

    def _break_checkpoint(self, how: str, directory: Path) -> None:
        """Break the committed, verified step-10 checkpoint the way `how` says."""
        shards = sorted(directory.glob("*.distcp"))
        if how == "corrupt_checkpoint":
            with open(shards[-1], "r+b") as fh:
                fh.truncate(max(0, shards[-1].stat().st_size // 2))
        elif how == "ckpt_shard_missing":
            shards[-1].unlink()
        elif how == "ckpt_shard_duplicated":
            (directory / f"__{len(shards) + 7}_0.distcp").write_bytes(shards[0].read_bytes())
        elif how == "ckpt_partial_manifest":
            (directory / ".metadata").unlink()
        self.broken.add(10)

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
        # The console learns of the agent's newest verification a moment later: give it up
        # to CONVERGE_S to name the restore point the drill knows is right.
        expected = invariants.newest_valid_step(self)
        began = time.monotonic()
        info = self.group_info() or {}
        while (
            _step_of(info.get("newest_valid_checkpoint")) != expected
            and time.monotonic() - began < CONVERGE_S
        ):
            time.sleep(0.5)
            info = self.group_info() or {}
            expected = invariants.newest_valid_step(self)  # the agent's state file lags too
        ckpt = info.get("newest_valid_checkpoint")
        r.checkpoint = ckpt
        resume = _step_of(ckpt)
        r.measured.update(
            last_step=last,
            resume_step=resume,
            expected_resume=expected,
            restore_point_wait_s=round(time.monotonic() - began, 2),
        )
        r.lost_steps = last - resume
        r.lost_tokens = r.lost_steps * TOKENS_PER_RANK_STEP * self.spec.world
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
