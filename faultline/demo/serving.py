"""A simulated inference group for the demo: stand-in vLLM engines the node agents scrape.

Owns the workers' traffic and the one fault it plays (an engine that restarts and answers
/health before its KV cache exists). Each worker is a faultline.demo.fake_engine.FakeVllm on
the port the plan gave it; its node's agent reads it through `[[serving]]` as it would read
a real vLLM, so the windows the console shows come from the agent's scrape. No diagnosis
logic here.
"""

from __future__ import annotations

import random

from faultline.demo.fake_engine import FakeVllm
from faultline.demo.fleet import Fleet
from faultline.demo.scenario import STEP_S, Fault

MODEL = "demo-llm-v7"
REQUESTS_PER_S = (76, 84)  # per worker
TOKENS = 32  # output tokens per request


class ServingGroup:
    """Stand-in vLLM engines serving steady traffic; one restarts and claims ready too early."""

    def __init__(self, name: str, fleet: Fleet, rng: random.Random) -> None:
        self.name, self.rng = name, rng
        self.workers = {
            worker: FakeVllm(MODEL, port=int(info["port"])).start()
            for worker, info in sorted(fleet.engines.items())
        }
        self.fault: Fault | None = None
        self.next_at = 0.0

    def tick(self, now: float) -> None:
        if now < self.next_at:
            return
        self.next_at = now + STEP_S
        for engine in self.workers.values():
            for _ in range(self.rng.randint(*REQUESTS_PER_S)):
                engine.serve(
                    ttft=self.rng.lognormvariate(-1.8, 0.35),  # ~165 ms, p99 ~375 ms
                    tpot=self.rng.uniform(0.018, 0.03),
                    tokens=TOKENS,
                    queue=self.rng.uniform(0.0, 0.05),
                    cached=self.rng.choice((0, 64, 128)),
                    prompt=256,
                )
            engine.load(
                running=self.rng.randint(20, 28),
                waiting=self.rng.randint(0, 5),
                kv_used=self.rng.uniform(0.55, 0.68),
            )

    def inject(self, fault: Fault) -> str:
        fault.worker = self.rng.choice(sorted(self.workers))
        self.fault = fault
        # The engine restarts and answers /health before its KV cache is allocated: its
        # agent reports it ready without a KV schema (ready_before_loaded).
        self.workers[fault.worker].restart(kv_cache=False)
        return f"worker {fault.worker}"

    def recover(self) -> None:
        if self.fault is not None and self.fault.worker in self.workers:
            self.workers[self.fault.worker].allocate_kv_cache()
        self.fault = None

    def close(self) -> None:
        for engine in self.workers.values():
            engine.close()
