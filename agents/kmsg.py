"""The kernel log as evidence: parse NVRM Xid/SXid, fallen-off-the-bus, PCIe AER, OOM-killer,
MCE, hung-task and block I/O error lines, and read them from `/dev/kmsg` or the journal.

Owns the line patterns (the formats the kernel and the NVIDIA driver print, captured under
tests/agents/fixtures/kmsg/) and `KernelLog`, the reader thread. Each match becomes a
`KernelEvent` with short codes only: the message text never leaves the node. Standard
library only; it must not decide findings (console/diagnosis does) and never sends an Xid
itself: the agent folds kernel and NVML sightings of one Xid into one event
(agents/xid.py `XidDeduper`).

`/dev/kmsg` needs CAP_SYSLOG (or root) when `kernel.dmesg_restrict=1`; without it the
reader falls back to `journalctl -k -o json -f`, and without that it says so once and stops.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import select
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

log = logging.getLogger("faultline.agent.kmsg")

# Event codes (host_event.event, device_event for Xid); short and stable: wire vocabulary.
XID = "xid"
GPU_OFF_BUS = "gpu_off_bus"
SXID = "sxid"
AER_CORRECTED = "aer_corrected"
AER_NONFATAL = "aer_nonfatal"
AER_FATAL = "aer_fatal"
OOM_KILL = "oom_kill"
MCE = "mce"
HUNG_TASK = "hung_task"
IO_ERROR = "io_error"
HOST_EVENTS: tuple[str, ...] = (
    SXID,
    AER_CORRECTED,
    AER_NONFATAL,
    AER_FATAL,
    OOM_KILL,
    MCE,
    HUNG_TASK,
    IO_ERROR,
)


@dataclass(frozen=True, slots=True)
class KernelEvent:
    """One kernel-log line that matters, reduced to codes and bounded fields."""

    event: str
    ts: datetime
    device: str | None = None  # normalised PCI address (0000:3b:00) or block device (nvme0n1)
    code: int | None = None  # Xid / SXid number
    pid: int | None = None
    comm: str | None = None  # task name, at most 16 characters (TASK_COMM_LEN)
    severity: str | None = None  # fatal | nonfatal | corrected (SXid, AER)


def pci_key(address: str) -> str:
    """`PCI:0000:3b:00`, `00000000:3B:00.0`, `0000:3b:00.0` -> `0000:3b:00` (domain:bus:dev)."""
    addr = address.strip().removeprefix("PCI:").lower()
    parts = addr.split(":")
    if len(parts) < 3:
        return addr
    domain, bus, dev = parts[-3], parts[-2], parts[-1].split(".")[0]
    return f"{domain[-4:]:0>4}:{bus}:{dev}"


_PCI = r"(?:PCI:)?(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)"
_XID = re.compile(
    r"NVRM: Xid \(" + _PCI + r"\): (?P<code>\d+),(?: pid=(?P<pid>'?[^,]*?'?),)?"
    r"(?: name=(?P<comm>[^,]*),)?"
)
_OFF_BUS = re.compile(r"NVRM: GPU (?:at )?" + _PCI + r":? .*fallen off the bus")
_SXID = re.compile(
    r"SXid \(" + _PCI + r"\): (?P<code>\d+),\s*(?P<sev>Non-fatal|Fatal|Correctable)?",
    re.IGNORECASE,
)
_AER = re.compile(
    r"^(?:pcieport|nvidia|[\w-]+) " + _PCI + r": AER: (?:Multiple )?"
    r"(?P<kind>Corrected|Uncorrected \(Non-Fatal\)|Uncorrected \(Fatal\)) error received"
    r"(?:: (?P<src>[0-9a-fA-F:.]+))?"
)
_OOM = re.compile(
    r"(?:Memory cgroup )?[Oo]ut of memory(?: \(oom_kill_allocating_task\))?: "
    r"Kill(?:ed)? process (?P<pid>\d+) \((?P<comm>[^)]{1,64})\)"
)
_MCE = re.compile(r"^mce: \[Hardware Error\]: (?:CPU (?P<cpu>\d+): )?Machine [Cc]heck")
_MCE_LOGGED = re.compile(r"^mce: \[Hardware Error\]: Machine check events logged")
_HUNG = re.compile(r"INFO: task (?P<comm>.{1,64}?):(?P<pid>\d+) blocked for more than \d+ seconds")
_IO = re.compile(
    r"(?:blk_update_request: )?(?:critical )?(?:I/O|medium) error, dev (?P<dev>[\w-]+)"
)


def _pid(raw: str | None) -> int | None:
    raw = (raw or "").strip("'")
    return int(raw) if raw.isdigit() else None


def _comm(raw: str | None) -> str | None:
    raw = (raw or "").strip()
    return None if not raw or raw.startswith("<") else raw[:16]


def parse_message(message: str, ts: datetime) -> KernelEvent | None:
    """The event one kernel message reports, or None when it is not evidence."""
    msg = message.strip()
    if "NVRM" in msg:
        m = _XID.search(msg)
        if m:
            return KernelEvent(
                XID,
                ts,
                device=pci_key(m["pci"]),
                code=int(m["code"]),
                pid=_pid(m["pid"]),
                comm=_comm(m["comm"]),
            )
        m = _OFF_BUS.search(msg)
        if m:
            return KernelEvent(GPU_OFF_BUS, ts, device=pci_key(m["pci"]))
        return None
    if "SXid" in msg:
        m = _SXID.search(msg)
        if m:
            sev = (m["sev"] or "").lower().replace("-", "")
            return KernelEvent(
                SXID, ts, device=pci_key(m["pci"]), code=int(m["code"]), severity=sev or None
            )
    if "AER:" in msg:
        m = _AER.search(msg)
        if m:
            kind = m["kind"]
            event = (
                AER_CORRECTED
                if kind == "Corrected"
                else AER_FATAL
                if "(Fatal)" in kind
                else AER_NONFATAL
            )
            device = pci_key(m["src"]) if m["src"] else pci_key(m["pci"])
            return KernelEvent(event, ts, device=device, severity=event.removeprefix("aer_"))
        return None
    m = _OOM.search(msg)
    if m:
        return KernelEvent(OOM_KILL, ts, pid=int(m["pid"]), comm=_comm(m["comm"]))
    if msg.startswith("mce:"):
        if _MCE.search(msg) or _MCE_LOGGED.search(msg):
            return KernelEvent(MCE, ts)
        return None
    m = _HUNG.search(msg)
    if m:
        return KernelEvent(HUNG_TASK, ts, pid=int(m["pid"]), comm=_comm(m["comm"]))
    m = _IO.search(msg)
    if m:
        return KernelEvent(IO_ERROR, ts, device=m["dev"][:32])
    return None


# -- record formats ---------------------------------------------------------------------
def parse_kmsg_record(line: str, boot_epoch: float) -> tuple[str, datetime] | None:
    """A `/dev/kmsg` record `pri,seq,usec,flags[,...];message` -> (message, wall time).

    `usec` is microseconds since boot (CLOCK_MONOTONIC); continuation lines (a leading
    space, `KEY=value` dictionary entries) carry no message and are skipped.
    """
    if not line or line[0] == " ":
        return None
    head, sep, message = line.partition(";")
    if not sep:
        return None
    fields = head.split(",")
    if len(fields) < 4 or not fields[2].isdigit():
        return None
    ts = datetime.fromtimestamp(boot_epoch + int(fields[2]) / 1e6, UTC)
    return message.rstrip("\n"), ts


def parse_journal_record(line: str) -> tuple[str, datetime] | None:
    """One `journalctl -k -o json` line -> (message, wall time)."""
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    message = obj.get("MESSAGE")
    if isinstance(message, list):  # journald sends non-UTF-8 messages as byte arrays
        message = bytes(b for b in message if isinstance(b, int) and 0 <= b < 256).decode(
            errors="replace"
        )
    usec = obj.get("__REALTIME_TIMESTAMP")
    if not isinstance(message, str) or not str(usec or "").isdigit():
        return None
    return message, datetime.fromtimestamp(int(usec) / 1e6, UTC)


def parse_lines(lines: Iterable[str], *, fmt: str, boot_epoch: float = 0.0) -> list[KernelEvent]:
    """Events of captured lines: fmt `kmsg`, `journal` or `dmesg` (plain messages)."""
    out: list[KernelEvent] = []
    for line in lines:
        if fmt == "kmsg":
            parsed = parse_kmsg_record(line, boot_epoch)
        elif fmt == "journal":
            parsed = parse_journal_record(line)
        else:
            parsed = (line, datetime.fromtimestamp(boot_epoch, UTC))
        if parsed is not None:
            event = parse_message(*parsed)
            if event is not None:
                out.append(event)
    return out


def boot_epoch(proc_root: str = "/proc") -> float:
    """Wall time of boot: now minus /proc/uptime (kmsg stamps are since boot)."""
    try:
        with open(os.path.join(proc_root, "uptime")) as fh:
            return time.time() - float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return time.time() - time.monotonic()


Sink = Callable[[KernelEvent], None]


class KernelLog:
    """Follows the kernel log on a thread and hands each event to `sink`.

    Starts at the end of the ring buffer (old lines were evidence of earlier runs). Tries
    `/dev/kmsg`, then `journalctl -k -o json -f -n 0`; with neither it logs once and stops.
    """

    def __init__(self, sink: Sink, *, path: str = "/dev/kmsg", journalctl: str | None = None):
        self.sink = sink
        self.path = path
        self.journalctl = journalctl if journalctl is not None else shutil.which("journalctl")
        self.source: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="kmsg", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._proc is not None:
            self._proc.terminate()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def _emit(self, records: Iterator[tuple[str, datetime] | None]) -> None:
        for parsed in records:
            if self._stop.is_set():
                return
            if parsed is None:
                continue
            event = parse_message(*parsed)
            if event is not None:
                try:
                    self.sink(event)
                except Exception:
                    log.exception("kernel event sink failed")

    def _run(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            fd = -1
            why = f"{self.path}: {exc.strerror} (needs CAP_SYSLOG or root)"
        if fd >= 0:
            self.source = "kmsg"
            with contextlib.suppress(OSError):  # SEEK_END on /dev/kmsg: only new records
                os.lseek(fd, 0, os.SEEK_END)
            self._emit(self._kmsg(fd))
            os.close(fd)
            return
        if self.journalctl:
            self.source = "journal"
            self._proc = subprocess.Popen(
                [self.journalctl, "-k", "-o", "json", "-f", "-n", "0"],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            lines = self._proc.stdout or ()
            self._emit(parse_journal_record(line) for line in lines)
            return
        log.warning("kernel log unavailable (%s; no journalctl): no kernel evidence", why)

    def _kmsg(self, fd: int) -> Iterator[tuple[str, datetime] | None]:
        epoch = boot_epoch()
        while not self._stop.is_set():
            # Non-blocking with a short select: stop() never waits on a quiet kernel.
            ready, _, _ = select.select([fd], [], [], 0.5)
            if not ready:
                continue
            try:
                data = os.read(fd, 8192)  # one record per read
            except BlockingIOError:
                continue
            except BrokenPipeError:
                continue  # EPIPE: records were overwritten before we read them
            except OSError:
                return
            if not data:
                return
            yield parse_kmsg_record(data.decode(errors="replace"), epoch)
