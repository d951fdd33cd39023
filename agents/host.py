"""Host, storage and network evidence: sysfs/procfs readers and the per-round monitor.

Owns reading InfiniBand/RoCE port counters (/sys/class/infiniband/<dev>/ports/<n>/),
Ethernet interface counters (/sys/class/net/<if>/statistics/), PSI (/proc/pressure/),
swap (/proc/meminfo), tasks in D state (/proc/<pid>/stat), free space of the checkpoint
filesystems (statvfs) and turning them into `net_sample`, `net_event` and `host_sample`
records (agents/protocol.py). Every reader takes a root path, so tests read fixture trees.
Standard library only; it must not decide findings nor send anything itself.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.sockdiag import SockDiag, TcpSocket
from agents.wire import Record, record

log = logging.getLogger("faultline.agent.host")

# The InfiniBand port counters that mean trouble when they move (IBTA PortCounters).
IB_ERROR_COUNTERS: tuple[str, ...] = (
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_xmit_discards",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "port_xmit_constraint_errors",
    "port_rcv_constraint_errors",
    "VL15_dropped",
)
IB_COUNTERS: tuple[str, ...] = (*IB_ERROR_COUNTERS, "port_xmit_wait")
# Data moved, for the port's throughput: IBTA PortXmitData/PortRcvData count 4-octet
# words (sysfs shows them so); they travel as bytes, named as Ethernet names them.
IB_DATA_COUNTERS: dict[str, str] = {"port_xmit_data": "tx_bytes", "port_rcv_data": "rx_bytes"}
ETH_DATA_COUNTERS: tuple[str, ...] = ("tx_bytes", "rx_bytes")
ETH_ERROR_COUNTERS: tuple[str, ...] = (
    "rx_errors",
    "tx_errors",
    "rx_dropped",
    "tx_dropped",
    "rx_crc_errors",
    "carrier_changes",
)
ETH_COUNTERS: tuple[str, ...] = (*ETH_ERROR_COUNTERS, *ETH_DATA_COUNTERS)
# Interfaces that are not the fabric: loopback, bridges, containers' veths.
_SKIP_IF = ("lo", "docker", "veth", "br-", "virbr", "cni", "flannel", "cali", "tunl")
# The TCP MIB of the node's network namespace (<proc>/net/snmp "Tcp:" lines): a lossy or
# shaped link shows as retransmitted segments there, not in any interface counter (drops
# in a qdisc or in netfilter never reach /sys/class/net/<if>/statistics).
TCP_COUNTERS: dict[str, str] = {
    "RetransSegs": "retrans_segs",
    "OutSegs": "out_segs",
    "InSegs": "in_segs",
    "InErrs": "in_errs",
}
TCP_PORT = "tcp"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _int(path: Path) -> int | None:
    raw = _read(path)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class PortReading:
    port: str  # mlx5_0/1 or eth0
    link: str  # ib | eth
    state: str | None
    rate_gbps: float | None
    counters: dict[str, int]  # absolute values as read
    error_counters: tuple[str, ...] = ()
    read_at: float = field(default_factory=time.monotonic)  # the deltas' span comes from it


def _ib_state(raw: str | None) -> str | None:
    # "4: ACTIVE" -> "ACTIVE"
    return None if raw is None else raw.split(":", 1)[-1].strip() or None


def _ib_rate(raw: str | None) -> float | None:
    # "400 Gb/sec (4X NDR)" / "100 Gb/sec (4X EDR)"
    try:
        return float(raw.split()[0]) if raw else None
    except (ValueError, IndexError):
        return None


def read_ib_ports(sys_root: str | Path = "/sys") -> list[PortReading] | None:
    """Every InfiniBand/RoCE port, or None when the host has no /sys/class/infiniband."""
    base = Path(sys_root) / "class" / "infiniband"
    if not base.is_dir():
        return None
    out = []
    for dev in sorted(base.iterdir()):
        ports = dev / "ports"
        if not ports.is_dir():
            continue
        for port in sorted(ports.iterdir(), key=lambda p: p.name):
            counters = {
                name: value
                for name in IB_COUNTERS
                if (value := _int(port / "counters" / name)) is not None
            }
            for name, as_bytes in IB_DATA_COUNTERS.items():
                if (words := _int(port / "counters" / name)) is not None:
                    counters[as_bytes] = 4 * words
            out.append(
                PortReading(
                    port=f"{dev.name}/{port.name}",
                    link="ib",
                    state=_ib_state(_read(port / "state")),
                    rate_gbps=_ib_rate(_read(port / "rate")),
                    counters=counters,
                    error_counters=IB_ERROR_COUNTERS,
                )
            )
    return out


def read_eth_ports(
    sys_root: str | Path = "/sys", interfaces: Iterable[str] = ()
) -> list[PortReading]:
    """Physical Ethernet interfaces (those with a `device` link), their counters; or,
    where `interfaces` names some, exactly those (a bond, a VLAN or a veth has no
    `device` link but may be the fabric)."""
    base = Path(sys_root) / "class" / "net"
    if not base.is_dir():
        return []
    named = frozenset(interfaces)
    out = []
    for iface in sorted(base.iterdir()):
        if named:
            if iface.name not in named:
                continue
        elif iface.name.startswith(_SKIP_IF) or not (iface / "device").exists():
            continue
        counters = {
            name: value
            for name in ETH_COUNTERS
            if (value := _int(iface / "statistics" / name)) is not None
        }
        carrier = _int(iface / "carrier_changes")
        if carrier is not None:
            counters["carrier_changes"] = carrier
        speed = _int(iface / "speed")  # Mb/s; -1 when the link is down
        out.append(
            PortReading(
                port=iface.name,
                link="eth",
                state=_read(iface / "operstate"),
                rate_gbps=speed / 1000 if speed is not None and speed > 0 else None,
                counters=counters,
                error_counters=ETH_ERROR_COUNTERS,
            )
        )
    return out


def read_tcp(net_dir: str | Path) -> PortReading | None:
    """The namespace's TCP segment counters (`<net_dir>/snmp`), as the pseudo-port `tcp`;
    None where the file is absent (a fake tree, a non-Linux host)."""
    raw = _read(Path(net_dir) / "snmp")
    rows = [line.split() for line in (raw or "").splitlines() if line.startswith("Tcp:")]
    if len(rows) < 2:
        return None
    counters: dict[str, int] = {}
    for name, value in zip(rows[0][1:], rows[1][1:], strict=False):
        if name in TCP_COUNTERS:
            with contextlib.suppress(ValueError):
                counters[TCP_COUNTERS[name]] = int(value)
    return PortReading(port=TCP_PORT, link="tcp", state=None, rate_gbps=None, counters=counters)


def _hex_ip(raw: str) -> str | None:
    """`0100007F` (little-endian IPv4 of /proc/net/tcp) -> `127.0.0.1`."""
    try:
        return ".".join(str(b) for b in reversed(bytes.fromhex(raw)))
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class TcpPeers:
    """Connected TCP sockets of a namespace now, by remote address: which peers this node
    cannot get its bytes to (unacknowledged data queued, or a retransmission timer
    running). The node-wide MIB says that something retransmits; this says towards whom."""

    local: dict[str, int]  # local address -> established sockets
    peers: dict[str, dict[str, int]]  # remote address -> sockets, backed_up, tx_queue_bytes...


def read_tcp_peers(net_dir: str | Path, limit: int | None = 16) -> TcpPeers | None:
    """Established IPv4 sockets of `<net_dir>/tcp` (loopback left out), grouped by peer;
    the `limit` most backed-up peers (None: all). None where the file is absent."""
    raw = _read(Path(net_dir) / "tcp")
    if raw is None:
        return None
    local: dict[str, int] = {}
    peers: dict[str, dict[str, int]] = {}
    for line in raw.splitlines()[1:]:
        f = line.split()
        if len(f) < 7 or f[3] != "01":  # 01 = ESTABLISHED
            continue
        here, there = _hex_ip(f[1].split(":")[0]), _hex_ip(f[2].split(":")[0])
        if here is None or there is None or here.startswith("127.") or there.startswith("127."):
            continue
        try:
            tx_queue = int(f[4].split(":")[0], 16)
            retrans = int(f[6], 16)
        except ValueError:
            continue
        local[here] = local.get(here, 0) + 1
        p = peers.setdefault(
            there, {"sockets": 0, "backed_up": 0, "tx_queue_bytes": 0, "retransmitting": 0}
        )
        p["sockets"] += 1
        p["tx_queue_bytes"] += tx_queue
        p["backed_up"] += 1 if tx_queue > 0 or retrans > 0 else 0
        p["retransmitting"] += 1 if retrans > 0 else 0
    top = sorted(peers.items(), key=lambda kv: (-kv[1]["backed_up"], -kv[1]["tx_queue_bytes"]))
    return TcpPeers(local=local, peers=dict(top if limit is None else top[:limit]))


def read_psi(proc_root: str | Path, resource: str) -> dict[str, float]:
    """`/proc/pressure/<resource>` -> {"some": avg10, "full": avg10} (kernel 4.20+)."""
    raw = _read(Path(proc_root) / "pressure" / resource)
    out: dict[str, float] = {}
    for line in (raw or "").splitlines():
        kind, *fields = line.split()
        for f in fields:
            key, _, value = f.partition("=")
            if key == "avg10":
                with contextlib.suppress(ValueError):
                    out[kind] = min(100.0, max(0.0, float(value)))
    return out


def read_swap(proc_root: str | Path) -> tuple[int, int] | None:
    """(used, total) bytes of swap from /proc/meminfo."""
    raw = _read(Path(proc_root) / "meminfo")
    if raw is None:
        return None
    kb: dict[str, int] = {}
    for line in raw.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            kb[key] = int(parts[0])
    if "SwapTotal" not in kb:
        return None
    total = kb["SwapTotal"] * 1024
    return total - kb.get("SwapFree", 0) * 1024, total


def count_d_state(proc_root: str | Path) -> int | None:
    """Tasks in uninterruptible sleep (state D in /proc/<pid>/stat)."""
    base = Path(proc_root)
    try:
        pids = [p for p in base.iterdir() if p.name.isdigit()]
    except OSError:
        return None
    count = 0
    for pid in pids:
        raw = _read(pid / "stat")
        if raw is None:
            continue
        # "1234 (comm with ) spaces) D 1 ...": the state follows the last ')'.
        tail = raw.rpartition(")")[2].split()
        if tail and tail[0] == "D":
            count += 1
    return count


def mount_device(path: str | Path, proc_root: str | Path = "/proc") -> str | None:
    """The block device (`nvme1n1`) or source of the filesystem `path` lives on."""
    raw = _read(Path(proc_root) / "self" / "mounts") or _read(Path(proc_root) / "mounts")
    target = os.path.realpath(path)
    best, source = "", None
    for line in (raw or "").splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        mnt = parts[1].replace("\\040", " ")
        if (target == mnt or target.startswith(mnt.rstrip("/") + "/")) and len(mnt) > len(best):
            best, source = mnt, parts[0]
    if source is None:
        return None
    return source.rsplit("/", 1)[-1][:64] or None


def disk_free(path: str | Path) -> tuple[int, int] | None:
    """(free, total) bytes of the filesystem under `path` (free for unprivileged users)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


# -- the monitor ---------------------------------------------------------------------------
@dataclass
class HostPaths:
    sys_root: Path = Path("/sys")
    proc_root: Path = Path("/proc")
    checkpoint_roots: list[Path] = field(default_factory=list)
    # The network view, where it is not the agent's own: the node's /sys/class/net and
    # /proc/net seen from another network namespace (a container's, a drill's).
    net_sys_root: Path | None = None
    net_dir: Path | None = None  # a `net` directory (/proc/<pid>/net); default <proc>/net
    interfaces: tuple[str, ...] = ()  # read exactly these interfaces (default: physical)
    # The namespace whose per-socket TCP counters to read (sock_diag): a namespace file
    # (/run/netns/NAME, /proc/<pid>/ns/net; joining it needs CAP_SYS_ADMIN). Unset: the
    # agent's own namespace when it reads its own /proc/net, else none.
    net_ns: Path | None = None

    def own_network(self) -> bool:
        """The network read is the agent's own namespace's (no other view configured)."""
        return self.net_dir is None and self.proc_root == Path("/proc")


PEERS_SENT = 16  # peers reported per round: the most lossy and backed-up first
_UNOPENED = object()  # HostMonitor: no sock_diag socket opened yet


def open_sock_diag(paths: HostPaths) -> SockDiag | None:
    """The network's per-socket TCP counters, where they can be read."""
    if paths.net_ns is None and not paths.own_network():
        return None
    return SockDiag.open(paths.net_ns)


class HostMonitor:
    """Reads the host once per round; returns this round's records.

    Counters travel as deltas since the previous read (the first read sets the baseline
    and sends none). A port going out of ACTIVE/up, or back, is a `link_down`/`link_up`
    event; a lower rate than the port had is `rate_drop`; a moved error counter is `errors`.
    A host without InfiniBand is said so once, in the log, and then read for Ethernet only.
    """

    def __init__(
        self,
        paths: HostPaths | None = None,
        *,
        statvfs: Callable[[str | Path], tuple[int, int] | None] = disk_free,
        io_errors: Callable[[str], int] | None = None,
        tcp_sockets: Callable[[], list[TcpSocket]] | None = None,
    ) -> None:
        self.paths = paths or HostPaths()
        # The kernel's per-socket counters (agents/sockdiag.py): `tcp_sockets` (tests), or
        # a SockDiag opened on first use for the namespace `_diag_for` names (reopened
        # when the namespace file comes to name another).
        self._injected = tcp_sockets
        self._diag: SockDiag | None = None
        self._diag_for: object = _UNOPENED
        self._sock_seen: dict[bytes, tuple[int, int | None]] | None = None  # cookie -> counts
        self._statvfs = statvfs
        self._io_errors = io_errors or (lambda device: 0)
        self._last: dict[str, PortReading] = {}
        self._peer_reads = 0  # socket-table reads since the last round (sample_peers)
        self._stuck_reads: dict[str, int] = {}  # peer -> reads that found it backed up
        self._retrans_reads: dict[str, int] = {}  # peer -> reads with a retransmit timer on
        self._said_no_ib = False
        self.has_ib: bool | None = None

    def ports(self) -> list[PortReading]:
        sys_root = self.paths.net_sys_root or self.paths.sys_root
        ib = read_ib_ports(sys_root)
        self.has_ib = ib is not None
        if ib is None and not self._said_no_ib:
            self._said_no_ib = True
            log.info(
                "no InfiniBand on this host (%s): reading Ethernet only",
                Path(sys_root) / "class" / "infiniband",
            )
        tcp = read_tcp(self.paths.net_dir or self.paths.proc_root / "net")
        eth = read_eth_ports(sys_root, self.paths.interfaces)
        return [*(ib or []), *eth, *([tcp] if tcp else [])]

    def net_records(self, readings: Iterable[PortReading] | None = None) -> list[Record]:
        out: list[Record] = []
        for now in self.ports() if readings is None else readings:
            prev = self._last.get(now.port)
            self._last[now.port] = now
            if prev is None:
                continue
            deltas = {
                k: v - prev.counters[k]
                for k, v in now.counters.items()
                if k in prev.counters and v >= prev.counters[k]
            }
            span = now.read_at - prev.read_at
            out.append(
                record(
                    "net_sample",
                    port=now.port,
                    link=now.link,
                    state=now.state,
                    rate_gbps=now.rate_gbps,
                    counters=deltas,
                    interval_s=round(span, 3) if span >= 0.001 else None,
                )
            )
            out += self._events(prev, now, deltas)
        return out

    @staticmethod
    def _up(r: PortReading) -> bool:
        return (r.state or "").upper() in ("ACTIVE", "UP")

    def _events(self, prev: PortReading, now: PortReading, deltas: dict[str, int]) -> list[Record]:
        base: dict[str, Any] = {
            "port": now.port,
            "link": now.link,
            "state": now.state,
            "rate_gbps": now.rate_gbps,
        }
        moved = {k: v for k, v in deltas.items() if v > 0 and k in now.error_counters}
        out = []
        flapped = moved.get("link_downed", 0) > 0 or moved.get("carrier_changes", 0) > 0
        if self._up(prev) and not self._up(now):
            out.append(record("net_event", event="link_down", counters=moved, **base))
        elif not self._up(prev) and self._up(now):
            out.append(record("net_event", event="link_up", counters=moved, **base))
        elif flapped:  # down and up again between two reads: the counter saw it
            out.append(record("net_event", event="link_down", counters=moved, **base))
        elif moved:
            out.append(record("net_event", event="errors", counters=moved, **base))
        if (
            prev.rate_gbps is not None
            and now.rate_gbps is not None
            and now.rate_gbps < prev.rate_gbps
            and self._up(now)
        ):
            out.append(
                record("net_event", event="rate_drop", prev_rate_gbps=prev.rate_gbps, **base)
            )
        return out

    def host_record(self) -> Record:
        proc = self.paths.proc_root
        mem, io = read_psi(proc, "memory"), read_psi(proc, "io")
        swap = read_swap(proc)
        disks: list[dict[str, Any]] = []
        for root in self.paths.checkpoint_roots[:16]:
            device = mount_device(root, proc)
            free = self._statvfs(root)
            disk: dict[str, Any] = {"root": str(root)[:512]}
            if device:
                disk["device"] = device
                disk["io_errors"] = self._io_errors(device)
            if free is not None:
                disk["free_bytes"], disk["total_bytes"] = free
            disks.append(disk)
        return record(
            "host_sample",
            mem_some_avg10=mem.get("some"),
            mem_full_avg10=mem.get("full"),
            io_full_avg10=io.get("full"),
            swap_used_bytes=None if swap is None else swap[0],
            swap_total_bytes=None if swap is None else swap[1],
            d_state=count_d_state(proc),
            disks=disks or None,
        )

    def sample_peers(self) -> None:
        """One read of the socket table between rounds (every agent tick): a socket caught
        with bytes in flight once is traffic; one backed up read after read is stuck."""
        view = read_tcp_peers(self.paths.net_dir or self.paths.proc_root / "net")
        if view is None:
            return
        self._peer_reads += 1
        for ip, counters in view.peers.items():
            if counters["backed_up"]:
                self._stuck_reads[ip] = self._stuck_reads.get(ip, 0) + 1
            if counters["retransmitting"]:
                self._retrans_reads[ip] = self._retrans_reads.get(ip, 0) + 1

    def _sock_dump(self) -> Callable[[], list[TcpSocket]] | None:
        """The dump of this round's namespace: a namespace file may come to name another
        namespace (a drill's next row, a restarted container), and a socket bound to the
        old one would read nothing new."""
        ns: object = None
        if self.paths.net_ns is not None:
            try:
                ns = os.stat(self.paths.net_ns).st_ino
            except OSError:
                return None
        if ns != self._diag_for:
            self._close_diag()
            self._diag_for, self._sock_seen = ns, None
            self._diag = open_sock_diag(self.paths)
        return self._diag.dump if self._diag else None

    def _close_diag(self) -> None:
        if self._diag is not None:
            self._diag.close()
            self._diag = None

    def socket_deltas(self) -> dict[str, dict[str, int]] | None:
        """Per peer, the segments its sockets retransmitted and the data segments they sent
        since the previous call (`retrans_segs`, `data_segs_out`), from the kernel's
        cumulative per-socket counters. The first call sets the baseline (every peer 0); a
        socket opened since counts from zero. None where the counters cannot be read."""
        dump = self._injected or self._sock_dump()
        if dump is None:
            return None
        try:
            sockets = dump()
        except OSError as e:
            log.warning("per-socket TCP counters unreadable (%s): reading /proc only", e)
            self._close_diag()  # not reopened until the namespace changes
            return None
        first, seen = self._sock_seen is None, self._sock_seen or {}
        now: dict[bytes, tuple[int, int | None]] = {}
        out: dict[str, dict[str, int]] = {}
        for s in sockets:
            if s.peer.startswith("127.") or s.local.startswith("127."):
                continue
            now[s.cookie] = (s.total_retrans, s.data_segs_out)
            retrans0, segs0 = (
                (s.total_retrans, s.data_segs_out) if first else seen.get(s.cookie, (0, 0))
            )
            p = out.setdefault(s.peer, {"retrans_segs": 0, "data_segs_out": 0})
            p["retrans_segs"] += max(0, s.total_retrans - retrans0)
            if s.data_segs_out is not None:
                p["data_segs_out"] += max(0, s.data_segs_out - (segs0 or 0))
        self._sock_seen = now
        return out

    def peer_records(self) -> list[Record]:
        """Now-values, not deltas: one `net_sample` per local address (`tcp-local@<ip>`)
        and per peer (`tcp@<ip>`: sockets, how many are backed up, queued bytes, and of
        this round's `reads` of the table the `stuck_reads` that found it backed up and the
        `retrans_reads` that found a retransmission timer running; where the kernel's
        per-socket counters can be read, also the round's `retrans_segs` and
        `data_segs_out` towards that peer), so the service can tell which link of which
        node the stuck or lost bytes share."""
        self.sample_peers()
        view = read_tcp_peers(self.paths.net_dir or self.paths.proc_root / "net", limit=None)
        reads, stuck, retrans = self._peer_reads, self._stuck_reads, self._retrans_reads
        self._peer_reads, self._stuck_reads, self._retrans_reads = 0, {}, {}
        lost = self.socket_deltas()
        if view is None:
            return []
        none_lost = {} if lost is None else {"retrans_segs": 0, "data_segs_out": 0}
        peers = {ip: {**c, **(lost or {}).get(ip, none_lost)} for ip, c in view.peers.items()}
        ranked = sorted(
            peers.items(),
            key=lambda kv: (
                -kv[1].get("retrans_segs", 0),
                -kv[1]["backed_up"],
                -kv[1]["tx_queue_bytes"],
            ),
        )[:PEERS_SENT]
        out = [
            record("net_sample", port=f"tcp-local@{ip}", link="tcp", counters={"sockets": n})
            for ip, n in sorted(view.local.items())[:4]
        ]
        out += [
            record(
                "net_sample",
                port=f"tcp@{ip}",
                link="tcp",
                counters={
                    **counters,
                    "reads": reads,
                    "stuck_reads": stuck.get(ip, 0),
                    "retrans_reads": retrans.get(ip, 0),
                },
            )
            for ip, counters in ranked
        ]
        return out

    def round(self) -> list[Record]:
        """This round's records: net samples and events, then one host sample."""
        return [*self.net_records(), *self.peer_records(), self.host_record()]
