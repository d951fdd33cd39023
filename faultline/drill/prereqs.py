"""What a drill needs before it runs, checked up front and named when missing.

Owns the prerequisite checks of `faultline drill`: the Python packages every drill needs
(torch, numpy for torch.distributed.checkpoint, the gloo backend) and the host tools the
network drills need (`ip netns` with the right to create namespaces, `nft`, `tc`). A
missing package stops the session with one line per missing thing; a missing host tool
only skips the rows that need it, each saying why. Must not change the host: the netns
check creates and removes one namespace of its own (`fl-drill-check-<pid>`).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

# Rows of the matrix that need real network namespaces on this host.
NETWORK_TOOLS = ("ip netns", "nft", "tc")


@dataclass(frozen=True)
class Missing:
    """One missing prerequisite: what, why it is needed and how to get it."""

    what: str
    why: str
    fix: str

    def line(self) -> str:
        why = f" ({self.why})" if self.why else ""
        return f"faultline: drill needs {self.what}{why}; {self.fix}"


def _gloo() -> Missing | None:
    """gloo is compiled into most torch wheels but not all: ask torch itself, in a child
    (importing torch here would cost the session ~2 s and a few hundred MB for nothing)."""
    code = (
        "import sys, torch.distributed as d\n"
        "sys.exit(0 if d.is_available() and d.is_gloo_available() else 3)"
    )
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Missing(
            "torch.distributed with gloo", f"could not ask torch: {exc}", "reinstall torch"
        )
    if proc.returncode == 0:
        return None
    tail = proc.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
    return Missing(
        "torch.distributed with the gloo backend",
        "the drill's ranks talk over gloo" + (f"; torch said: {tail[0][:120]}" if tail[0] else ""),
        "install a torch build with distributed support (the CPU wheels from pytorch.org have it)",
    )


def python_missing() -> list[Missing]:
    """Packages without which no drill can run (empty when all are there)."""
    out: list[Missing] = []
    if importlib.util.find_spec("torch") is None:
        # The exact line users have seen since the first release (tests pin it).
        return [
            Missing(
                "PyTorch",
                "",
                "install it with pip install 'faultline[torch]'",
            )
        ]
    if importlib.util.find_spec("numpy") is None:
        out.append(
            Missing(
                "numpy",
                "torch.distributed.checkpoint imports it to save and load",
                "install it with pip install 'faultline[torch]' or pip install numpy",
            )
        )
    if not out:
        gloo = _gloo()
        if gloo is not None:
            out.append(gloo)
    return out


def _run(*cmd: str) -> subprocess.CompletedProcess[bytes] | None:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None


def network_missing() -> list[Missing]:
    """Host tools the network rows need; empty when they can run here."""
    out: list[Missing] = []
    if shutil.which("ip") is None:
        out.append(
            Missing(
                "ip (iproute2)", "the ranks run in network namespaces", "apt-get install iproute2"
            )
        )
    else:
        name = f"fl-drill-check-{os.getpid()}"
        made = _run("ip", "netns", "add", name)
        if made is None or made.returncode != 0:
            said = "" if made is None else made.stderr.decode(errors="replace").strip()[:120]
            out.append(
                Missing(
                    "the right to create network namespaces (ip netns add)",
                    f"the ranks run in namespaces of their own; ip said: {said or 'nothing'}",
                    "run the drill as root or with CAP_NET_ADMIN and CAP_SYS_ADMIN",
                )
            )
        else:
            _run("ip", "netns", "del", name)
    if shutil.which("tc") is None:
        out.append(
            Missing("tc (iproute2)", "a slow link is a tbf qdisc", "apt-get install iproute2")
        )
    if shutil.which("nft") is None:
        out.append(
            Missing(
                "nft", "packet loss is an nftables numgen random drop", "apt-get install nftables"
            )
        )
    return out
