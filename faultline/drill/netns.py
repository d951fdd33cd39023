"""The network drills' own little network: one namespace per node, a hub namespace with a
bridge, veth pairs between them, and the faults applied to real traffic.

Owns creating and always removing `fl-drill-<tag>-hub` and `fl-drill-<tag>-<i>` (nothing is
created in the host's own namespace: deleting the namespaces removes every veth, bridge,
qdisc and nftables table with them), and the faults: a slow link (`tc` tbf on both ends of
a node's veth), packet loss (an nftables `numgen random` drop in the node's namespace),
a partition (the node's link down) and its end. `netem` is not in this machine's kernel;
no delay is added. It also gives each node's agent (which runs in the host's namespace, where the
service is) a view of its node's network: the namespace's sysfs mounted under
`<view>/<i>/sys`, `<view>/<i>/net` linked to a sleeper's /proc/<pid>/net and `<view>/<i>/ns`
to its /proc/<pid>/ns/net, which the agent reads as its `[host] net_sys_root` / `net_dir`
/ `net_ns`; and a node's own /etc/hosts (/etc/netns/<namespace>/hosts). Must not touch
any namespace, address, mount, rule or file it did not create.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import shutil
import subprocess
from pathlib import Path


def _sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {proc.stderr.strip()[:200]}")
    return proc


class DrillNet:
    """`nodes` namespaces on one bridge, 10.213.<net>.<i+1>/24, interface `eth0` in each."""

    def __init__(self, tag: str, nodes: int) -> None:
        self.tag, self.nodes = tag, nodes
        self.hub = f"fl-drill-{tag}-hub"
        self.net = random.randint(1, 254)  # noqa: S311 - a subnet, not a secret
        self.made: list[str] = []
        self.mounts: list[Path] = []
        self.links: list[Path] = []
        self.sleepers: list[subprocess.Popen[bytes]] = []
        self.etc: list[Path] = []
        atexit.register(self.remove)  # even if the session dies between setup and finally

    def ns(self, node: int) -> str:
        return f"fl-drill-{self.tag}-{node}"

    def ip(self, node: int) -> str:
        return f"10.213.{self.net}.{node + 1}"

    def create(self) -> DrillNet:
        _sh("ip", "netns", "add", self.hub)
        self.made.append(self.hub)
        _sh("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
        _sh("ip", "-n", self.hub, "link", "set", "br0", "up")
        for i in range(self.nodes):
            ns = self.ns(i)
            _sh("ip", "netns", "add", ns)
            self.made.append(ns)
            _sh(
                "ip",
                "link",
                "add",
                f"h{i}",
                "netns",
                self.hub,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                ns,
            )
            _sh("ip", "-n", self.hub, "link", "set", f"h{i}", "master", "br0", "up")
            _sh("ip", "-n", ns, "addr", "add", f"{self.ip(i)}/24", "dev", "eth0")
            _sh("ip", "-n", ns, "link", "set", "eth0", "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
        return self

    def expose(self, view: Path) -> None:
        """Each node's network as its agent reads it: <view>/<i>/sys (the namespace's own
        sysfs: mounted from inside it, it lists the namespace's interfaces),
        <view>/<i>/net (its /proc/net: the TCP MIB and socket table) and <view>/<i>/ns
        (the namespace itself: the agent joins it for the kernel's per-socket counters)."""
        for i in range(self.nodes):
            base = view / str(i)
            (base / "sys").mkdir(parents=True, exist_ok=True)
            _sh(
                "nsenter",
                f"--net=/run/netns/{self.ns(i)}",
                "mount",
                "-t",
                "sysfs",
                "sysfs",
                str(base / "sys"),
            )
            self.mounts.append(base / "sys")
            sleeper = subprocess.Popen([*self.prefix(i), "sleep", "infinity"])
            self.sleepers.append(sleeper)
            for name, target in (("net", "net"), ("ns", "ns/net")):
                link = base / name
                with contextlib.suppress(FileNotFoundError):
                    link.unlink()
                os.symlink(f"/proc/{sleeper.pid}/{target}", link)
                self.links.append(link)

    def hosts(self, node: int, text: str) -> None:
        """The node's /etc/hosts for commands run with `prefix` (`ip netns exec` mounts
        /etc/netns/<namespace>/hosts over /etc/hosts for them)."""
        etc = Path("/etc/netns") / self.ns(node)
        etc.mkdir(parents=True, exist_ok=True)
        self.etc.append(etc)
        (etc / "hosts").write_text(text)

    def prefix(self, node: int) -> list[str]:
        """Run a command inside the node's namespace (ip netns exec execs it: same pid)."""
        return ["ip", "netns", "exec", self.ns(node)]

    # -- faults ------------------------------------------------------------------------
    def slow(self, node: int, rate_bps: int, limit_bytes: int) -> None:
        """The node's NIC slows down, both ways: tbf on its eth0 and on the hub's end.
        `limit_bytes` is the qdisc's queue: big enough for a step's bytes, so the link
        delays them (a slow link) rather than dropping them (a lossy one)."""
        tbf = ["root", "tbf", "rate", f"{rate_bps}bit", "burst", "2000", "limit", str(limit_bytes)]
        _sh("ip", "netns", "exec", self.ns(node), "tc", "qdisc", "add", "dev", "eth0", *tbf)
        _sh("ip", "netns", "exec", self.hub, "tc", "qdisc", "add", "dev", f"h{node}", *tbf)

    def lossy(self, node: int, percent: int = 20) -> None:
        """Drop `percent` % of the node's packets, both ways (nftables, its own table)."""
        ns = self.ns(node)
        script = (
            "table inet fl_drill {\n"
            f" chain out {{ type filter hook output priority 0; ip daddr 10.213.{self.net}.0/24"
            f" numgen random mod 100 < {percent} drop; }}\n"
            f" chain inp {{ type filter hook input priority 0; ip saddr 10.213.{self.net}.0/24"
            f" numgen random mod 100 < {percent} drop; }}\n"
            "}\n"
        )
        proc = subprocess.run(
            ["ip", "netns", "exec", ns, "nft", "-f", "-"],
            input=script,
            capture_output=True,
            text=True,
            timeout=20,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"nft in {ns}: {proc.stderr.strip()[:200]}")

    def partition(self, node: int) -> None:
        _sh("ip", "-n", self.ns(node), "link", "set", "eth0", "down")

    def heal(self, node: int) -> None:
        """The partitioned node's link comes back (its qdiscs and rules stayed)."""
        _sh("ip", "-n", self.ns(node), "link", "set", "eth0", "up")

    def counters(self, node: int) -> dict[str, int]:
        """The node's eth0 counters as the kernel keeps them (what an agent would read)."""
        out: dict[str, int] = {}
        for name in ("tx_bytes", "rx_bytes", "tx_dropped", "rx_dropped"):
            proc = _sh(
                "ip",
                "netns",
                "exec",
                self.ns(node),
                "cat",
                f"/sys/class/net/eth0/statistics/{name}",
                check=False,
            )
            with contextlib.suppress(ValueError):
                out[name] = int(proc.stdout.strip())
        return out

    def remove(self) -> None:
        """Delete every namespace this net made (their links, qdiscs and rules go too), after
        the views into them (a mounted sysfs would keep a namespace alive)."""
        while self.links:
            with contextlib.suppress(OSError):
                self.links.pop().unlink()
        while self.sleepers:
            sleeper = self.sleepers.pop()
            sleeper.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                sleeper.wait(5)
        while self.mounts:
            _sh("umount", "-l", str(self.mounts.pop()), check=False)
        while self.made:
            _sh("ip", "netns", "del", self.made.pop(), check=False)
        while self.etc:
            shutil.rmtree(self.etc.pop(), ignore_errors=True)
