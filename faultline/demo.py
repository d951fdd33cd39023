"""`faultline demo`: the service plus a simulated fleet that fails, live, through the real path.

Owns the demo: it starts the service exactly like `faultline up` (same supervisor and
children), one REAL `faultline-agent run --fake-gpus N` process per simulated node, and one
workload simulator process (`python -m faultline.demo simulate PLAN`) that plays two
training groups and one serving group through `agents.reporter` -> the node's agent ->
HTTP ingest, and a schedule of faults that recover through a new generation. It must not
write to the database itself (only tokens, through ingest.auth, before the fleet starts)
and must not hold diagnosis logic: what the console shows comes from the real pipeline.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.fake_nvml import CONTROL_ENV, fake_uuid
from agents.reporter import Reporter

BIN = Path(sys.executable).parent
RANKS_PER_NODE = 4
WORKERS_PER_NODE = 2
STEP_S = 1.0
SERVING_WINDOW_S = 5.0
CKPT_EVERY = 10

# The fault matrix from the seed, in the order the demo plays it: (kind, group).
MATRIX: tuple[tuple[str, str], ...] = (
    ("xid79", "train-a"),
    ("thermal_straggler", "train-b"),
    ("collective_mismatch", "train-a"),
    ("oom", "train-b"),
    ("serving_not_ready", "serve"),
    ("nan_loss", "train-a"),
    ("slow_nic", "train-b"),
    ("corrupt_checkpoint", "train-a"),
    ("stale_generation", "train-b"),
)
# (seconds before the first fault, seconds between faults, seconds a fault is held).
SCHEDULES = {"demo": (30.0, 40.0, 45.0), "fast": (12.0, 20.0, 25.0), "none": (0.0, 0.0, 0.0)}


# -- orchestration (the `faultline demo` process) ----------------------------------------


def _agent_command(server: str, token: str, node: str, state: Path, gpus: int) -> list[str]:
    return [
        str(BIN / "faultline-agent"), "run", "--server", server, "--token", token,
        "--node", node, "--fake-gpus", str(gpus), "--state-dir", str(state),
        "--config", str(state / "agent.toml"), "--checkpoint-root", str(state / "checkpoints"),
        "--log-level", "WARNING",
    ]  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """`faultline demo`: like `up`, plus agents and the workload simulator as children."""
    from faultline import cli
    from faultline.embedded import EmbeddedError, free_port, port_in_use

    started = time.monotonic()
    if args.nodes < 3:
        print(f"faultline: --nodes {args.nodes} is too small; the demo needs at least 3")
        return 2
    args.ws_port = args.ws_port or args.port + 1
    for port, flag in ((args.port, "--port"), (args.ws_port, "--ws-port")):
        if port_in_use(port, args.host):
            print(f"faultline: port {port} is already in use; choose another with {flag} N")
            return 2
    data_dir = cli._data_dir(args.data_dir)
    try:
        emb = cli._prepare_env(data_dir, for_up=True)
    except EmbeddedError as exc:
        print(f"faultline: {exc}")
        return 2
    os.environ["FAULTLINE_WS_PORT"] = str(args.ws_port)
    demo_dir = data_dir / "demo"
    try:
        cli._django_setup()
        from django.core.management import call_command

        from ingest.auth import issue_token

        call_command("migrate", interactive=False, verbosity=0)
        login = cli._ensure_admin()
        nodes = [f"node-{i:03d}" for i in range(1, args.nodes + 1)]
        tokens = {node: issue_token(node_name=node) for node in nodes}
        cli._close_db()
        # Each run starts from a clean fleet: old spools would replay yesterday's demo.
        shutil.rmtree(demo_dir, ignore_errors=True)
        control = demo_dir / "fake-nvml"
        control.mkdir(parents=True)
        host = "127.0.0.1" if args.host in ("0.0.0.0", "") else args.host  # noqa: S104
        server = f"http://{host}:{args.port}"
        commands = cli._children(args)
        plan: dict[str, Any] = {
            "nodes": {},
            "gpus": args.gpus,
            "schedule": args.schedule,
            "seed": args.seed,
            "control": str(control),
        }
        for node in nodes:
            state = demo_dir / "agents" / node
            (state / "checkpoints").mkdir(parents=True)
            udp = free_port()
            (state / "agent.toml").write_text(f"reporter_udp_port = {udp}\n")
            commands[f"agent:{node}"] = _agent_command(server, tokens[node], node, state, args.gpus)
            plan["nodes"][node] = {"state": str(state), "udp": udp}
        (demo_dir / "plan.json").write_text(json.dumps(plan, indent=1))
        commands["workload"] = [
            sys.executable, "-m", "faultline.demo", "simulate", str(demo_dir / "plan.json"),
        ]  # fmt: skip
        cli.write_runtime(data_dir, args)
        env = dict(os.environ)
        env[CONTROL_ENV] = str(control)
        sup = cli.Supervisor(commands, env)

        def on_signal(signum: int, frame: object) -> None:
            sup.stopping = True

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        print(f"faultline: demo ready in {time.monotonic() - started:.1f}s")
        print(
            f"faultline: {args.nodes} nodes x {args.gpus} fake GPUs, groups train-a, train-b, "
            f"serve; fault schedule '{args.schedule}'"
        )
        if login:
            print(f"faultline: login (shown once): {login}")
        else:
            print("faultline: log in with your existing admin account")
        print(f"faultline: console at {server}/  (websockets on port {args.ws_port}); Ctrl-C stops")
        sys.stdout.flush()
        code = sup.run()
        sup.stop()
        return code
    finally:
        cli._runtime_file(data_dir).unlink(missing_ok=True)
        emb.stop(force=True)


# -- the workload simulator (the `python -m faultline.demo simulate` child) ----------------


@dataclass
class Slot:
    node: str
    gpu: int


@dataclass
class Fault:
    kind: str
    rank: int | None = None
    node: str | None = None
    worker: str | None = None
    started: float = 0.0
    until: float = 0.0


class OutOfMemoryError(RuntimeError):
    """Stands in for torch.OutOfMemoryError (the reporter judges by type name)."""


OutOfMemoryError.__module__ = "torch"


class Fleet:
    """Where the simulated nodes' agents listen, and how to script their fake GPUs."""

    def __init__(self, plan: dict[str, Any]) -> None:
        self.nodes: dict[str, dict[str, Any]] = plan["nodes"]
        self.control = Path(plan["control"])
        self.spares: list[str] = []

    def reporter(self, node: str, **kwargs: Any) -> Reporter:
        info = self.nodes[node]
        return Reporter(
            socket_path=str(Path(info["state"]) / "reporter.sock"),
            udp=("127.0.0.1", int(info["udp"])),
            **kwargs,
        )

    def script(self, node: str, gpu: int, name: str) -> None:
        with open(self.control / node, "a") as fh:
            fh.write(f"{gpu}:{name}\n")

    def checkpoint_root(self, node: str) -> Path:
        return Path(self.nodes[node]["state"]) / "checkpoints"


def say(message: str) -> None:
    print(f"demo: {message}", flush=True)


class TrainGroup:
    """A synchronous data-parallel job: every rank steps together, checkpoints every N."""

    def __init__(self, name: str, slots: list[Slot], fleet: Fleet, rng: random.Random) -> None:
        self.name, self.slots, self.fleet, self.rng = name, slots, fleet, rng
        self.generation, self.restart_count = 1, 0
        self.step, self.valid_ckpt, self.coll_seq = 0, 0, 0
        self.tokens = 8192
        self.last_ckpt_at = self.last_step_at = 0.0
        self.corrupted = False
        self.fault: Fault | None = None
        self.zombie: Reporter | None = None
        self.windows: dict[int, list[dict[str, Any]]] = {}
        self.reporters: dict[int, Reporter] = {}
        self._start("initializing", reason="job_start")

    @property
    def world(self) -> int:
        return len(self.slots)

    def _start(self, from_state: str, *, reason: str) -> None:
        for rep in self.reporters.values():
            rep.close()
        self.reporters = {
            rank: self.fleet.reporter(
                slot.node,
                group=self.name,
                generation=self.generation,
                rank=rank,
                gpu=fake_uuid(slot.node, slot.gpu),
            )
            for rank, slot in enumerate(self.slots)
        }
        self.windows = {rank: [] for rank in self.reporters}
        for rep in self.reporters.values():
            rep.process("started")
            time.sleep(0.002)  # pace datagrams: a bare kernel queues 10 per socket
        self.reporters[0].transition(
            "running",
            from_state=from_state,
            reason=reason,
            restart_count=self.restart_count,
            world_size=self.world,
            topology={"dp": self.world, "tp": 1, "pp": 1, "ep": 1},
            data_cursor=self.step * self.tokens * self.world,
            model_version="v7",
        )

    def restart(self, reason: str, *, without: str | None = None) -> None:
        """Recover through a new generation from the newest valid checkpoint."""
        # Old checkpoints still being verified carry the old generation: let the agent
        # finish them first, or the console rightly calls them a stale generation writing.
        # Likewise the last steps, which other nodes' agents may ship a second later.
        settle = max(self.last_ckpt_at + 3.0, self.last_step_at + 2.5)
        time.sleep(max(0.0, settle - time.monotonic()))
        # Quiesce, then the scheduler requeues the job as a new generation. (Going through
        # `recovering` four times an hour is a retry storm, and the demo restarts often.)
        self.reporters[0].transition("quiescing", from_state="running", reason=reason)
        if without is not None:
            spare = self.fleet.spares.pop(0) if self.fleet.spares else None
            if spare is None:
                say(f"{self.name}: no spare node to replace {without}; restarting in place")
            else:
                self.slots = [Slot(spare, s.gpu) if s.node == without else s for s in self.slots]
                say(f"{self.name}: replaced {without} with spare {spare}")
        lost = self.step - self.valid_ckpt
        self.generation += 1
        self.restart_count += 1
        self.step = self.valid_ckpt
        self.fault, self.corrupted = None, False
        self._start("initializing", reason=reason)
        say(
            f"{self.name}: recovered as generation {self.generation} from step {self.step} "
            f"({lost} steps lost)"
        )

    def _collective(self, rank: int, *, state: str, numel: int = 4_194_304) -> None:
        window = self.windows[rank]
        entry = {
            "seq": self.coll_seq,
            "pg": "default",
            "op": "all_reduce",
            "numel": numel,
            "dtype": "bfloat16",
            "state": state,
            "started_ts": _iso(),
        }
        window.append(entry)
        del window[:-8]
        self.reporters[rank].collective(list(window))

    def tick(self, now: float) -> None:
        if self.zombie is not None:
            self.zombie.step(self.step, tokens=self.tokens, loss=2.0, duration_ms=1000.0)
        if self.fault is not None and self.fault.kind in ("xid79", "collective_mismatch", "oom"):
            return  # every rank waits in a collective that cannot complete
        self.step += 1
        self.coll_seq += 1
        base = {r: self.rng.uniform(560, 640) for r in self.reporters}
        if self.fault is not None and self.fault.kind == "thermal_straggler":
            base[self.fault.rank or 0] *= 1.8
        slowest = max(base.values())
        loss = 2.4 * math.exp(-self.step / 500) + 0.6
        for rank, rep in self.reporters.items():
            compute = base[rank]
            collective = 150.0 + (slowest - compute)  # synchronous: fast ranks wait
            duration = slowest + 150.0 + 70.0
            node = self.slots[rank].node
            if self.fault is not None and self.fault.kind == "slow_nic" and node == self.fault.node:
                collective += 1500.0
                duration += 1500.0
            value: float = loss + self.rng.uniform(-0.01, 0.01)
            if self.fault is not None and self.fault.kind == "nan_loss":
                value = float("nan")
            rep.step(
                self.step,
                tokens=self.tokens,
                data_cursor=self.step * self.tokens * self.world,
                duration_ms=round(duration, 1),
                phases={
                    "compute": round(compute, 1),
                    "collective": round(collective, 1),
                    "input": 20.0,
                    "optimizer": 50.0,
                },
                loss=value,
                grad_norm=1.0 + self.rng.uniform(0, 0.1),
                loss_scale=65536.0,
                overflow=False,
            )
            self._collective(rank, state="completed")
            time.sleep(0.002)
        self.last_step_at = time.monotonic()
        if self.step % CKPT_EVERY == 0:
            corrupt = self.fault is not None and self.fault.kind == "corrupt_checkpoint"
            self._write_checkpoint(corrupt=corrupt and not self.corrupted)
            self.corrupted = self.corrupted or corrupt

    def _write_checkpoint(self, *, corrupt: bool) -> None:
        """A manifest-layout checkpoint the node agent's watcher reports and verifies."""
        root = self.fleet.checkpoint_root(self.slots[0].node)
        ckpt_id = f"{self.name}-g{self.generation}-step{self.step:06d}"
        directory = root / ckpt_id
        directory.mkdir(parents=True, exist_ok=True)
        shards = []
        for index in range(2):
            body = self.rng.randbytes(4096)
            name = f"shard-{index}.bin"
            shards.append(
                {"path": name, "bytes": len(body), "sha256": hashlib.sha256(body).hexdigest()}
            )
            if corrupt and index == 1:
                body = bytes(len(body))  # a torn write: right size, wrong bytes
            (directory / name).write_bytes(body)
        meta = {"group": self.name, "generation": self.generation, "step": self.step}
        (directory / "faultline.json").write_text(json.dumps({**meta, "checkpoint_id": ckpt_id}))
        (directory / "manifest.json").write_text(json.dumps({"shards": shards}))
        (directory / "COMMITTED").write_text("")
        self.last_ckpt_at = time.monotonic()
        poisoned = self.fault is not None and self.fault.kind == "nan_loss"
        if not corrupt and not poisoned:  # NaN weights are no restore point
            self.valid_ckpt = self.step
        # Keep the demo's disk use flat: the four newest checkpoints per group.
        mine = sorted(p for p in root.iterdir() if p.name.startswith(f"{self.name}-"))
        for old in mine[:-4]:
            shutil.rmtree(old, ignore_errors=True)

    # -- faults ----------------------------------------------------------------------
    def inject(self, fault: Fault) -> str:
        self.fault = fault
        rank = fault.rank = self.rng.randrange(self.world)
        slot = self.slots[rank]
        where = f"rank {rank} ({slot.node} GPU {slot.gpu})"
        if fault.kind == "xid79":
            self.fleet.script(slot.node, slot.gpu, "xid79")
            self._stuck(missing=rank)
        elif fault.kind == "collective_mismatch":
            self._stuck(odd=rank)
        elif fault.kind == "oom":
            self.reporters[rank].process(
                "exited",
                exit_code=1,
                reason="oom",
                error=OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
            )
            self._stuck(missing=rank)
        elif fault.kind == "thermal_straggler":
            self.fleet.script(slot.node, slot.gpu, "thermal_throttle")
        elif fault.kind == "slow_nic":
            fault.node = slot.node
            where = f"the NIC of {slot.node}"
        elif fault.kind == "stale_generation":
            # The scheduler restarts the job, but one old rank never got the message.
            self.zombie = self.reporters.pop(rank)
            self.reporters[rank] = self.fleet.reporter(
                slot.node, group=self.name, generation=self.generation, rank=rank
            )  # stands in for the lost rank until the restart replaces every reporter
            self.restart("rescheduled")
            self.fault = fault
        return where

    def _stuck(self, *, missing: int | None = None, odd: int | None = None) -> None:
        self.coll_seq += 1
        for rank in self.reporters:
            if rank == missing:
                continue
            self._collective(rank, state="started", numel=1024 if rank == odd else 4_194_304)
            time.sleep(0.002)

    def recover(self) -> None:
        fault = self.fault
        if fault is None:
            return
        slot = self.slots[fault.rank or 0]
        if fault.kind == "stale_generation":
            if self.zombie is not None:
                self.zombie.close()
            self.zombie, self.fault = None, None
            say(f"{self.name}: the stale generation {self.generation - 1} rank stopped writing")
            return
        if fault.kind in ("xid79", "thermal_straggler"):
            self.fleet.script(slot.node, slot.gpu, "clear")
        without = slot.node if fault.kind == "xid79" else None
        self.restart(f"recover_{fault.kind}", without=without)


class ServingGroup:
    """Inference workers reporting windows; one restarts and claims ready too early."""

    def __init__(self, name: str, nodes: list[str], fleet: Fleet, rng: random.Random) -> None:
        self.name, self.rng = name, rng
        self.workers = {
            f"w{n}-{i}": fleet.reporter(node, group=name, generation=1)
            for n, node in enumerate(nodes)
            for i in range(WORKERS_PER_NODE)
        }
        self.fault: Fault | None = None
        self.next_at = 0.0

    def tick(self, now: float) -> None:
        if now < self.next_at:
            return
        self.next_at = now + SERVING_WINDOW_S
        for worker, rep in self.workers.items():
            requests = self.rng.randint(380, 420)
            broken = self.fault is not None and self.fault.worker == worker
            window = {
                "seconds": SERVING_WINDOW_S,
                "requests": requests,
                "slo_met": requests - self.rng.randint(0, 4),
                "ttft_ms_p50": 180.0,
                "ttft_ms_p99": 420.0,
                "tpot_ms_p50": 22.0,
                "tpot_ms_p99": 41.0,
                "e2e_ms_p99": 2900.0,
                "queued": 3,
                "active": 24,
                "kv_used_pct": 61.0,
            }
            if broken:
                # Readiness flipped before the weights and KV schema were loaded.
                rep.serving_window(worker, {**window, "slo_met": 0}, ready=True)
            else:
                rep.serving_window(worker, window, ready=True, model_version="v7", kv_schema="kv2")

    def inject(self, fault: Fault) -> str:
        fault.worker = self.rng.choice(sorted(self.workers))
        self.fault = fault
        self.next_at = 0.0
        return f"worker {fault.worker}"

    def recover(self) -> None:
        self.fault = None
        self.next_at = 0.0


def _iso() -> str:
    from agents.wire import iso_ts

    return iso_ts()


def layout(nodes: list[str], gpus: int) -> tuple[dict[str, list[Slot]], list[str], list[str]]:
    """Training slots per group, serving nodes, spare nodes (for node replacement)."""
    per_group = max(1, min(3, (len(nodes) - 1) // 3))
    rpn = min(RANKS_PER_NODE, gpus)
    train_a = nodes[:per_group]
    train_b = nodes[per_group : 2 * per_group]
    serve = nodes[2 * per_group : 2 * per_group + max(1, min(2, len(nodes) - 2 * per_group))]
    spares = nodes[2 * per_group + len(serve) :]
    slots = {
        "train-a": [Slot(n, g) for n in train_a for g in range(rpn)],
        "train-b": [Slot(n, g) for n in train_b for g in range(rpn)],
    }
    return slots, serve, spares


def simulate(plan_path: Path) -> int:
    plan = json.loads(plan_path.read_text())
    fleet = Fleet(plan)
    rng = random.Random(plan["seed"])  # noqa: S311 - picks which rank fails, not a secret
    nodes = sorted(fleet.nodes)
    slots, serve_nodes, fleet.spares = layout(nodes, int(plan["gpus"]))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(
        (Path(info["state"]) / "reporter.sock").exists() for info in fleet.nodes.values()
    ):
        time.sleep(0.2)  # the agents are starting; their sockets appear when they listen
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    signal.signal(signal.SIGINT, lambda *_: stop.update(now=True))
    groups: dict[str, Any] = {
        name: TrainGroup(name, group_slots, fleet, rng) for name, group_slots in slots.items()
    }
    groups["serve"] = ServingGroup("serve", serve_nodes, fleet, rng)
    first, every, hold = SCHEDULES[plan["schedule"]]
    began = time.monotonic()
    next_fault = began + first if every else math.inf
    index = 0
    say(f"fleet of {len(nodes)} nodes; spares: {', '.join(fleet.spares) or 'none'}")
    while not stop["now"]:
        now = time.monotonic()
        for group in groups.values():
            group.tick(now)
            fault = group.fault
            if fault is not None and fault.until and now >= fault.until:
                say(f"{group.name}: recovering from {fault.kind}")
                group.recover()
        if now >= next_fault:
            kind, name = MATRIX[index % len(MATRIX)]
            index += 1
            next_fault = now + every
            group = groups[name]
            if group.fault is None:
                fault = Fault(kind, started=now, until=now + hold)
                where = group.inject(fault)
                say(f"t+{now - began:.0f}s injected {kind} on {name} {where}")
        time.sleep(max(0.0, STEP_S - (time.monotonic() - now)))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m faultline.demo")
    sub = parser.add_subparsers(dest="command", required=True)
    sim = sub.add_parser("simulate", help="play the demo workload (started by faultline demo)")
    sim.add_argument("plan", type=Path)
    args = parser.parse_args(argv)
    return simulate(args.plan)


if __name__ == "__main__":
    sys.exit(main())
