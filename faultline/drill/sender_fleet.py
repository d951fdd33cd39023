"""Many agents' senders in one process: the lossy-link test's fleet, pushing to a real service.

Owns a fleet of N agents that share nothing but the process: each has its own node name,
token, state directory, agent id, spool and `agents.sender.Sender` (the agent's own class,
its own thread, its own kept-alive connection), and a producer that spools, every second, a
heartbeat and one device_sample whose `mem_used_bytes` is the agent's serial number (1, 2,
...) so the service's rows can be matched to what was produced. Sixty-four whole agent
processes (NVML fakes, collectors, listeners) would not fit two cores beside the service;
the sending path is the same code.

`run CONFIG OUT`: produce and send until CONFIG's stop file appears, then stop producing,
let every spool drain (or a deadline pass), and write OUT: per agent what it produced, the
most its spool held and its depth every MONITOR_S. `tokens DATA_DIR N PREFIX`, `stored
DATA_DIR PREFIX`: the service side (issue tokens; read back the rows, receipts, agent
counters and node delays), run under the service's environment. Must not touch anything
but its own state directories.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agents.sender import AgentInfo, AuthError, Sender
from agents.spool import Identity, Spool
from agents.wire import record

MONITOR_S = 0.5


@dataclass
class Tally:
    node: str
    agent_id: str
    produced: int = 0
    max_spool_bytes: int = 0
    max_spool_depth: int = 0
    dropped: int = 0
    sent_batches: int = 0
    dead_lettered: int = 0
    left_in_spool: int = 0
    error: str = ""
    depths: list[tuple[float, int]] = field(default_factory=list)  # (epoch s, records)


class FleetAgent:
    """One agent's spool, sender and tally."""

    def __init__(self, node: str, token: str, state: Path, cfg: dict[str, Any]) -> None:
        self.identity = Identity(state)
        self.spool = Spool(state, max_bytes=int(cfg["spool_max_bytes"]))
        info = AgentInfo(self.identity.agent_id, node, "lossy-fleet", f"boot-{node}")
        self.sender = Sender(
            self.spool,
            self.identity,
            info,
            server=cfg["server"],
            token=token,
            state_dir=state,
            interval=float(cfg["send_interval_s"]),
            backoff_base=float(cfg["backoff_base_s"]),
            backoff_cap=float(cfg["backoff_cap_s"]),
            timeout=float(cfg["timeout_s"]),
        )
        self.tally = Tally(node=node, agent_id=self.identity.agent_id)
        self.gpu = f"GPU-{node}"

    def produce(self) -> None:
        self.tally.produced += 1
        n = self.tally.produced
        self.spool.append(
            record("heartbeat", uptime_s=float(n), spool_depth=self.spool.depth, dropped=0)
        )
        self.spool.append(
            record(
                "device_sample",
                gpu=self.gpu,
                index=0,
                temp_c=40.0 + n % 20,
                power_w=300.0,
                util_pct=97.0,
                mem_used_bytes=n,
            )
        )

    def watch(self) -> None:
        t = self.tally
        depth = self.spool.depth
        t.max_spool_bytes = max(t.max_spool_bytes, self.spool.bytes)
        t.max_spool_depth = max(t.max_spool_depth, depth)
        t.depths.append((round(time.time(), 2), depth))

    def send(self, stop: threading.Event) -> None:
        try:
            self.sender.run(stop)
        except AuthError as exc:
            self.tally.error = str(exc)
        finally:
            self.sender.close()


def run(config: Path, out: Path) -> int:
    cfg = json.loads(config.read_text())
    logging.basicConfig(level=logging.ERROR)  # a retry per second per agent is not news
    root = Path(cfg["state_root"])
    fleet = [
        FleetAgent(node, token, root / node, cfg) for node, token in sorted(cfg["agents"].items())
    ]
    stop_sending = threading.Event()
    senders = [
        threading.Thread(target=a.send, args=(stop_sending,), name=a.tally.node, daemon=True)
        for a in fleet
    ]
    for thread in senders:
        thread.start()
    stop_file = Path(cfg["stop_file"])
    tick = time.monotonic()
    while not stop_file.exists():
        for agent in fleet:
            agent.produce()
        while time.monotonic() < tick + 1.0:
            for agent in fleet:
                agent.watch()
            time.sleep(MONITOR_S)
        tick += 1.0
    deadline = time.monotonic() + float(cfg["drain_s"])
    while time.monotonic() < deadline and any(a.spool.depth for a in fleet):
        for agent in fleet:
            agent.watch()
        time.sleep(MONITOR_S)
    stop_sending.set()
    for agent in fleet:
        agent.sender.stop()
    for thread in senders:
        thread.join(float(cfg["timeout_s"]) + 5)
    for agent in fleet:
        agent.tally.dropped = agent.spool.dropped
        agent.tally.sent_batches = agent.sender.sent_batches
        agent.tally.dead_lettered = agent.sender.quarantined
        agent.tally.left_in_spool = agent.spool.depth
        agent.spool.close()
    out.write_text(json.dumps([asdict(a.tally) for a in fleet]))
    return 0


# -- the service side (under the service's environment) ---------------------------------------
def tokens(data_dir: str, count: int, prefix: str) -> int:
    from faultline import bootstrap

    with bootstrap.django_ready(data_dir):
        from ingest.auth import issue_token

        issued = {
            f"{prefix}{i:03d}": issue_token(node_name=f"{prefix}{i:03d}") for i in range(count)
        }
    print(json.dumps(issued))
    return 0


# Device-sample rows per (node, serial), every receipt, the agents' counters, the nodes'
# delivery delays: of the fleet's nodes only (their names start with the prefix).
STORED_SQL = {
    "samples": """SELECT n.name, s.mem_used_bytes, count(*) FROM ingest_devicesample s
        JOIN console_node n ON n.id = s.node_id WHERE n.name LIKE %(like)s GROUP BY 1, 2""",
    "receipts": """SELECT a.agent_id, r.seq, extract(epoch FROM r.received_at)::float8,
        r.records FROM ingest_batchreceipt r JOIN ingest_agentstate a ON a.agent_id = r.agent_id
        JOIN console_node n ON n.id = a.node_id WHERE n.name LIKE %(like)s""",
    "agents": """SELECT a.agent_id, a.duplicates, a.batches, a.gaps FROM ingest_agentstate a
        JOIN console_node n ON n.id = a.node_id WHERE n.name LIKE %(like)s""",
    "nodes": """SELECT name, delivery_delay_s, delivery_delays FROM console_node
        WHERE name LIKE %(like)s""",
}


def stored(data_dir: str, prefix: str) -> int:
    from faultline import bootstrap

    like = prefix.replace("_", r"\_") + "%"
    result: dict[str, Any] = {}
    with bootstrap.django_ready(data_dir):
        from django.db import connection

        with connection.cursor() as cur:
            for name, sql in STORED_SQL.items():
                cur.execute(sql, {"like": like})
                result[name] = [list(row) for row in cur.fetchall()]
    print(json.dumps(result, default=str))
    return 0


def main(argv: list[str]) -> int:
    command, *rest = argv
    if command == "run":
        return run(Path(rest[0]), Path(rest[1]))
    if command == "tokens":
        return tokens(rest[0], int(rest[1]), rest[2])
    if command == "stored":
        return stored(rest[0], rest[1])
    print(f"unknown command {command!r}: run, tokens or stored", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
