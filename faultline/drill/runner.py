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
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from agents.fake_nvml import fake_uuid
from agents.reporter import Reporter
from console.diagnosis.recovery_costs import Marks, RecoveryCosts, recovery_costs
from console.diagnosis.rules.base import RECENT_STEPS
from faultline.drill import invariants, network
from faultline.drill.matrix import FAULT_RANK, MATRIX, NOT_HERE, Spec
from faultline.drill.netns import DrillNet
from faultline.drill.util import all_alive, first_error, world_shape
from faultline.drill.util import step_of as _step_of
from faultline.drill.util import wait as _wait
from faultline.embedded import free_port
from faultline.testing.service import Service

DETECT_TIMEOUT_S = 25.0
# The step rules (network_slow's collective share, stragglers) judge the median of a rank's
# last RECENT_STEPS // 4 steps: a fault is visible to them only once most of that window
# is faulted steps. On a loaded box a faulted step can take seconds, so detection waits at
# least that many steps past the injection (while the job still steps), not a fixed time.
RULE_WINDOW_STEPS = RECENT_STEPS // 4
DETECT_CAP_S = 4 * DETECT_TIMEOUT_S  # even a job that keeps stepping ends the wait here
# slow_link: the shaped link carries one step's bytes in SLOW_FACTOR x a healthy step, so
# the collective is >= SLOW_FACTOR / (SLOW_FACTOR + 1) of a faulted step (3: 75 %, over the
# rule's 50 % even if the rest of the step doubles under load) and the link is busy, bytes
# queued, in most of the agent's reads (docs/drills.md).
SLOW_FACTOR = 3.0
LINK_SAMPLE_STEPS = 4  # healthy steps over which the link's bytes per step are measured
CONVERGE_S = 10.0
# At load ~25 on 2 shared cores three ranks took 158-163 s from launch to their first step
# (5-10 s on a quiet box): a start that is slow but alive is not a failed drill.
START_CAP_S = 300.0
CKPT_FAULTS = frozenset(
    {"corrupt_checkpoint", "ckpt_shard_missing", "ckpt_shard_duplicated", "ckpt_partial_manifest"}
)
XID_GPU_INDEX = 7  # the fake GPU the xid row breaks (no other row's rank uses it)
PARTITIONED_NODE = 2  # the partition row cuts node 2 off from nodes 0 and 1
TOKENS_PER_RANK_STEP = 32 * 64
INCIDENT_COSTS_WAIT_S = 10.0  # for the console to see generation 2's steps

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
    alone: bool = False  # Spec.alone: any other root cause fails the row
    # The seed's invariants, checked after recovery: name -> held (None: not applicable).
    invariants: dict[str, bool] = field(default_factory=dict)
    measured: dict[str, Any] = field(default_factory=dict)  # row-specific figures
    # The incident the console opened for this fault, and the recovery costs it measured
    # from its own records (console.queries.recovery), beside the drill's own.
    incident: int | None = None
    incident_costs: dict[str, Any] | None = None
    # Where the row's wall time went (s): the phases of Drill._run and the row's total, so a
    # slow session says which fixed cost grew (docs/drills.md, "How long a session takes").
    wall_s: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["passed"] = self.passed
        return out

    @property
    def passed(self) -> bool | None:
        """Invariants held, the error was located (and, for a row that says so, nothing
        else was blamed), the advice was right (None: not run)."""
        if self.runs == NOT_HERE:
            return None
        return (
            self.error is None
            and self.found_root_cause == self.expected_root_cause
            and self.advice_correct is not False
            and not (self.alone and self.other_root_causes)
            and all(self.invariants.values())
        )


class Job:
    """One generation of the 2-rank job: its own process group, killed as a whole."""

    def __init__(
        self,
        drill: Drill,
        generation: int,
        extra: list[str],
        world: int | None = None,
        module: str = "faultline.drill.trainer",
    ) -> None:
        self.generation = generation
        self.world = world or drill.spec.world
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
                *drill.prefix(rank),
                sys.executable,
                "-m",
                module,
                "--group",
                drill.group,
                "--generation",
                str(generation),
                "--ckpt-root",
                str(drill.ckpt_root),
                "--status-dir",
                str(self.status),
                *extra,
            ]
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

    def stepped_within(self, seconds: float) -> bool:
        """Some rank finished a step in the last `seconds` (the job still makes progress)."""
        now = time.time()
        for rank in range(self.world):
            with contextlib.suppress(OSError, ValueError):
                ts = json.loads((self.status / f"rank{rank}.json").read_text())["ts"]
                if now - float(ts) < seconds:
                    return True
        return False

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


_NODE_AGENTS: dict[str, Path] = {}


def slow_link_rate(bytes_per_step: float, healthy_step_s: float) -> tuple[int, int]:
    """(tbf rate in bits/s, queue in bytes) that make the link carry one step's bytes in
    SLOW_FACTOR healthy steps; the queue holds four steps' bytes, so it delays, not drops."""
    rate_bps = max(8_000, int(8 * bytes_per_step / (SLOW_FACTOR * max(healthy_step_s, 1e-3))))
    return rate_bps, max(64_000, int(4 * bytes_per_step))


def node_agents(service: Service, count: int) -> list[Path]:
    """Reporter sockets of `count` agents `drill-net-<i>` (started once per session): the
    network rows' ranks each live on a node of their own, so the console can tell them
    apart by node."""
    out = []
    for i in range(count):
        name = network.node_name(i)
        if name not in _NODE_AGENTS:
            # The agent reads its node's network through the namespace's view (netns.py
            # DrillNet.expose: the same paths every row), once a second.
            view = net_view(service) / str(i)
            config = service.data_dir / "agents" / f"{name}.toml"
            config.parent.mkdir(parents=True, exist_ok=True)
            config.write_text(
                "[host]\ninterval = 1.0\n"
                f'net_sys_root = "{view / "sys"}"\nnet_dir = "{view / "net"}"\n'
                f'net_ns = "{view / "ns"}"\n'
                'interfaces = ["eth0"]\n'
            )
            # 0.25 s ticks: four reads of the socket table per 1 s round (a stuck link is
            # one backed up in most of them, not one caught once with bytes in flight).
            service.start_agent(name, "--interval", "0.25", "--config", str(config))
            _NODE_AGENTS[name] = service.data_dir / "agents" / name / "reporter.sock"
        out.append(_NODE_AGENTS[name])
    if not _wait(lambda: all(p.exists() for p in out), 30):
        raise RuntimeError("the network rows' node agents never opened their sockets")
    return out


def net_view(service: Service) -> Path:
    """Where the network rows expose each namespace node's sysfs and /proc/net."""
    return service.data_dir / "netview"


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
        self.slow_rate = (2_000_000, 64_000)  # slow_link: tbf bits/s and queue bytes (sized)
        self.broken: set[int] = set()  # checkpoint steps this drill broke on purpose
        # What happened when (epoch s) and how far the job got: recovery_costs' Marks.
        self.marks: dict[str, Any] = {"first_evidence": None, "detected": None}
        self._lap_at = time.monotonic()
        self.wants_costs = False  # the row's incident costs are read at the session's end
        self.result.runs, self.result.layer = spec.runs, spec.layer
        self.result.alone = spec.alone
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
        elif self.net is None:
            # Every rank on the drill node says its (fake) GPU, as agents.torch does on a
            # GPU box: a rank whose GPU is unknown is judged against every GPU of its node
            # (rules/device.py), so the xid row's unrepaired GPU 7 paged each later row.
            env["FAULTLINE_GPU"] = fake_uuid("drill-node", rank)
        return env

    # -- the launcher's records ------------------------------------------------------
    def _transition(self, to_state: str, generation: int, **kw: Any) -> None:
        kw.setdefault("world_size", self.spec.world)
        self.launcher.transition(to_state, generation=generation, **kw)

    def launch(
        self,
        generation: int,
        extra: list[str],
        world: int | None = None,
        module: str = "faultline.drill.trainer",
        shape: dict[str, int] | None = None,
    ) -> Job:
        """Start a generation; its `running` transition carries the world's shape (`shape`
        with DP filled in; the trainer's own `--tp`/`--pp`/`--ep` must agree: the caller
        passes both)."""
        job = Job(self, generation, extra, world, module)
        self.jobs.append(job)
        self._transition(
            "running",
            generation,
            from_state="initializing" if generation == 1 else "recovering",
            reason="launch" if generation == 1 else "restore",
            restart_count=self.restart_count,
            world_size=job.world,
            topology=world_shape(job.world, shape),
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

    def lap(self, phase: str) -> None:
        """Charge the wall time since the previous lap to `phase` (Result.wall_s)."""
        now = time.monotonic()
        self.result.wall_s[phase] = round(now - self._lap_at, 2)
        self._lap_at = now

    # -- the drill -------------------------------------------------------------------
    def run(self) -> Result:
        if self.spec.runs == NOT_HERE:
            return self.result
        began = time.monotonic()
        self._lap_at = began
        try:
            if self.spec.name == "telemetry_down":
                from faultline.drill.observer import telemetry_down

                telemetry_down(self)
            elif self.spec.layer == "serving":
                from faultline.drill import serving_drill

                serving_drill.run(self)
            elif self.spec.name in ("clock_throttle", "intra_node_link"):
                from faultline.drill import fake_device

                fake_device.run(self)
            elif self.spec.name == "torchrun_restart":
                from faultline.drill.elastic import torchrun_restart

                torchrun_restart(self)
            elif self.spec.name.startswith("topology_change"):
                from faultline.drill.topology import topology_change

                topology_change(self)
            else:
                self._run()
        except Exception as exc:  # noqa: BLE001 - one broken drill must not stop the rest
            error = f"{type(exc).__name__}: {exc}"[:300]
            if self.group_info() is None:  # say why nothing could be named, not just that
                error += (
                    f" (the console has no group {self.group}: ingest never created it;"
                    " a refused group is recorded as a violation)"
                )
            self.result.error = error
        finally:
            for job in self.jobs:
                job.stop(timeout=3)
            self.launcher.close()
            if self.net is not None:
                self.net.remove()  # always: the namespaces, links, qdiscs and rules go
            if self.spec.name == "xid":
                with open(self.work / "nvml-control" / "drill-node", "a") as fh:
                    fh.write(f"{XID_GPU_INDEX}:clear\n")
            # Teardown; the whole row where a row module has no laps, or up to its error.
            self.lap("rest" if self.result.error is None else "until_error")
            self.result.wall_s["row"] = round(time.monotonic() - began, 2)
        return self.result

    def _run(self) -> None:
        spec, r = self.spec, self.result
        extra = ["--ckpt-every", "5"]
        if spec.network:
            self.net = DrillNet(f"{self.tag[:4]}{spec.name[:3]}", spec.world).create()
            self.net.expose(net_view(self.service))
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
        # Start-up (importing torch, joining gloo) is CPU-bound and precedes any step: it
        # may take START_CAP_S while every rank lives; then 90 s of steps to `warm`.
        _wait(lambda: job.step() >= 1 or not all_alive(job), START_CAP_S)
        if not _wait(lambda: job.step() >= warm or not all_alive(job), 90) or job.step() < warm:
            raise RuntimeError(f"generation 1 never reached step {warm}: {job.why()}")
        self.lap("start_to_warm")
        # The node agent's own view: committed and hashed (not the console's verdict).
        verified = ("verified", "corrupt")
        if after_ten and not _wait(lambda: self.agent_phase(10) in verified, 30, 0.2):
            raise RuntimeError("the agent never verified the step-10 checkpoint")
        if not spec.inside and not _wait(lambda: self.agent_phase(5) in verified, 30, 0.2):
            raise RuntimeError("the agent never verified the step-5 checkpoint")
        if spec.name in CKPT_FAULTS:
            # The console must hold the verified step-10 checkpoint as newest valid before we
            # break it (was a fixed 3 s sleep: waiting on the state itself is both shorter
            # and certain; CONVERGE_S bounds it as it bounds the restore point below).
            _wait(
                lambda: _step_of((self.group_info() or {}).get("newest_valid_checkpoint")) == 10,
                CONVERGE_S,
                0.2,
            )
        self.lap("checkpoint_verified")
        if spec.name == "slow_link":
            self._size_slow_link(job)
        t0 = self.inject(job)
        injected_at = job.step()
        # Poll until the console names the injected cause (or time runs out). Other root
        # causes it opens meanwhile are kept: a wrong first page is part of the result.
        detected = None
        began = time.monotonic()
        found: list[dict[str, Any]] = []
        while self._still_detecting(job, began, injected_at):
            if t0 is None:
                t0 = job.fault_ts()
            found = self.new_incidents(t0) or found
            if any(i["kind"] == spec.expected_root_cause for i in found):
                detected = time.time()
                break
            time.sleep(0.1)
        r.measured["steps_after_fault"] = job.step() - injected_at
        r.measured["detect_wait_s"] = round(time.monotonic() - began, 2)
        if t0 is None:
            raise RuntimeError(f"the {spec.inside} fault never fired in rank {FAULT_RANK}")
        kinds = [i["kind"] for i in found]
        r.other_root_causes = sorted({k for k in kinds if k != spec.expected_root_cause})
        if detected is None:
            r.found_root_cause = kinds[0] if kinds else None  # the newest
            raise RuntimeError(
                f"{spec.expected_root_cause} not named within "
                f"{r.measured['detect_wait_s']:.0f}s ({r.measured['steps_after_fault']} steps); "
                f"active findings: {self.active_findings() or 'none'}"
            )
        self.lap("inject_to_named")
        self.marks.update(first_evidence=t0, detected=detected)
        r.detection_s = self._costs().detection_s
        r.found_root_cause = spec.expected_root_cause
        head = next(i for i in found if i["kind"] == r.found_root_cause)
        r.incident = head.get("id")
        recovery = head.get("recovery") or {}
        r.auto_restart_safe = recovery.get("auto_restart_safe")
        r.faultline_lost_steps = recovery.get("lost_steps")
        r.advice_correct = r.auto_restart_safe == spec.expected_auto_restart_safe
        located: dict[str, bool] = {}
        if spec.network:
            faulty = PARTITIONED_NODE if spec.name == "partition" else FAULT_RANK
            located = network.judge(self, faulty, head)
        if not spec.restore:
            for running in self.jobs:
                running.stop()
            r.invariants = {**invariants.without_restore(self), **located}
            return
        self.quiesce(job, detected)
        self.lap("quiesce")
        self.restore(job)
        self.lap("restore_and_redo")
        r.invariants = invariants.check(self)
        self.lap("invariants")
        # The console's own costs are read after the last row (collect_incident_costs): it
        # measures them on its next passes, which here cost each restore row up to
        # INCIDENT_COSTS_WAIT_S of waiting; by the session's end they are long final.
        self.wants_costs = True

    @staticmethod
    def _still_detecting(job: Job, began: float, injected_at: int) -> bool:
        """DETECT_TIMEOUT_S, and past it for as long as the job keeps stepping but has not
        yet run the rule window's steps since the injection (DETECT_CAP_S at most)."""
        waited = time.monotonic() - began
        if waited < DETECT_TIMEOUT_S:
            return True
        return (
            waited < DETECT_CAP_S
            and all_alive(job)
            and job.step() - injected_at < RULE_WINDOW_STEPS
            and job.stepped_within(DETECT_TIMEOUT_S)
        )

    def _size_slow_link(self, job: Job) -> None:
        """Measure the faulty node's bytes per step and the healthy step time, and shape its
        link so one step's bytes take SLOW_FACTOR healthy steps (`measured` keeps them).
        A fixed rate is a different fault on a quiet box and a loaded one: at 2 mbit
        the tiny model's ~45 kB a step took about as long as the rest of a step, so
        under load the collective fell under the rule's 50 % and the link sat idle in
        half of the agent's reads."""
        net = self.net
        if net is None:
            return
        before, s0, t0 = net.counters(FAULT_RANK), job.step(), time.monotonic()
        _wait(lambda: job.step() >= s0 + LINK_SAMPLE_STEPS or not all_alive(job), 60)
        after, s1, t1 = net.counters(FAULT_RANK), job.step(), time.monotonic()
        steps = max(1, s1 - s0)
        per_step = max(after.get(k, 0) - before.get(k, 0) for k in ("tx_bytes", "rx_bytes")) / steps
        step_s = (t1 - t0) / steps
        self.slow_rate = slow_link_rate(per_step, step_s)
        rate_bps = self.slow_rate[0]
        self.result.measured.update(
            link_bytes_per_step=round(per_step),
            healthy_step_ms=round(step_s * 1000, 1),
            shaped_rate_kbit=round(rate_bps / 1000, 1),
        )

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
            self.net.slow(FAULT_RANK, *self.slow_rate)
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
        self.marks["quiesced"] = time.time()
        self.result.quiesce_s = self._costs().quiesce_s

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
        self.marks.update(
            last_step=last,
            resume_step=resume,
            lost_tokens=max(0, last - resume) * TOKENS_PER_RANK_STEP * self.spec.world,
            gpus=self.spec.world,
            checkpoint=ckpt,
        )
        generation = self.jobs[-1].generation + 1
        self._transition("recovering", generation - 1, from_state="quiescing")
        self.restart_count += 1
        extra = ["--ckpt-every", "5"]
        if ckpt:
            extra += ["--resume", str(self.ckpt_root / ckpt)]
        self.marks["restarted"] = time.time()
        new = self.launch(generation, extra)
        if not _wait(lambda: new.step() > resume, 90):
            raise RuntimeError(f"generation {generation} never stepped after restore")
        self.marks["first_valid_step"] = time.time()
        # Repeated work, measured: run until the job is back where it stopped.
        _wait(lambda: new.step() >= last or not new.alive(), 60)
        self.marks["redone_step"] = new.step()
        costs = self._costs()
        r.lost_steps, r.lost_tokens = costs.lost_steps, costs.lost_tokens
        r.restore_s, r.repeated_steps = costs.restore_s, costs.repeated_steps

    def _costs(self) -> RecoveryCosts:
        """The drill's marks through the one definition the console uses for incidents."""
        costs = recovery_costs(Marks(**self.marks))
        floats: dict[str, Any] = {
            k: round(v, 2) for k, v in costs.to_dict().items() if isinstance(v, float)
        }
        return replace(costs, **floats)

    def collect_incident_costs(self) -> None:
        """Read the console's costs of this row's incident, if the row restored."""
        if self.wants_costs and self.result.incident_costs is None:
            self.result.incident_costs = self.incident_costs(self.result.incident)

    def incident_costs(self, incident: int | None) -> dict[str, Any] | None:
        """The console's own costs for the drill's incident, from its records (REST)."""
        if incident is None:
            return None
        wanted = (
            "detection_s",
            "quiesce_s",
            "lost_steps",
            "lost_tokens",
            "lost_gpu_hours",
            "restore_s",
            "repeated_steps",
            "repeated_samples",
            "downtime_s",
            "numbers_held",
            "slo_held",
            "complete",
        )
        costs: dict[str, Any] = {}
        deadline = time.monotonic() + INCIDENT_COSTS_WAIT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):  # the service may be busy: retry
                costs = self.service.api(f"/api/v1/incidents/{incident}/").get("costs") or {}
            if costs.get("restore_s") is not None and costs.get("repeated_steps") is not None:
                break
            time.sleep(0.5)
        return {k: costs.get(k) for k in wanted} if costs else None
