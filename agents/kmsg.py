"""The kernel log as evidence: parse NVRM Xid/SXid, fallen-off-the-bus, PCIe AER, OOM-killer,
MCE, hung-task and block I/O error lines, and read them from `/dev/kmsg` or the journal.

Owns the record formats (which records are the kernel's own: facility 0 on /dev/kmsg,
`_TRANSPORT=kernel` in the journal), the line patterns (the formats the kernel and the
NVIDIA driver print, captured under tests/agents/fixtures/kmsg/ with their sources) and
`KernelLog`, the reader thread. Each match becomes a `KernelEvent` with short codes only:
the message text never leaves the node. Standard library only; it must not decide findings
(console/diagnosis does) and never sends an Xid itself: the agent folds kernel and NVML
sightings of one Xid into one event (agents/evidence.py, agents/xid.py `XidDeduper`).

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
from typing import IO

from agents import xid_decode

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
    # An Xid line's own fields read as the recovery action the GPU needs (the Xid 154 line;
    # NVIDIA's decode of an NVLink5 Xid), and that reading as bounded text built from
    # agents/xid_decode.py's vocabulary, never from the line.
    recovery_action: str | None = None
    detail: str | None = None


def pci_key(address: str) -> str:
    """`PCI:0000:3b:00`, `00000000:3B:00.0`, `0000:3b:00.0` -> `0000:3b:00` (domain:bus:dev)."""
    addr = address.strip().removeprefix("PCI:").lower()
    parts = addr.split(":")
    if len(parts) < 3:
        return addr
    domain, bus, dev = parts[-3], parts[-2], parts[-1].split(".")[0]
    return f"{domain[-4:]:0>4}:{bus}:{dev}"


# -- message formats ----------------------------------------------------------------------
# Every pattern is matched at the start of the record's first line (re.match), where the
# kernel or the driver puts its own prefix: a kernel message that echoes a user's string
# (a path in a filesystem error, a task name) carries that string later in the line, never
# first. Fields a user chooses (the task name of an Xid, an OOM kill or a hung task) are
# read as data and never decide the event, its code or its device. The formats and where
# each comes from: tests/agents/fixtures/kmsg/ (each file cites its sources).
def _addr(name: str) -> str:
    return rf"(?P<{name}>[0-9a-fA-F]{{4,8}}:[0-9a-fA-F]{{2}}:[0-9a-fA-F]{{2}}(?:\.[0-7])?)"


_TASK = r"(?P<comm>.{0,64})"  # the kernel's comm is 15 bytes; escaped or odd ones run longer
# "NVRM: Xid (PCI:0000:3b:00): 79, pid=2817, name=python, <message>" (kernel_rc.c); a MIG
# attribution inside the brackets (" GPU-I:05", " GPU-CI:01"); drivers before ~R450 print
# the address without "PCI:", some without pid and name.
_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?" + _addr("pci") + r"(?: GPU-I:\d{1,3})?(?: GPU-CI:\d{1,3})?\): "
    r"(?P<code>\d{1,5})(?P<tail>,.*)?$",
    re.DOTALL,
)
_XID_PROCESS = re.compile(
    r", pid=(?P<pid>'?<?[A-Za-z0-9]{0,16}>?'?)(?:, name=(?P<comm>[^,]{0,100}))?"
)
# "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus." (osinit.c, NV_DEV_PRINTF); older
# drivers "NVRM: GPU at PCI:0000:3b:00: ...".
_OFF_BUS = re.compile(
    r"NVRM: GPU (?:at )?(?:PCI:)?" + _addr("pci") + r":? (?:GPU )?has fallen off the bus"
)
# One record of three lines, printed when the driver finds the GPU unreachable at start
# (osapi.c: "NVRM: The NVIDIA GPU %04x:%02x:%02x.%x\nNVRM: (PCI ID: %04x:%04x) installed in
# this system has\nNVRM: fallen off the bus and is not responding to commands.\n"): no Xid.
_OFF_BUS_FIRST = re.compile(r"NVRM: The NVIDIA GPU " + _addr("pci") + r"\s*$")
_OFF_BUS_LAST = re.compile(r"NVRM: fallen off the bus and is not responding to commands")
# "nvidia-nvswitch2: SXid (PCI:0000:c8:00.0): 20034, Fatal, Link 30 ..." (common_nvswitch.h
# NVSWITCH_PRINT_SXID; error_nvswitch.h prints the severity first).
_SXID = re.compile(
    r"nvidia-[\w-]{1,32}: SXid \((?:PCI:)?" + _addr("pci") + r"\): (?P<code>\d{1,6}),\s*"
    r"(?P<sev>Non-fatal|Fatal|Correctable)?"
)
# PCIe AER as drivers/pci/pcie/aer.c has printed it (3.x to 6.16+): the severity words
# changed from "Corrected / Uncorrected" to "Correctable / Uncorrectable" (v6.8), the source
# from "id=00e5" to "0000:00:1c.5" (010caed4ccb6, 4.x), "error received:" to "error message
# received from" (v6.8), " (no details found" (sic: no closing bracket in v6.16) was added, and the
# "AER: " prefix moved into dev_fmt. The source line names the device that sent the error
# message; the "Bus Error" line names the device whose AER registers logged it.
_AER_SEV = (
    r"(?P<sev>Corrected|Correctable|Uncorrected \(Non-Fatal\)|Uncorrectable \(Non-Fatal\)"
    r"|Uncorrected \(Fatal\)|Uncorrectable \(Fatal\))"
)
_AER_SOURCE = re.compile(
    r"[\w.-]{1,32} "
    + _addr("port")
    + r": (?:AER: )?(?:Multiple )?"
    + _AER_SEV
    + r" error (?:message )?received(?::| from) (?:id=(?P<id>[0-9a-fA-F]{4})\b|"
    + _addr("src")
    + r")"
)
_AER_BUS = re.compile(
    r"[\w.-]{1,32} "
    + _addr("dev")
    + r": (?:AER: )?(?:PCIe|CXL) Bus Error: severity="
    + _AER_SEV
    + r", type="
)
# mm/oom_kill.c: "Out of memory: Killed process 4242 (python) total-vm:..." (5.1+, with the
# memory-cgroup and oom_kill_allocating_task forms), and before 5.1 a choice line
# "Out of memory: Kill process P (comm) score N or sacrifice child" followed by the kill,
# "Killed process C (comm) total-vm:..." (3.x-4.x) or "... vsz:..." (2.6): C was killed.
_OOM = re.compile(
    r"(?:(?:Memory cgroup )?[Oo]ut of memory(?: \(oom_kill_allocating_task\))?: )?"
    r"Killed process (?P<pid>\d{1,10}) \(" + _TASK + r"\)(?: total-vm:| vsz:|,|\s*$)"
)
_MCE = re.compile(r"mce: \[Hardware Error\]: (?:CPU (?P<cpu>\d+): )?Machine [Cc]heck")
_MCE_LOGGED = re.compile(r"mce: \[Hardware Error\]: Machine check events logged")
_HUNG = re.compile(
    r"INFO: task " + _TASK + r":(?P<pid>\d{1,10}) blocked for more than \d{1,10} seconds"
)
_IO = re.compile(
    r"(?:blk_update_request: |print_req_error: )?(?:critical )?(?:I/O|medium) error, "
    r"dev (?P<dev>[\w-]{1,32})"
)
_AER_SEVERITY = {"Corrected": "corrected", "Correctable": "corrected"}
# A kernel record's text is at most ~1 KiB (LOG_LINE_MAX); longer input is not a record.
MAX_MESSAGE = 8192


def _pid(raw: str | None) -> int | None:
    raw = (raw or "").strip("'")
    return int(raw) if raw.isascii() and raw.isdigit() else None


def _comm(raw: str | None) -> str | None:
    raw = (raw or "").strip()
    return None if not raw or raw.startswith("<") else raw[:16]


def _aer_source(m: re.Match[str]) -> str:
    """The source of an AER message: `id=00e5` is bus 0x00, devfn 0xe5 under the port's
    domain (3.x-4.x kernels); later ones print the address."""
    if m["src"]:
        return pci_key(m["src"])
    ident = int(m["id"], 16)
    domain = pci_key(m["port"]).split(":")[0]
    return f"{domain}:{ident >> 8:02x}:{(ident & 0xFF) >> 3:02x}"


def _aer_event(sev: str) -> str:
    if sev in _AER_SEVERITY:
        return AER_CORRECTED
    return AER_FATAL if sev.endswith("(Fatal)") else AER_NONFATAL


def _xid_event(m: re.Match[str], ts: datetime) -> KernelEvent:
    code = int(m["code"])
    tail = m["tail"] or ""
    pid = comm = None
    process = _XID_PROCESS.match(tail)
    if process is not None:
        pid, comm = _pid(process["pid"]), _comm(process["comm"])
    recovery = detail = None
    if code == 154:
        change = xid_decode.recovery_change(tail)
        if change is not None:
            recovery, detail = change.current, change.detail
    else:
        decode = xid_decode.nvlink5_decode(code, tail)
        if decode is not None:
            recovery, detail = decode.recovery_action, decode.detail
    return KernelEvent(
        XID,
        ts,
        device=pci_key(m["pci"]),
        code=code,
        pid=pid,
        comm=comm,
        recovery_action=recovery,
        detail=detail,
    )


def _nvrm(first: str, rest: str, ts: datetime) -> KernelEvent | None:
    m = _XID.match(first)
    if m:
        return _xid_event(m, ts)
    m = _OFF_BUS.match(first) or _OFF_BUS_FIRST.match(first)
    if m is None:
        return None
    if m.re is _OFF_BUS_FIRST and not any(_OFF_BUS_LAST.match(line) for line in rest.split("\n")):
        return None
    return KernelEvent(GPU_OFF_BUS, ts, device=pci_key(m["pci"]))


def parse_message(message: str, ts: datetime) -> KernelEvent | None:
    """The event one kernel message reports, or None when it is not evidence.

    `message` must come from the kernel (a facility-0 record: `parse_kmsg_record`,
    `parse_journal_record`); its text may run over several lines (one printk of several).
    """
    first, _, rest = message[:MAX_MESSAGE].partition("\n")
    first = first.rstrip()
    if first.startswith("NVRM: "):
        return _nvrm(first, rest, ts)
    if first.startswith("nvidia-"):
        m = _SXID.match(first)
        if m:
            sev = (m["sev"] or "").lower().replace("-", "")
            return KernelEvent(
                SXID, ts, device=pci_key(m["pci"]), code=int(m["code"]), severity=sev or None
            )
    if "Bus Error: severity=" in first or " received" in first:
        m = _AER_SOURCE.match(first)
        if m:
            event = _aer_event(m["sev"])
            return KernelEvent(
                event, ts, device=_aer_source(m), severity=event.removeprefix("aer_")
            )
        m = _AER_BUS.match(first)
        if m:
            event = _aer_event(m["sev"])
            return KernelEvent(
                event, ts, device=pci_key(m["dev"]), severity=event.removeprefix("aer_")
            )
    if "Killed process " in first:
        m = _OOM.match(first)
        if m:
            return KernelEvent(OOM_KILL, ts, pid=int(m["pid"]), comm=_comm(m["comm"]))
        return None
    if first.startswith("mce:"):
        if _MCE.match(first) or _MCE_LOGGED.match(first):
            return KernelEvent(MCE, ts)
        return None
    if first.startswith("INFO: task "):
        m = _HUNG.match(first)
        if m:
            return KernelEvent(HUNG_TASK, ts, pid=int(m["pid"]), comm=_comm(m["comm"]))
        return None
    m = _IO.match(first)
    if m:
        return KernelEvent(IO_ERROR, ts, device=m["dev"])
    return None


# -- record formats ---------------------------------------------------------------------
# What the reader takes in: one /dev/kmsg record or one journal entry, at most this long
# (a record is at most 8 KiB escaped, CONSOLE_EXT_LOG_MAX; an entry a little more as JSON).
MAX_RECORD = 64 * 1024
KERNEL_FACILITY = 0  # LOG_KERN: user space cannot log with it (devkmsg_write forces LOG_USER)
_EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
_LATEST = datetime(2100, 1, 1, tzinfo=UTC)
_ESCAPE = re.compile(rb"\\x([0-9a-fA-F]{2})")


def _number(field: str) -> int | None:
    return int(field) if field.isascii() and field.isdigit() and len(field) <= 20 else None


def _wall(epoch_s: float) -> datetime | None:
    """A wall time the service accepts (contract: years 2000-2099), else None."""
    try:
        ts = datetime.fromtimestamp(epoch_s, UTC)
    except (OverflowError, OSError, ValueError):
        return None
    return ts if _EARLIEST <= ts < _LATEST else None


def unescape_kmsg(text: str) -> str:
    r"""Undo /dev/kmsg's escaping: bytes below 0x20 (newlines too), from 0x7f, and the
    backslash itself are printed as `\xHH`; a task name in UTF-8 comes back whole."""
    if "\\x" not in text:
        return text
    raw = _ESCAPE.sub(lambda m: bytes((int(m[1], 16),)), text.encode("utf-8", "replace"))
    return raw.decode("utf-8", "replace")


def parse_kmsg_record(line: str, boot_epoch: float) -> tuple[str, datetime] | None:
    """A `/dev/kmsg` record `prefix,seq,usec,flags[,...];message` -> (message, wall time).

    Only the kernel's own records count: `prefix` is facility * 8 + level, and a record
    user space wrote to /dev/kmsg never has facility 0. `usec` is microseconds since boot
    (CLOCK_MONOTONIC). The message is unescaped (a printk of several lines comes back with
    its newlines); dictionary lines (` KEY=value`) carry no message and are skipped.
    """
    if not line or line[0] == " " or len(line) > MAX_RECORD:
        return None
    head, sep, text = line.partition(";")
    if not sep:
        return None
    fields = head.split(",")
    if len(fields) < 4:
        return None
    prefix, usec = _number(fields[0]), _number(fields[2])
    if prefix is None or usec is None or prefix >> 3 != KERNEL_FACILITY:
        return None
    ts = _wall(boot_epoch + usec / 1e6)
    if ts is None:
        return None
    # A record read whole ends its text at the first raw newline (its dictionary follows).
    return unescape_kmsg(text.partition("\n")[0]), ts


def parse_journal_record(line: str) -> tuple[str, datetime] | None:
    """One `journalctl -k -o json` line -> (message, wall time), for kernel records only.

    journald stamps everything it reads from /dev/kmsg `_TRANSPORT=kernel` and carries the
    record's facility in `SYSLOG_FACILITY`: a program's own entries (syslog, stdout, the
    journal API) and its writes to /dev/kmsg (facility 1 or more) are not the kernel's.
    """
    if len(line) > MAX_RECORD:
        return None
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    if obj.get("_TRANSPORT") != "kernel" or obj.get("SYSLOG_FACILITY") != str(KERNEL_FACILITY):
        return None
    message = obj.get("MESSAGE")
    if isinstance(message, list):  # journald sends non-UTF-8 messages as byte arrays
        message = bytes(
            b for b in message[:MAX_MESSAGE] if isinstance(b, int) and 0 <= b < 256
        ).decode(errors="replace")
    usec = obj.get("__REALTIME_TIMESTAMP")
    if not isinstance(message, str) or not isinstance(usec, str):
        return None
    number = _number(usec)
    ts = None if number is None else _wall(number / 1e6)
    return None if ts is None else (message, ts)


def parse_record(line: str, *, fmt: str, boot_epoch: float = 0.0) -> KernelEvent | None:
    """The event of one captured record, `fmt` `kmsg` or `journal`; never raises."""
    parsed = parse_kmsg_record(line, boot_epoch) if fmt == "kmsg" else parse_journal_record(line)
    return None if parsed is None else parse_message(*parsed)


def iter_events(
    lines: Iterable[str], *, fmt: str, boot_epoch: float = 0.0
) -> Iterator[KernelEvent]:
    """Events of captured records, one at a time (a log of any size in constant memory)."""
    for line in lines:
        event = parse_record(line, fmt=fmt, boot_epoch=boot_epoch)
        if event is not None:
            yield event


def parse_lines(lines: Iterable[str], *, fmt: str, boot_epoch: float = 0.0) -> list[KernelEvent]:
    """Events of captured records: fmt `kmsg` (one record a line) or `journal` (JSON lines)."""
    return list(iter_events(lines, fmt=fmt, boot_epoch=boot_epoch))


def bounded_lines(stream: IO[str], limit: int = MAX_RECORD) -> Iterator[str | None]:
    """Lines of `stream`; a line longer than `limit` is skipped whole (yields None), so one
    runaway line never holds more than `limit` characters in memory."""
    while True:
        line = stream.readline(limit)
        if not line:
            return
        if len(line) >= limit and not line.endswith("\n"):
            while True:
                more = stream.readline(limit)
                if not more or more.endswith("\n"):
                    break
            yield None
            continue
        yield line


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
            try:
                event = parse_message(*parsed)
            except Exception:  # a line the patterns never met must not stop the reader
                log.exception("kernel message not parsed")
                continue
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
            if self._proc.stdout is not None:
                lines = bounded_lines(self._proc.stdout)
                self._emit(None if ln is None else parse_journal_record(ln) for ln in lines)
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
