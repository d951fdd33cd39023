"""A scriptable fake host: a fake HCA, fake procfs and a fake kernel log, for demos and tests.

Owns a small sysfs/procfs tree in a directory of its own (two InfiniBand ports
`mlx5_0/1`, `mlx5_1/1`, one Ethernet interface, PSI, meminfo) that the real readers
(agents/host.py) read, and kernel messages in the exact formats the kernel and the NVIDIA
driver print, fed through the real parser (agents/kmsg.py). It must never pretend to be
real hardware in production: the agent uses it only with `--fake-gpus N`.

Runtime control, like agents/fake_nvml.py: when `FAULTLINE_FAKE_HOST_CONTROL_DIR` is set,
the fake host of node N applies lines appended to `<dir>/<N>` once per round, each a
script (`link_flap`, `link_down`, `link_up`, `rate_drop`, `symbol_errors`, `oom:<pid>`,
`xid:<gpu index>:<code>`, `mce`, `aer`, `hung:<pid>`, `disk_full`, `clear`), with an
optional port (`link_flap@mlx5_1/1`). Bad lines are skipped.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from agents import kmsg
from agents.fake_nvml import fake_pci
from agents.host import IB_COUNTERS, IB_DATA_COUNTERS, HostMonitor, HostPaths

log = logging.getLogger("faultline.agent.fake_host")
CONTROL_ENV = "FAULTLINE_FAKE_HOST_CONTROL_DIR"
SCRIPTS = (
    "link_flap",
    "link_down",
    "link_up",
    "rate_drop",
    "symbol_errors",
    "oom",
    "xid",
    "mce",
    "aer",
    "hung",
    "disk_full",
    "clear",
)
IB_PORTS = ("mlx5_0/1", "mlx5_1/1")
ETH_PORTS = ("eth0",)
FULL_RATE = "400 Gb/sec (4X NDR)"
# What the fake fabric carries each way per IB port while the host runs: the collective
# traffic of a busy training node (about a third of a 400 Gb/s link), so demos show a
# throughput. It moves with wall time, whatever the agent's round interval.
TRAFFIC_BYTES_PER_S = 18e9


class FakeHost:
    """A fake host tree plus a fake kernel log; `script(name, arg)` changes it now."""

    def __init__(
        self,
        node: str,
        *,
        root: str | os.PathLike[str] | None = None,
        control: str | os.PathLike[str] | None = None,
        disk_total: int = 8 * 1024**4,
    ) -> None:
        self._owns_root = root is None
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="fl-host-"))
        control_dir = os.environ.get(CONTROL_ENV)
        if control is None and control_dir:
            control = os.path.join(control_dir, node)
        self._control = None if control is None else os.fspath(control)
        self._offset = 0
        self.disk_total = disk_total
        self.disk_free = disk_total // 2
        self._kernel_sink: kmsg.Sink | None = None
        self._pending: list[kmsg.KernelEvent] = []
        self._lock = threading.Lock()
        self._traffic_at = time.monotonic()
        self._build()

    def close(self) -> None:
        """Remove the tree when this fake made it."""
        if self._owns_root:
            shutil.rmtree(self.root, ignore_errors=True)

    # -- the tree ---------------------------------------------------------------------
    @property
    def sys_root(self) -> Path:
        return self.root / "sys"

    @property
    def proc_root(self) -> Path:
        return self.root / "proc"

    def _ib(self, port: str) -> Path:
        dev, num = port.split("/")
        return self.sys_root / "class" / "infiniband" / dev / "ports" / num

    def _build(self) -> None:
        for port in IB_PORTS:
            p = self._ib(port)
            (p / "counters").mkdir(parents=True, exist_ok=True)
            for name in (*IB_COUNTERS, *IB_DATA_COUNTERS):
                (p / "counters" / name).write_text("0\n")
            (p / "state").write_text("4: ACTIVE\n")
            (p / "rate").write_text(f"{FULL_RATE}\n")
        for iface in ETH_PORTS:
            n = self.sys_root / "class" / "net" / iface
            (n / "statistics").mkdir(parents=True, exist_ok=True)
            (n / "device").mkdir(exist_ok=True)
            for name in ("rx_errors", "tx_errors", "rx_dropped", "tx_dropped", "rx_crc_errors"):
                (n / "statistics" / name).write_text("0\n")
            (n / "carrier_changes").write_text("1\n")
            (n / "operstate").write_text("up\n")
            (n / "speed").write_text("100000\n")
        pressure = self.proc_root / "pressure"
        pressure.mkdir(parents=True, exist_ok=True)
        self._psi(0.0)
        # The checkpoint roots live on a fake NVMe disk (host_sample names it).
        (self.proc_root / "mounts").write_text(
            "/dev/nvme0n1p2 / ext4 rw,relatime 0 0\n/dev/nvme1n1 /ckpt xfs rw,noatime 0 0\n"
        )
        (self.proc_root / "meminfo").write_text(
            "MemTotal:       2113488896 kB\nMemFree:        1000000000 kB\n"
            "SwapTotal:       8388604 kB\nSwapFree:        8388604 kB\n"
        )

    def _psi(self, avg10: float) -> None:
        line = f"avg10={avg10:.2f} avg60=0.00 avg300=0.00 total=0"
        for res in ("memory", "io"):
            (self.proc_root / "pressure" / res).write_text(f"some {line}\nfull {line}\n")

    def _bump(self, port: str, counter: str, by: int) -> None:
        path = self._ib(port) / "counters" / counter
        path.write_text(f"{int(path.read_text()) + by}\n")

    def monitor(self, checkpoint_roots: list[Path] | None = None) -> HostMonitor:
        """A real HostMonitor over this tree; checkpoint disks report the scripted space.

        Every checkpoint root is mounted, in the fake's mount table, from `nvme1n1`."""
        roots = list(checkpoint_roots or [Path("/ckpt")])
        mounts = (self.proc_root / "mounts").read_text()
        for root in roots:
            mounts += f"/dev/nvme1n1 {os.path.realpath(root)} xfs rw,noatime 0 0\n"
        (self.proc_root / "mounts").write_text(mounts)
        return HostMonitor(
            HostPaths(self.sys_root, self.proc_root, roots),
            statvfs=lambda _root: (self.disk_free, self.disk_total),
        )

    # -- the kernel log -----------------------------------------------------------------
    def start_kernel_log(self, sink: kmsg.Sink) -> None:
        with self._lock:
            self._kernel_sink = sink
            queued, self._pending = self._pending, []
        for event in queued:
            sink(event)

    def kernel(self, message: str) -> None:
        """Print one kernel message (real format) into the fake log."""
        event = kmsg.parse_message(message, _now())
        if event is None:
            return
        with self._lock:
            sink = self._kernel_sink
            if sink is None:
                self._pending.append(event)
                return
        sink(event)

    # -- scripts ------------------------------------------------------------------------
    def script(self, name: str, arg: str = "", port: str = IB_PORTS[0]) -> None:
        if name == "link_flap":
            self._bump(port, "link_downed", 1)
            self._bump(port, "link_error_recovery", 3)
            self._bump(port, "symbol_error", 120)
        elif name == "link_down":
            (self._ib(port) / "state").write_text("1: DOWN\n")
        elif name == "link_up":
            (self._ib(port) / "state").write_text("4: ACTIVE\n")
        elif name == "rate_drop":
            (self._ib(port) / "rate").write_text("200 Gb/sec (2X NDR)\n")
        elif name == "symbol_errors":
            self._bump(port, "symbol_error", int(arg or 500))
            self._bump(port, "port_rcv_errors", 7)
        elif name == "oom":
            pid = int(arg or 4242)
            self.kernel(
                f"Out of memory: Killed process {pid} (python) total-vm:98765432kB, "
                "anon-rss:87654321kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:171234kB "
                "oom_score_adj:0"
            )
            self._psi(62.5)
        elif name == "xid":
            index, _, code = arg.partition(":")
            self.kernel(
                f"NVRM: Xid (PCI:{fake_pci(int(index or 0))}): {int(code or 79)}, pid=2817, "
                "name=python, GPU has fallen off the bus."
            )
        elif name == "mce":
            self.kernel("mce: [Hardware Error]: CPU 3: Machine Check: 0 Bank 5: be00000000800400")
        elif name == "aer":
            self.kernel(
                "pcieport 0000:80:01.0: AER: Uncorrected (Non-Fatal) error received: 0000:81:00.0"
            )
        elif name == "hung":
            self.kernel(f"INFO: task python:{int(arg or 4243)} blocked for more than 120 seconds.")
        elif name == "disk_full":
            self.disk_free = 0
        elif name == "clear":
            for p in IB_PORTS:
                (self._ib(p) / "state").write_text("4: ACTIVE\n")
                (self._ib(p) / "rate").write_text(f"{FULL_RATE}\n")
            self.disk_free = self.disk_total // 2
            self._psi(0.0)
        else:
            raise ValueError(f"unknown fake host script {name!r}; known: {', '.join(SCRIPTS)}")

    def apply(self, spec: str) -> None:
        """`link_flap@mlx5_1/1`, `oom:4242`, `xid:3:79` -> script(name, arg, port)."""
        head, _, port = spec.strip().partition("@")
        name, _, arg = head.partition(":")
        if port and port not in IB_PORTS:
            raise ValueError(f"port {port!r}: one of {list(IB_PORTS)}")
        self.script(name, arg, port or IB_PORTS[0])

    def _traffic(self) -> None:
        now = time.monotonic()
        words = int((now - self._traffic_at) * TRAFFIC_BYTES_PER_S / 4)  # 4-octet units
        self._traffic_at = now
        for port in IB_PORTS:
            for name in IB_DATA_COUNTERS:
                self._bump(port, name, words)

    def poll_control(self) -> int:
        """Move the fake traffic on, then apply lines appended to the control file since
        the last poll; returns how many."""
        self._traffic()
        if self._control is None:
            return 0
        try:
            with open(self._control, "rb") as fh:
                fh.seek(self._offset)
                data = fh.read()
        except OSError:
            return 0
        complete = data[: data.rfind(b"\n") + 1]
        self._offset += len(complete)
        applied = 0
        for line in complete.decode(errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                self.apply(line)
                applied += 1
            except (ValueError, OSError) as exc:
                log.warning("fake host control %s: skipping %r (%s)", self._control, line, exc)
        return applied


def _now() -> datetime:
    return datetime.fromtimestamp(time.time(), UTC)
