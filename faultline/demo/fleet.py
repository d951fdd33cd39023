"""The simulated fleet as the workload sees it: each node's agent sockets and fake GPUs.

Owns reaching a node's agent (a `Reporter` on its socket and UDP port), scripting its fake
GPUs through the fake NVML control files, where its checkpoints go, "repairing" a node
(fresh fake hardware, a new boot id, its agent restarted by the supervisor: a reboot as
the service sees it) and reading whether the demo's fake scheduler has it in service.
Must not decide what to break or when (faultline.demo.scenario).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agents.reporter import Reporter
from faultline.demo import fake_slurm


class Fleet:
    """Where the simulated nodes' agents listen, and how to script their fake GPUs."""

    def __init__(self, plan: dict[str, Any]) -> None:
        self.nodes: dict[str, dict[str, Any]] = plan["nodes"]
        self.control = Path(plan["control"])
        self.host_control = Path(plan["host_control"]) if plan.get("host_control") else None
        self.restart = Path(plan["restart"]) if plan.get("restart") else None
        self.scheduler = Path(plan["scheduler"]) if plan.get("scheduler") else None
        # worker -> {node, port}: the stand-in vLLM engines the serve nodes' agents scrape.
        self.engines: dict[str, dict[str, Any]] = plan.get("engines", {})
        self.spares: list[str] = []
        self.boots: dict[str, int] = {}

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

    def reboot(self, node: str) -> str:
        """Repair `node`: its fake GPUs and host start clean (their control files go, or
        the new agent would replay the fault), its agent.toml gets a new boot id, and the
        supervisor restarts its agent. Returns the new boot id."""
        if self.restart is None:
            raise RuntimeError("this plan has no restart folder: the demo cannot reboot")
        for folder in (self.control, self.host_control):
            if folder is not None:
                (folder / node).unlink(missing_ok=True)
        self.boots[node] = self.boots.get(node, 0) + 1
        boot = f"{node}-boot-{self.boots[node]}"
        config = Path(self.nodes[node]["state"]) / "agent.toml"
        lines = [x for x in config.read_text().splitlines() if not x.startswith("boot_id")]
        # First: a key after a [[serving]] table would belong to that table.
        config.write_text("\n".join([f'boot_id = "{boot}"', *lines]) + "\n")
        (self.restart / f"agent:{node}").touch()
        return boot

    def in_service(self, node: str) -> bool:
        """Whether the demo's fake scheduler has `node` in service (not drained)."""
        if self.scheduler is None:
            return True
        state = fake_slurm.state(self.scheduler)["nodes"].get(node, {}).get("state", "IDLE")
        return "DRAIN" not in state


def say(message: str) -> None:
    print(f"demo: {message}", flush=True)


class OutOfMemoryError(RuntimeError):
    """Stands in for torch.OutOfMemoryError (the reporter judges by type name)."""


OutOfMemoryError.__module__ = "torch"
