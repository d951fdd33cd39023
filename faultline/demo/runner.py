"""`faultline demo`: the service plus a simulated fleet that fails, live, through the real path.

Owns the demo process: it brings the system up exactly like `faultline up`
(faultline.bootstrap, the same supervisor and children), then adds one REAL
`faultline-agent run --fake-gpus N` process per simulated node and one workload simulator
(`python -m faultline.demo simulate PLAN`, faultline.demo.simulator) as children. It must
not write to the database itself (only tokens, through ingest.auth, before the fleet
starts) and must not hold diagnosis logic: what the console shows comes from the real
pipeline.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import agents.fake_host
from agents.fake_nvml import CONTROL_ENV
from faultline import bootstrap
from faultline.demo import fake_slurm, narrator
from faultline.demo.scenario import SERVING_WINDOW_S, WORKERS_PER_NODE, layout
from faultline.embedded import free_port
from faultline.supervisor import Supervisor

BIN = Path(sys.executable).parent

# The demo's remediation policy (docs/drills.md): automation may drain a node after a
# hardware Xid inside the blast radius, and put it back once its repair validated;
# anything else (a restart, the on-call's quarantine) waits for two approvers, and a
# person's proposal stays on the approvals page for a day unless someone votes.
DEMO_POLICY = {
    "gates": {
        "auto_approve": {"drain_node": ["xid"], "uncordon_node": ["validated"]},
        "approvals_required": 2,
        "proposal_ttl_s": 86_400,
        "max_nodes_out_per_pool": "34%",  # one of the 3-node demo's nodes, 5 of 16
        "max_nodes_out_fleet": "34%",
        "max_per_target": 5,
    },
    "remediation": {"default": {"scheduler": "slurm", "take_out": "drain_node"}},
}
# A repaired node runs this long with no fault before it counts healthy (production: 600 s).
DEMO_VALIDATION_WINDOW_S = 10


def _agent_command(server: str, token: str, node: str, state: Path, gpus: int) -> list[str]:
    return [
        str(BIN / "faultline-agent"),
        "run",
        "--server",
        server,
        "--token",
        token,
        "--node",
        node,
        "--fake-gpus",
        str(gpus),
        "--state-dir",
        str(state),
        "--config",
        str(state / "agent.toml"),
        "--checkpoint-root",
        str(state / "checkpoints"),
        "--log-level",
        "WARNING",
    ]


def serving_engines(nodes: list[str], gpus: int) -> dict[str, dict[str, Any]]:
    """worker -> {node, port}: the serving group's workers are stand-in vLLM engines
    (faultline.demo.fake_engine) that the simulator runs on these ports."""
    _, serve_nodes, _ = layout(nodes, gpus)
    taken: set[int] = set()
    out: dict[str, dict[str, Any]] = {}
    for n, node in enumerate(serve_nodes):
        for i in range(WORKERS_PER_NODE):
            port = free_port(avoid=frozenset(taken))
            taken.add(port)
            out[f"w{n}-{i}"] = {"node": node, "port": port}
    return out


def agent_toml(node: str, udp: int, engines: dict[str, dict[str, Any]]) -> str:
    """A demo node's agent.toml: its reporter port, the fake Slurm backend, and a
    `[[serving]]` table per engine on the node (its agent scrapes them as it would vLLM)."""
    tables = "".join(
        f'\n[[serving]]\nurl = "http://127.0.0.1:{e["port"]}"\nengine = "vllm"\n'
        f'group = "serve"\nworker = "{worker}"\ninterval = {SERVING_WINDOW_S}\n'
        for worker, e in engines.items()
        if e["node"] == node
    )
    return (
        f'boot_id = "{node}-boot-0"\nreporter_udp_port = {udp}\nscheduler = "slurm"\n'
        f"action_poll_s = 2\n{tables}"
    )


def run(args: argparse.Namespace) -> int:
    """`faultline demo`: like `up`, plus agents and the workload simulator as children."""
    if args.nodes < 3:
        print(f"faultline: --nodes {args.nodes} is too small; the demo needs at least 3")
        return 2
    args.ws_port = args.ws_port or args.port + 1
    logs = Path(bootstrap.data_dir(args.data_dir)) / "logs"
    print(f"faultline: demo starting; the service's, agents' and workload's logs go to {logs}/")
    if not os.environ.get("FAULTLINE_REMEDIATION_POLICY"):
        # Read by the settings of this process and of every child the supervisor starts.
        policy = Path(bootstrap.data_dir(args.data_dir)) / "demo-remediation.json"
        policy.parent.mkdir(parents=True, exist_ok=True)
        policy.write_text(json.dumps(DEMO_POLICY, indent=1))
        os.environ["FAULTLINE_REMEDIATION_POLICY"] = str(policy)
    os.environ.setdefault("FAULTLINE_VALIDATION_WINDOW_S", str(DEMO_VALIDATION_WINDOW_S))
    try:
        with bootstrap.system_up(
            host=args.host, port=args.port, ws_port=args.ws_port, data_dir_arg=args.data_dir
        ) as system:
            return _play(args, system, logs)
    except bootstrap.BootstrapError as exc:
        print(f"faultline: {exc}")
        return 2


def _oncall_password() -> str:
    """The on-call operator the story proposes as (faultline.demo.narrator): created, or
    given a fresh password, before the service starts; the password lives in memory only."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from console.actions import create_user, set_password
    from console.choices import UserRole

    password = secrets.token_urlsafe(18)
    user = get_user_model().objects.filter(username=narrator.ONCALL).first()
    if user is None:
        create_user(
            actor="demo", username=narrator.ONCALL, role=UserRole.OPERATOR, password=password
        )
    else:
        set_password(actor="demo", user=user, password=password, now=timezone.now())
    return password


def _play(args: argparse.Namespace, system: bootstrap.System, logs: Path) -> int:
    from ingest.auth import issue_token

    nodes = [f"node-{i:03d}" for i in range(1, args.nodes + 1)]
    tokens = {node: issue_token(node_name=node) for node in nodes}
    demo_dir = system.data_dir / "demo"
    # Each run starts from a clean fleet: old spools would replay yesterday's demo.
    shutil.rmtree(demo_dir, ignore_errors=True)
    control = demo_dir / "fake-nvml"
    control.mkdir(parents=True)
    (demo_dir / "fake-host").mkdir()
    # A file named after a child here restarts it (the demo "reboots" a repaired node).
    restart = demo_dir / "restart"
    restart.mkdir()
    server = f"http://{bootstrap.public_host(args.host)}:{args.port}"
    commands = bootstrap.service_commands(
        host=args.host,
        port=args.port,
        ws_port=args.ws_port,
        workers=args.workers,
        worker_concurrency=args.worker_concurrency,
        directory=system.data_dir,
    )
    plan: dict[str, Any] = {
        "nodes": {},
        "gpus": args.gpus,
        "schedule": args.schedule,
        "seed": args.seed,
        "control": str(control),
        "host_control": str(demo_dir / "fake-host"),
        "restart": str(restart),
        "scheduler": str(demo_dir / "scheduler"),
    }
    plan["engines"] = serving_engines(nodes, args.gpus)
    for node in nodes:
        state = demo_dir / "agents" / node
        (state / "checkpoints").mkdir(parents=True)
        udp = free_port()
        (state / "agent.toml").write_text(agent_toml(node, udp, plan["engines"]))
        commands[f"agent:{node}"] = _agent_command(server, tokens[node], node, state, args.gpus)
        plan["nodes"][node] = {"state": str(state), "udp": udp}
    (demo_dir / "plan.json").write_text(json.dumps(plan, indent=1))
    commands["workload"] = [
        sys.executable,
        "-m",
        "faultline.demo",
        "simulate",
        str(demo_dir / "plan.json"),
    ]
    oncall = _oncall_password()
    system.hand_over()
    env = dict(os.environ)
    env[CONTROL_ENV] = str(control)
    env[agents.fake_host.CONTROL_ENV] = str(demo_dir / "fake-host")
    # The agents' Slurm backend drives the demo's fake scontrol (faultline.demo.fake_slurm).
    env.update(fake_slurm.install(demo_dir / "scheduler"))
    # The workload and the agents stop before the service they report to: no agent logs
    # "ingest unreachable" on the way out.
    fleet_children = ["workload", *(f"agent:{node}" for node in nodes)]
    sup = Supervisor(
        commands,
        env,
        restart_dir=restart,
        logs=logs,
        passthrough=frozenset({"workload"}),
        stop_first=fleet_children,
        stop_message="faultline: stopping the simulated fleet, then the service",
    )
    sup.handle_signals()
    print(f"faultline: demo ready in {time.monotonic() - system.started:.1f}s")
    print(
        f"faultline: {args.nodes} nodes x {args.gpus} fake GPUs, groups train-a, train-b, "
        f"serve; fault schedule '{args.schedule}'"
    )
    if system.admin is not None:
        bootstrap.announce_admin(system.admin, system.data_dir)
    else:
        print("faultline: log in with your existing admin account")
    print(f"faultline: console at {server}/  (websockets on port {args.ws_port}); Ctrl-C stops")
    print(
        f"faultline: from here on, one line per incident opened or resolved and per action "
        f"proposed, approved or executed; the agents' and service's output is in {logs}/"
    )
    story = narrator.Narrator(server, oncall, quiet=lambda: sup.stopping)
    story.start()
    try:
        code = sup.serve()
    finally:
        story.stop()
    print("faultline: demo stopped")
    return code
