"""The workload simulator (the `python -m faultline.demo simulate PLAN` child).

Owns the simulator's main loop: wait for the agents' sockets, play two training groups and
one serving group, inject the scenario's faults on schedule and recover them, and repair
(reboot) a node a hardware fault took out once it has been out for a while; the service
validates it and puts it back on its own. Must not write to the database or talk HTTP:
everything goes through the real agents.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import signal
import time
from pathlib import Path
from typing import Any

from faultline.demo.fleet import Fleet, say
from faultline.demo.scenario import (
    MATRIX,
    REPAIR_AFTER_S,
    SCHEDULES,
    SPARE,
    STEP_S,
    Fault,
    layout,
)
from faultline.demo.serving import ServingGroup
from faultline.demo.training import TrainGroup


def simulate(plan_path: Path) -> int:
    plan = json.loads(plan_path.read_text())
    fleet = Fleet(plan)
    rng = random.Random(plan["seed"])  # noqa: S311 - picks which rank fails, not a secret
    nodes = sorted(fleet.nodes)
    slots, _, fleet.spares = layout(nodes, int(plan["gpus"]))
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
    serving = groups["serve"] = ServingGroup("serve", fleet, rng)
    first, every, hold = SCHEDULES[plan["schedule"]]
    began = time.monotonic()
    next_fault = began + first if every else math.inf
    index = 0
    repair_after = REPAIR_AFTER_S[plan["schedule"]]
    repairs: dict[str, float] = {}  # node -> when the demo reboots it
    returning: set[str] = set()  # rebooted, waiting for the service to put it back
    say(f"fleet of {len(nodes)} nodes; spares: {', '.join(fleet.spares) or 'none'}")
    while not stop["now"]:
        now = time.monotonic()
        for group in groups.values():
            group.tick(now)
            fault = group.fault
            if fault is not None and fault.until and now >= fault.until:
                say(f"{group.name}: recovering from {fault.kind}")
                group.recover()
                if fault.kind == "xid79" and fault.node and fleet.restart is not None:
                    repairs[fault.node] = now + repair_after
                    say(f"{fault.node} stays out of service; repairing it in {repair_after:.0f}s")
        for node, at in list(repairs.items()):
            if now >= at:
                del repairs[node]
                out = not fleet.in_service(node)
                boot = fleet.reboot(node)
                if out:
                    returning.add(node)
                say(f"{node} repaired: rebooted (boot id {boot}); validating")
        for node in sorted(returning):
            if fleet.in_service(node):
                returning.discard(node)
                busy = {s.node for g in groups.values() for s in getattr(g, "slots", [])}
                if node not in busy and node not in fleet.spares:
                    fleet.spares.append(node)
                say(f"{node} back in service on the scheduler (validated, uncordoned)")
        if now >= next_fault:
            kind, name = MATRIX[index % len(MATRIX)]
            index += 1
            next_fault = now + every
            group = groups.get(name)
            if name == SPARE and fleet.spares and fleet.restart is not None:
                # A spare's GPU fails with no job on it: kept from the groups while broken,
                # repaired after the hold like a group's node, a spare again once back.
                node = fleet.spares.pop(0)
                fleet.script(node, 0, kind)
                repairs[node] = now + hold + repair_after
                say(f"t+{now - began:.0f}s injected {kind} on spare {node} (no job on it)")
            elif group is not None and group.fault is None:
                fault = Fault(kind, started=now, until=now + hold)
                where = group.inject(fault)
                say(f"t+{now - began:.0f}s injected {kind} on {name} {where}")
        time.sleep(max(0.0, STEP_S - (time.monotonic() - now)))
    serving.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m faultline.demo")
    sub = parser.add_subparsers(dest="command", required=True)
    sim = sub.add_parser("simulate", help="play the demo workload (started by faultline demo)")
    sim.add_argument("plan", type=Path)
    args = parser.parse_args(argv)
    return simulate(args.plan)
