"""Agent side of the reporter channel: receive datagrams, check them loosely, enqueue.

Owns the Unix datagram socket (and optional loopback UDP port) that workload processes
send to. Checks are loose but real: a known workload kind, only that kind's contract
fields, the required ones present, a bounded size. It stamps nothing except a missing
`ts` (the receive time), and never accepts device kinds from a workload — GPU health
comes from NVML, not from whoever can write to the socket. The service validates strictly.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path

from agents.wire import Record, iso_ts

log = logging.getLogger("faultline.agent.listener")

MAX_DATAGRAM = 64 * 1024

# Mirrors agents/protocol.py for the kinds a workload may send (checked by a test).
FIELDS: dict[str, frozenset[str]] = {
    "process": frozenset(
        {
            "group",
            "generation",
            "rank",
            "event",
            "pid",
            "gpu",
            "exit_code",
            "signal",
            "reason",
            "error_type",
            "job",
            "message",
            "launcher_root_cause",
        }
    ),
    "step": frozenset(
        {
            "group",
            "generation",
            "rank",
            "step",
            "tokens",
            "data_cursor",
            "duration_ms",
            "phases",
            "loss",
            "grad_norm",
            "loss_scale",
            "overflow",
            "step_id",
            "model_flops",
            "hw_flops",
            "lr",
        }
    ),
    "collective": frozenset({"group", "generation", "rank", "entries"}),
    "process_groups": frozenset({"group", "generation", "rank", "groups"}),
    "checkpoint": frozenset(
        {
            "group",
            "generation",
            "checkpoint_id",
            "step",
            "phase",
            "manifest",
            "duration_ms",
            "detail",
            "data_cursor",
        }
    ),
    "transition": frozenset(
        {
            "group",
            "generation",
            "from_state",
            "to_state",
            "reason",
            "restart_count",
            "world_size",
            "topology",
            "data_cursor",
            "model_version",
            "job",
            "objectives",
            "nodes",  # the generation's rendezvous (docs/security.md, "Who owns a group")
        }
    ),
    "serving": frozenset(
        {
            "group",
            "worker",
            "model_version",
            "adapter_version",
            "kv_schema",
            "ready",
            "draining",
            "window",
            "generation",
        }
    ),
    # correctness probes
    "probe": frozenset(
        {
            "group",
            "probe",
            "generation",
            "rank",
            "worker",
            "step",
            "step_id",
            "value",
            "checksum",
            "duration_ms",
            "model_version",
        }
    ),
}
REQUIRED: dict[str, frozenset[str]] = {
    "process": frozenset({"group", "generation", "rank", "event"}),
    "step": frozenset({"group", "generation", "rank", "step"}),
    "collective": frozenset({"group", "generation", "rank", "entries"}),
    "process_groups": frozenset({"group", "generation", "rank", "groups"}),
    "checkpoint": frozenset({"group", "generation", "checkpoint_id", "phase"}),
    "transition": frozenset({"group", "generation", "to_state"}),
    "serving": frozenset({"group", "worker", "window"}),
    "probe": frozenset({"group", "probe"}),
}


def check(datagram: bytes) -> tuple[Record | None, str | None]:
    """(record, None) when acceptable, else (None, why)."""
    if len(datagram) > MAX_DATAGRAM:
        return None, "datagram too large"
    try:
        # A bare NaN/Infinity from a non-reporter sender becomes the contract's string.
        rec = json.loads(datagram, parse_constant=str)
    except ValueError:
        return None, "not JSON"
    if not isinstance(rec, dict):
        return None, "not a JSON object"
    kind = rec.get("kind")
    if kind not in FIELDS:
        return None, f"kind {kind!r} is not a workload record"
    extra = set(rec) - FIELDS[kind] - {"kind", "ts"}
    if extra:
        return None, f"{kind}: unknown field(s) {sorted(extra)}"
    missing = {k for k in REQUIRED[kind] if rec.get(k) is None}
    if missing:
        return None, f"{kind}: missing {sorted(missing)}"
    if not isinstance(rec.get("ts"), str):
        rec["ts"] = iso_ts()
    return rec, None


# sockaddr_un.sun_path holds 108 bytes with the terminating NUL (Linux): longer paths fail
# to bind with "AF_UNIX path too long", which names neither the path nor the fix.
MAX_SOCKET_PATH = 107


class Listener:
    """Receives reporter datagrams on a thread and hands good records to `sink`."""

    def __init__(
        self,
        sink: Callable[[Record], None],
        *,
        socket_path: str | Path,
        udp_port: int | None = None,
        mode: int = 0o660,
    ) -> None:
        self.sink = sink
        self.socket_path = str(socket_path)
        self.udp_port = udp_port
        self.mode = mode
        self.received = 0
        self.rejected = 0
        self._socks: list[socket.socket] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._inbox: deque[bytes] = deque(maxlen=100_000)
        self._ready = threading.Event()

    def start(self) -> None:
        size = len(os.fsencode(self.socket_path))
        if size > MAX_SOCKET_PATH:
            raise ValueError(
                f"reporter socket path is {size} bytes, over the {MAX_SOCKET_PATH} a Unix "
                f"socket allows: {self.socket_path}; use a shorter --state-dir"
            )
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)  # a stale socket from a previous run
        Path(self.socket_path).parent.mkdir(parents=True, exist_ok=True)
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        unix.bind(self.socket_path)
        os.chmod(self.socket_path, self.mode)
        unix.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
        self._socks.append(unix)
        if self.udp_port is not None:
            udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            udp.bind(("127.0.0.1", self.udp_port))
            self.udp_port = udp.getsockname()[1]
            self._socks.append(udp)
        for sock in self._socks:
            sock.settimeout(0.2)
            thread = threading.Thread(
                target=self._loop, args=(sock,), daemon=True, name="reporter-listener"
            )
            thread.start()
            self._threads.append(thread)
        drain = threading.Thread(target=self._drain, daemon=True, name="reporter-spool")
        drain.start()
        self._drainer = drain

    def handle(self, datagram: bytes) -> None:
        rec, why = check(datagram)
        if rec is None:
            self.rejected += 1
            log.debug("reporter datagram rejected: %s", why)
            return
        self.received += 1
        self.sink(rec)

    def _loop(self, sock: socket.socket) -> None:
        # Receive only; parsing and spooling happen on another thread. The kernel queues
        # few datagrams per Unix socket (net.unix.max_dgram_qlen, 10 by default), so this
        # loop must get back to recv() at once or bursts are dropped at the sender.
        inbox = self._inbox
        while not self._stop.is_set():
            try:
                inbox.append(sock.recv(MAX_DATAGRAM + 1))
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                continue
            self._ready.set()

    def _drain(self) -> None:
        while True:
            self._ready.wait(0.2)
            self._ready.clear()
            while self._inbox:
                data = self._inbox.popleft()
                try:
                    self.handle(data)
                except Exception:
                    log.exception("reporter record could not be spooled")
            if self._stop.is_set():
                return

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=1)
        self._ready.set()
        if getattr(self, "_drainer", None) is not None:
            self._drainer.join(timeout=5)  # what was received is spooled before exit
        for sock in self._socks:
            sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
