"""The simulated fleet as the workload sees it: each node's agent sockets and fake GPUs.

Owns reaching a node's agent (a `Reporter` on its socket and UDP port), scripting its fake
GPUs through the fake NVML control files, and where its checkpoints go. Must not decide
what to break or when (faultline.demo.scenario).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agents.reporter import Reporter


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


class OutOfMemoryError(RuntimeError):
    """Stands in for torch.OutOfMemoryError (the reporter judges by type name)."""


OutOfMemoryError.__module__ = "torch"
