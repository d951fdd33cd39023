"""In-process reporter for training and serving code: one JSON datagram per call.

Owns the workload side of telemetry: `step`, `collective`, `checkpoint`, `transition`,
`serving_window`, correctness `probe`s (a fixed input's answer, optionally run every N
steps from a callable the training loop registers), and automatic `process` records
(atexit, chained signal handlers, uncaught exceptions with OOM classified by exception
type name). It sends to the local agent over a Unix datagram socket (loopback UDP when
configured or where AF_UNIX is missing). It must never block, never raise into the
caller and never import anything beyond the standard library: a telemetry outage must
not drag the workload down. When no agent listens, records are counted as dropped and
the training loop carries on.

    from agents import reporter
    reporter.init(group="llama-70b", generation=3, rank=int(os.environ["RANK"]))
    reporter.step(step, tokens=n, loss=loss.item(), duration_ms=ms)
    reporter.set_probe(lambda: fixed_batch_loss(model), every=50)   # optional

Every step carries `step_id` (`g<generation>:s<step>`, the same on every rank), so its
phase, collective and probe records can be joined end to end.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import math
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from types import FrameType, TracebackType
from typing import Any

from agents import launcher_env
from agents.wire import iso_ts, real, step_id

DEFAULT_SOCKET = "/var/lib/faultline-agent/reporter.sock"
MAX_DATAGRAM = 60 * 1024
_MESSAGE_LIMIT = 200
# The signals whose exit a process reports itself (install_hooks chains a handler): any
# other death by signal (SIGKILL, SIGSEGV, SIGABRT...) only its launcher can see.
HOOKED_SIGNALS = (signal.SIGTERM, signal.SIGHUP)

_PATH_RE = re.compile(r"(?:[A-Za-z]:)?(?:[/\\][\w.\-@+~]+){2,}[/\\]?")
_HEX_RE = re.compile(r"0x[0-9a-fA-F]{6,}")
_NUM_RE = re.compile(r"\d{5,}")
_SPACE_RE = re.compile(r"\s+")
# One encoder for the process: json.dumps() with options builds a new one per call.
_encode = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode
encode = _encode  # the same encoding for callers that pre-encode parts (agents.torch)


def scrub(message: str, limit: int = _MESSAGE_LIMIT) -> str:
    """Strip what identifies people or data from an exception message, then bound it.

    Paths can name users, datasets and customers; long numbers can be ids or sample
    contents. Neither belongs in telemetry (DESIGN.md §1, contract 8).
    """
    text = _PATH_RE.sub("<path>", message)
    text = _HEX_RE.sub("<hex>", text)
    text = _NUM_RE.sub("<n>", text)
    text = _SPACE_RE.sub(" ", text).strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def classify_exception(exc: BaseException) -> str:
    """`reason` for a process that died of `exc`, judged by type name (no torch import)."""
    for klass in type(exc).__mro__:
        if classify_error_name(klass.__name__) == "oom":
            return "oom"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    return "exception"


def classify_error_name(name: str) -> str:
    """`reason` for an exception known only by its (possibly qualified) type name, as an
    error file or a log line gives it: `oom` for out-of-memory errors, else `exception`."""
    short = name.rsplit(".", 1)[-1]
    if short == "MemoryError" or "OutOfMemory" in short:
        return "oom"
    if short == "KeyboardInterrupt":
        return "interrupted"
    return "exception"


def error_type(exc: BaseException) -> str:
    klass = type(exc)
    module = klass.__module__
    name = (
        klass.__qualname__
        if module in ("builtins", "__main__")
        else f"{module}.{klass.__qualname__}"
    )
    return name[:128]


def _maybe_real(value: Any) -> Any:
    return real(value) if isinstance(value, float) else value


def checksum(data: bytes | str | Iterable[float | int]) -> str:
    """A probe answer's checksum (sha256 hex, 32 chars): bytes as they are, text as UTF-8,
    numbers by their exact repr (a bit flip in one float changes it)."""
    if isinstance(data, str):
        raw = data.encode()
    elif isinstance(data, bytes | bytearray | memoryview):
        raw = bytes(data)
    else:
        raw = ",".join(float(x).hex() if isinstance(x, float) else str(x) for x in data).encode()
    return hashlib.sha256(raw).hexdigest()[:32]


class Reporter:
    """Sends records to the local agent. Every public method swallows every error."""

    def __init__(
        self,
        *,
        socket_path: str | None = None,
        udp: tuple[str, int] | None = None,
        group: str | None = None,
        generation: int | None = None,
        rank: int | None = None,
        gpu: str | None = None,
    ) -> None:
        self.socket_path = (
            socket_path or os.environ.get("FAULTLINE_REPORTER_SOCKET") or (DEFAULT_SOCKET)
        )
        # Explicit arguments, then FAULTLINE_*, then what the launcher (torchrun, Slurm)
        # already told the process (agents.launcher_env).
        self.facts = launcher_env.from_environ()
        self.group = group or self.facts.group
        self.generation = generation if generation is not None else self.facts.generation or 0
        self.rank = rank if rank is not None else self.facts.rank or 0
        self.world_size = self.facts.world_size
        self.job = self.facts.job  # the scheduler's job id: the group's owner (Slurm)
        self.gpu = gpu or os.environ.get("FAULTLINE_GPU")
        self.sent = 0
        self.dropped = 0
        self._exited = False
        self._exit_code: int | None = None
        self._probe: tuple[Callable[[], Any], int, str] | None = None
        self.probe_errors = 0
        self._unix: socket.socket | None = None
        self._unix_retry_at = 0.0
        self._udp: socket.socket | None = None
        if udp is None:
            spec = os.environ.get("FAULTLINE_REPORTER_UDP", "")
            if spec:
                host, _, port = spec.rpartition(":")
                with contextlib.suppress(ValueError):
                    udp = (host or "127.0.0.1", int(port))
        try:
            if hasattr(socket, "AF_UNIX"):
                self._unix = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._unix.setblocking(False)
            if udp is not None or self._unix is None:
                self._udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                self._udp.setblocking(False)
                # connect() so a closed port surfaces as ConnectionRefusedError (a drop).
                self._udp.connect(udp or ("127.0.0.1", 7465))
        except OSError:
            pass

    # -- transport -------------------------------------------------------------------
    def _send(self, rec: dict[str, Any]) -> bool:
        """Send one record; whether it left (False: counted as dropped)."""
        try:
            data = _encode(rec).encode()
        except (TypeError, ValueError):
            self.dropped += 1
            return False
        return self._send_data(data)

    def _send_data(self, data: bytes) -> bool:
        if len(data) > MAX_DATAGRAM:
            self.dropped += 1
            return False
        if self._unix is not None and time.monotonic() >= self._unix_retry_at:
            try:
                self._unix.sendto(data, self.socket_path)
                self.sent += 1
                return True
            except (FileNotFoundError, ConnectionRefusedError):
                # No agent: stop paying for failing syscalls for a second.
                self._unix_retry_at = time.monotonic() + 1.0
            except OSError:
                pass  # full buffer (agent busy): drop this one, try the next
            if self._udp is None:
                self.dropped += 1
                return False
        if self._udp is not None:
            try:
                self._udp.send(data)
                self.sent += 1
                return True
            except OSError:
                pass
        self.dropped += 1
        return False

    def _scoped(
        self, kind: str, group: str | None, generation: int | None, rank: int | None
    ) -> dict[str, Any]:
        return {
            "kind": kind,
            "ts": iso_ts(),
            "group": group or self.group,
            "generation": self.generation if generation is None else generation,
            "rank": self.rank if rank is None else rank,
        }

    # -- public API: each swallows everything ----------------------------------------
    def step(
        self,
        step: int,
        *,
        tokens: int = 0,
        data_cursor: int | None = None,
        duration_ms: float | None = None,
        phases: dict[str, float] | None = None,
        loss: float | None = None,
        grad_norm: float | None = None,
        loss_scale: float | None = None,
        overflow: bool | None = None,
        model_flops: float | None = None,
        hw_flops: float | None = None,
        lr: float | None = None,
        group: str | None = None,
        generation: int | None = None,
        rank: int | None = None,
    ) -> None:
        """One step of this rank. `model_flops` / `hw_flops`: the FLOPs the step did by the
        model's count and the hardware's (agents.flops), from which the console works out
        MFU and HFU against the rank's GPU; `lr`: the learning rate it stepped with."""
        try:
            rec = self._scoped("step", group, generation, rank)
            rec["step"] = step
            rec["step_id"] = step_id(rec["generation"], step)
            rec["tokens"] = tokens
            if data_cursor is not None:
                rec["data_cursor"] = data_cursor
            if duration_ms is not None:
                rec["duration_ms"] = duration_ms
            if phases:
                rec["phases"] = phases
            if loss is not None:
                rec["loss"] = _maybe_real(loss)
            if grad_norm is not None:
                rec["grad_norm"] = _maybe_real(grad_norm)
            if loss_scale is not None:
                rec["loss_scale"] = _maybe_real(loss_scale)
            if overflow is not None:
                rec["overflow"] = overflow
            for key, flops in (("model_flops", model_flops), ("hw_flops", hw_flops)):
                if flops is not None and math.isfinite(flops) and flops >= 0:
                    rec[key] = float(flops)  # a bad count is left out, never the step
            if lr is not None:
                rec["lr"] = _maybe_real(float(lr))
            self._send(rec)
        except Exception:  # noqa: BLE001 -- never raise into the workload; count it
            self.dropped += 1
        if self._probe is not None and step % self._probe[1] == 0:
            self._run_probe(step, group, generation, rank)

    # -- correctness probes ----------------------------------------------------------
    def set_probe(self, fn: Callable[[], Any] | None, *, every: int, name: str = "fixed") -> None:
        """Run `fn()` after every `every`-th step and report its answer as a `probe`.

        `fn` is the training loop's: a fixed batch's loss (a float: `value`), or a checksum
        of a deterministic forward pass (str or bytes: `checksum`, see `checksum()`), or a
        (value, checksum) pair. It runs in the caller's thread, so it should be cheap (one
        small fixed batch, no gradients); an exception in it is counted, never raised."""
        self._probe = None if fn is None or every < 1 else (fn, int(every), name)

    def _run_probe(
        self, step: int, group: str | None, generation: int | None, rank: int | None
    ) -> None:
        if self._probe is None:
            return
        fn, _, name = self._probe
        try:
            began = time.perf_counter()
            answer = fn()
            ms = (time.perf_counter() - began) * 1000.0
        except Exception:  # noqa: BLE001 -- a broken probe must not break training
            self.probe_errors += 1
            return
        value, digest = answer if isinstance(answer, tuple) else (answer, None)
        if isinstance(value, str | bytes):
            value, digest = None, value
        if isinstance(digest, bytes):
            digest = checksum(digest)
        self.probe(
            name,
            value=None if value is None else float(value),
            checksum=digest,
            step=step,
            duration_ms=round(ms, 3),
            group=group,
            generation=generation,
            rank=rank,
        )

    def probe(
        self,
        name: str,
        *,
        value: float | None = None,
        checksum: str | None = None,
        step: int | None = None,
        worker: str | None = None,
        model_version: str | None = None,
        duration_ms: float | None = None,
        group: str | None = None,
        generation: int | None = None,
        rank: int | None = None,
    ) -> None:
        """One probe answer. Training: per rank at `step`; serving: pass `worker` (and the
        `model_version` that answered), no rank or generation."""
        try:
            if worker is None:
                rec = self._scoped("probe", group, generation, rank)
            else:
                rec = {"kind": "probe", "ts": iso_ts(), "group": group or self.group}
                rec["worker"] = worker
                if generation is not None:
                    rec["generation"] = generation
            rec["probe"] = name
            if step is not None:
                rec["step"] = step
                if rec.get("generation") is not None:
                    rec["step_id"] = step_id(rec["generation"], step)
            for key, val in (
                ("value", None if value is None else _maybe_real(float(value))),
                ("checksum", checksum),
                ("duration_ms", duration_ms),
                ("model_version", model_version),
            ):
                if val is not None:
                    rec[key] = val
            self._send(rec)
        except Exception:  # noqa: BLE001 -- never raise into the workload; count it
            self.dropped += 1

    def collective(
        self,
        entries: Iterable[dict[str, Any]],
        *,
        group: str | None = None,
        generation: int | None = None,
        rank: int | None = None,
    ) -> None:
        """The rank's latest window of collective calls (seq, pg, op, numel, dtype, state)."""
        try:
            rec = self._scoped("collective", group, generation, rank)
            rec["entries"] = list(entries)[-512:]
            self._send(rec)
        except Exception:  # noqa: BLE001 -- never raise into the workload; count it
            self.dropped += 1

    # -- process groups ------------------------------------------------------
    def collective_encoded(self, fragments: list[str]) -> None:
        """`collective` with each entry already JSON-encoded (agents.torch caches the
        encoding of entries that did not change: re-encoding a 256-entry window every step
        was most of the reporter's per-step cost). Same record on the wire."""
        try:
            head = _encode(self._scoped("collective", None, None, None))
            self._send_data(f'{head[:-1]},"entries":[{",".join(fragments[-512:])}]}}'.encode())
        except Exception:  # noqa: BLE001 -- never raise into the workload; count it
            self.dropped += 1

    def process_groups(
        self,
        groups: Iterable[dict[str, Any]],
        *,
        group: str | None = None,
        generation: int | None = None,
        rank: int | None = None,
    ) -> bool:
        """The process groups this rank belongs to: [{pg, size, ranks, desc, backend}].
        Whether the record left: it is sent rarely (agents/torch.py), so a caller resends
        one the agent's full buffer dropped instead of waiting for the next period."""
        try:
            rec = self._scoped("process_groups", group, generation, rank)
            rec["groups"] = list(groups)[:1024]
            return self._send(rec)
        except Exception:  # noqa: BLE001 -- never raise into the workload; count it
            self.dropped += 1
            return False

    # -- end of the process-group block ---------------------------------------------------

    def checkpoint(
        self,
        checkpoint_id: str,
        phase: str,
        *,
        step: int | None = None,
        manifest: dict[str, Any] | None = None,
        duration_ms: float | None = None,
        group: str | None = None,
        generation: int | None = None,
        data_cursor: int | None = None,
        detail: str | None = None,
    ) -> None:
        """A checkpoint's phase (staging ... committed, verified or corrupt with `detail`
        naming the shard at fault)."""
        try:
            rec = self._scoped("checkpoint", group, generation, None)
            del rec["rank"]
            rec.update(checkpoint_id=checkpoint_id, phase=phase)
            for key, value in (
                ("step", step),
                ("manifest", manifest),
                ("duration_ms", duration_ms),
                ("data_cursor", data_cursor),  # where a restore resumes the data
                ("detail", None if detail is None else scrub(detail, 256)),
            ):
                if value is not None:
                    rec[key] = value
            self._send(rec)
        except Exception:  # noqa: BLE001 -- never raise into the workload; count it
            self.dropped += 1

    def transition(
        self,
        to_state: str,
        *,
        from_state: str | None = None,
        reason: str | None = None,
        restart_count: int | None = None,
        world_size: int | None = None,
        topology: dict[str, int] | None = None,
        data_cursor: int | None = None,
        model_version: str | None = None,
        group: str | None = None,
        generation: int | None = None,
        job: str | None = None,
        objectives: dict[str, Any] | None = None,
        nodes: list[str] | None = None,
    ) -> None:
        """The group's state changed. `nodes`: the nodes of this generation's rendezvous
        (a host or the launcher declares them; only they may then place its ranks)."""
        try:
            rec = self._scoped("transition", group, generation, None)
            del rec["rank"]
            rec["to_state"] = to_state
            for key, value in (
                ("from_state", from_state),
                ("reason", reason),
                ("restart_count", restart_count),
                ("world_size", world_size),
                ("topology", topology),
                ("data_cursor", data_cursor),
                ("model_version", model_version),
                ("job", job or self.job),
                ("objectives", objectives),  # RPO, RTO, consistency, semantics
                ("nodes", list(nodes) if nodes is not None else None),
            ):
                if value is not None:
                    rec[key] = value
            self._send(rec)
        except Exception:  # noqa: BLE001 -- never raise into the workload; count it
            self.dropped += 1

    def serving_window(
        self,
        worker: str,
        window: dict[str, Any],
        *,
        model_version: str | None = None,
        adapter_version: str | None = None,
        kv_schema: str | None = None,
        ready: bool = False,
        draining: bool = False,
        group: str | None = None,
        generation: int | None = None,
    ) -> None:
        """One serving window's counters and percentiles (`window["seconds"]` required)."""
        try:
            rec = self._scoped("serving", group, generation, None)
            del rec["rank"]
            if generation is None:
                del rec["generation"]  # serving workers follow the group's generation
            rec.update(worker=worker, window=window, ready=ready, draining=draining)
            for key, value in (
                ("model_version", model_version),
                ("adapter_version", adapter_version),
                ("kv_schema", kv_schema),
            ):
                if value is not None:
                    rec[key] = value
            self._send(rec)
        except Exception:  # noqa: BLE001 -- never raise into the workload; count it
            self.dropped += 1

    def serving_exit(
        self,
        worker: str,
        *,
        active: int = 0,
        queued: int = 0,
        exit_code: int | None = None,
        seconds: float = 1.0,
        draining: bool = False,
        group: str | None = None,
    ) -> None:
        """A serving worker's process exited: its launcher or router says so at once (the
        worker cannot), with the requests it knew in flight on it (contract: `window.exited`)."""
        window: dict[str, Any] = {
            "seconds": seconds,
            "active": active,
            "queued": queued,
            "exited": True,
        }
        if exit_code is not None:
            window["exit_code"] = exit_code
        self.serving_window(worker, window, ready=False, draining=draining, group=group)

    def process(
        self,
        event: str,
        *,
        exit_code: int | None = None,
        sig: int | None = None,
        reason: str | None = None,
        error: BaseException | None = None,
        error_name: str | None = None,
        message: str | None = None,
        pid: int | None = None,
        rank: int | None = None,
        generation: int | None = None,
        at: float | None = None,
        launcher_root_cause: str | None = None,
    ) -> None:
        """This process started or exited; or, with `pid`, another one its launcher saw
        (`rank`, `generation`, the time `at` it failed, the error file's `error_name` and
        `message`, and the launcher's name when it named this exit its root cause)."""
        try:
            own = pid is None
            if event == "exited" and own:
                if self._exited:
                    return  # one exit per process, whichever hook sees it first
                self._exited = True
            rec = self._scoped("process", None, generation, rank)
            if at is not None:
                rec["ts"] = iso_ts(at)
            rec.update(event=event, pid=os.getpid() if own else pid)
            if self.gpu and own:
                rec["gpu"] = self.gpu
            if error is not None:
                error_name, message = error_type(error), str(error)
            for key, value in (
                ("exit_code", exit_code),
                ("signal", sig),
                ("reason", reason),
                ("error_type", error_name[:128] if error_name else None),
                # Bounded and scrubbed here; the service scrubs it again as it stores it.
                ("message", scrub(message) if message else None),
                ("job", self.job),
                ("launcher_root_cause", launcher_root_cause),
            ):
                if value is not None:
                    rec[key] = value
            self._send(rec)
        except Exception:  # noqa: BLE001 -- never raise into the workload; count it
            self.dropped += 1

    # -- automatic process records ----------------------------------------------------
    def install_hooks(self, *, exits: bool = True) -> None:
        """Send `started` now and `exited` from atexit, SIGTERM/SIGHUP or an uncaught
        exception; existing handlers and hooks are chained, never replaced. `exits=False`:
        `started` only, for a worker whose launcher reports every exit it reaps
        (agents.torchrun), so one exit is never told twice with two timestamps."""
        try:
            self.process("started")
            if not exits:
                return
            atexit.register(self._at_exit)
            previous_hook = sys.excepthook

            def excepthook(
                kind: type[BaseException], exc: BaseException, tb: TracebackType | None
            ) -> None:
                self.process(
                    "exited",
                    exit_code=1,
                    reason=classify_exception(exc),
                    error=exc,
                    sig=signal.SIGINT if isinstance(exc, KeyboardInterrupt) else None,
                )
                previous_hook(kind, exc, tb)

            sys.excepthook = excepthook
            original_exit = sys.exit

            def exit_with_code(code: Any = None) -> None:
                self.exiting(code)
                original_exit(code)

            sys.exit = exit_with_code  # type: ignore[assignment] # atexit reports the code
            if threading.current_thread() is threading.main_thread():
                for signum in HOOKED_SIGNALS:
                    self._chain_signal(signum)
        except Exception:  # noqa: BLE001 -- never raise into the workload; count it
            self.dropped += 1

    def exiting(self, code: Any) -> None:
        """The process is leaving with SystemExit(`code`): atexit reports that code."""
        self._exit_code = code if isinstance(code, int) else (0 if code is None else 1)

    def _at_exit(self) -> None:
        code = self._exit_code if self._exit_code is not None else 0
        self.process("exited", exit_code=code, reason="clean" if code == 0 else "exit_code")

    def _chain_signal(self, signum: int) -> None:
        previous = signal.getsignal(signum)
        if previous == signal.SIG_IGN:
            return  # the process ignores it: it will not exit, so there is nothing to report

        def handler(sig: int, frame: FrameType | None) -> None:
            self.process("exited", sig=sig, exit_code=128 + sig, reason="killed")
            if callable(previous):
                previous(sig, frame)
            else:
                signal.signal(sig, signal.SIG_DFL)
                os.kill(os.getpid(), sig)

        signal.signal(signum, handler)

    def close(self) -> None:
        for sock in (self._unix, self._udp):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.close()


_default: Reporter | None = None
_lock = threading.Lock()


def init(*, hooks: bool = True, **kwargs: Any) -> Reporter:
    """Configure the module-level reporter (idempotent per process). Under Faultline's
    launcher wrapper (agents.torchrun) the hooks report `started` only: the launcher
    reports the exit it reaps."""
    global _default
    with _lock:
        if _default is None:
            _default = Reporter(**kwargs)
            if hooks and _default.group:
                _default.install_hooks(exits=not _default.facts.launcher_reports)
        return _default


def auto() -> Reporter:
    """Zero glue (DESIGN.md §7): the module reporter as the launcher configured this process
    (agents.launcher_env), hooks installed, and rank 0 saying its generation runs, as a
    launcher would, unless Faultline's launcher wrapper reports that itself. Idempotent;
    a reporter already configured by the program is kept as it is and announces nothing."""
    with _lock:
        fresh = _default is None
    rep = init()
    if fresh:
        announce(rep)
    return rep


def announce(rep: Reporter) -> None:
    """Rank 0's `running` transition for its generation (restart count, world size, job)."""
    if rep.group is None or rep.facts.launcher_reports or rep.rank != 0:
        return
    first = rep.generation == 0
    rep.transition(
        "running",
        from_state="initializing" if first else "recovering",
        reason="launch" if first else "restart",
        restart_count=rep.generation,
        world_size=rep.world_size,
    )


def get() -> Reporter:
    return _default if _default is not None else init(hooks=False)


def _forward(name: str) -> Callable[..., None]:
    def call(*args: Any, **kwargs: Any) -> None:
        # try/except rather than contextlib.suppress: this sits on the per-call hot path.
        try:  # noqa: SIM105
            getattr(get(), name)(*args, **kwargs)
        except Exception:  # noqa: BLE001, S110 -- the reporter never raises into the workload
            pass

    call.__name__ = name
    call.__doc__ = getattr(Reporter, name).__doc__
    return call


step = _forward("step")
collective = _forward("collective")
process_groups = _forward("process_groups")
checkpoint = _forward("checkpoint")
transition = _forward("transition")
serving_window = _forward("serving_window")
process = _forward("process")
probe = _forward("probe")
set_probe = _forward("set_probe")
