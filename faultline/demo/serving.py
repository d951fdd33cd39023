"""A simulated inference group for the demo: workers reporting serving windows.

Owns the workers' windows and the one fault it plays (a worker that claims ready before its
weights are loaded). Reports only through the node agents; no diagnosis logic.
"""

from __future__ import annotations

import random

from faultline.demo.fleet import Fleet
from faultline.demo.scenario import SERVING_WINDOW_S, WORKERS_PER_NODE, Fault


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
