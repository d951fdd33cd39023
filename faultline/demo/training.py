"""A simulated synchronous data-parallel training group for the demo.

Owns one group's ranks, steps, collectives and manifest-layout checkpoints, and how each
fault of the matrix shows up in them and how the group recovers (a new generation from the
newest valid checkpoint). Reports only through the node agents (`agents.reporter`); must
not hold diagnosis logic: what the console concludes comes from the real pipeline.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import shutil
import time
import zlib
from typing import Any

from agents import flops
from agents.fake_nvml import fake_uuid
from agents.reporter import Reporter
from agents.wire import step_id
from faultline.demo.fleet import Fleet, OutOfMemoryError, say
from faultline.demo.scenario import CKPT_EVERY, OBJECTIVES, Fault, Slot

# The simulated model: a 7B-class dense transformer (N weights doing a matmul per token, L
# layers of width d, sequences of T tokens), trained with full activation recomputation.
# Its steps carry the FLOPs agents.flops counts for it, so the console shows MFU and HFU
# against the fake GPUs' peak (agents/flops.py gives them the H100 SXM's).
MODEL_PARAMS, MODEL_LAYERS, MODEL_WIDTH, SEQ_LEN = 6_500_000_000, 32, 4096, 4096
FLOPS_PER_TOKEN = flops.model_flops_per_token(
    MODEL_PARAMS, layers=MODEL_LAYERS, hidden=MODEL_WIDTH, seq_len=SEQ_LEN
)


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
        self.hosts: set[str] = set()  # nodes that hosted ranks of the last generation
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
        # The new generation is announced from a node that already hosts the group's ranks:
        # the service refuses a transition from a node hosting none of them (a spare that
        # replaced rank 0's node has placed nothing yet), as it would a stranger's fence.
        announcer = next(
            (rank for rank, slot in enumerate(self.slots) if slot.node in self.hosts), 0
        )
        self.hosts = {slot.node for slot in self.slots}
        self.reporters[announcer].transition(
            "running",
            from_state=from_state,
            reason=reason,
            restart_count=self.restart_count,
            world_size=self.world,
            topology={"dp": self.world, "tp": 1, "pp": 1, "ep": 1},
            data_cursor=self.step * self.tokens * self.world,
            model_version="v7",
            job=str(10_000 + zlib.crc32(self.name.encode()) % 90_000),  # restart_group's job
            objectives=OBJECTIVES.get(self.name),
            # The new generation's nodes: a spare that replaced a node may take its ranks.
            nodes=sorted(self.hosts),
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

    def _collective(self, rank: int, *, state: str, step: int, numel: int = 4_194_304) -> None:
        """One all_reduce of `step` (tagged with its step_id, as agents.torch tags them)."""
        window = self.windows[rank]
        entry = {
            "seq": self.coll_seq,
            "pg": "default",
            "op": "all_reduce",
            "numel": numel,
            "dtype": "bfloat16",
            "state": state,
            "started_ts": _iso(),
            "step_id": step_id(self.generation, step),
        }
        window.append(entry)
        del window[:-8]
        self.reporters[rank].collective(list(window))

    def tick(self, now: float) -> None:
        if self.zombie is not None:
            self.zombie.step(self.step, tokens=self.tokens, loss=2.0, duration_ms=1000.0)
        if self.fault is not None and self.fault.kind in ("xid79", "collective_mismatch", "oom"):
            # Every rank waits in a collective that cannot complete, and keeps reporting its
            # window (agents.torch's watchdog re-sends it while a call stays blocked): the
            # reporter drops a datagram when the agent's queue is full, and one lost window
            # hid where the peers wait (the incident's trace then showed the dead rank's last
            # step, not the one it missed).
            for rank, window in self.windows.items():
                if window and window[-1]["state"] == "started" and rank in self.reporters:
                    self.reporters[rank].collective(list(window))
            return
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
                model_flops=self.tokens * FLOPS_PER_TOKEN,
                hw_flops=flops.hardware_flops(self.tokens * FLOPS_PER_TOKEN, recompute=True),
                lr=3e-4,
            )
            self._collective(rank, state="completed", step=self.step)
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
        meta = {
            "group": self.name,
            "generation": self.generation,
            "step": self.step,
            "data_cursor": self.step * self.tokens * self.world,  # where a restore resumes
        }
        (directory / "faultline.json").write_text(json.dumps({**meta, "checkpoint_id": ckpt_id}))
        manifest = {"shards": shards}
        (directory / "manifest.json").write_text(json.dumps(manifest))
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
            fault.node = slot.node  # the hardware the demo repairs later (simulator)
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
        """Every rank but `missing` enters the next step's all_reduce, which never ends."""
        self.coll_seq += 1
        for rank in self.reporters:
            if rank == missing:
                continue
            numel = 1024 if rank == odd else 4_194_304
            self._collective(rank, state="started", step=self.step + 1, numel=numel)
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


def _iso() -> str:
    from agents.wire import iso_ts

    return iso_ts()
