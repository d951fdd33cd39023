"""Optional torch.distributed instrumentation on top of the reporter.

Owns per-rank collective bookkeeping (sequence, op, process group, numel, dtype, state) by
wrapping `torch.distributed` collectives, step-phase timing (`phase("compute")`), and
`report_step(...)`. torch is imported lazily inside `install()`: importing this module
costs nothing on a node without torch, and nothing here is needed by the agent itself.
The per-rank window feeds the console's "same step, same order, same count and dtype on
every rank?" checks (DESIGN.md §1) that come before any timeout is blamed on the network.

    from agents import reporter, torch as fl_torch
    reporter.init(group="llama", generation=3, rank=dist.get_rank())
    fl_torch.install()
    with fl_torch.phase("compute"): loss = model(batch)
    fl_torch.report_step(step, loss=loss, tokens=n)
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from agents import reporter as _reporter
from agents.wire import iso_ts

OPS = (
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "reduce",
    "gather",
    "scatter",
    "barrier",
    "send",
    "recv",
)
PHASES = ("compute", "collective", "input", "checkpoint", "optimizer")


def _first_tensor(torch: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value
        if isinstance(value, list | tuple):
            for item in value:
                if isinstance(item, torch.Tensor):
                    return item
    return None


class Recorder:
    """Wraps collectives and times phases for one rank."""

    def __init__(self, rep: _reporter.Reporter | None = None, window: int = 256) -> None:
        self.rep = rep
        self.entries: deque[dict[str, Any]] = deque(maxlen=window)
        self.seq: dict[str, int] = {}
        self.phases: dict[str, float] = {}
        self._step_started = time.monotonic()
        self._originals: dict[str, Callable[..., Any]] = {}
        self._lock = threading.Lock()
        self._dist: Any = None
        self._pending: dict[int, tuple[dict[str, Any], Any]] = {}
        self._next_step: int | None = None  # the step in progress (correlation: step_id)
        # A rank blocked inside a collective cannot report from its own thread: a watchdog
        # sends the window once a call has been in flight for WATCH_AFTER_S, so the console
        # sees which rank waits at which seq (and which rank never arrived).
        self._inflight: tuple[dict[str, Any], float] | None = None
        self._watched: int | None = None
        self._stop = threading.Event()
        self._watchdog: threading.Thread | None = None

    @property
    def reporter(self) -> _reporter.Reporter:
        return self.rep or _reporter.get()

    def _pg_name(self, kwargs: dict[str, Any]) -> str:
        group = kwargs.get("group")
        if group is None:
            return "default"
        name = getattr(group, "group_name", None)
        return str(name or f"pg-{id(group):x}")[:64]

    def _wrap(self, torch: Any, op: str, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            pg = self._pg_name(kwargs)
            tensor = _first_tensor(torch, args, kwargs)
            with self._lock:
                seq = self.seq.get(pg, 0) + 1
                self.seq[pg] = seq
                entry: dict[str, Any] = {
                    "seq": seq,
                    "pg": pg,
                    "op": op,
                    "state": "started",
                    "started_ts": iso_ts(),
                }
                if self._next_step is not None:
                    gen = self.reporter.generation
                    entry["step_id"] = _reporter.step_id(gen, self._next_step)
                if tensor is not None:
                    entry["numel"] = int(tensor.numel())
                    entry["dtype"] = str(tensor.dtype).replace("torch.", "")
                self.entries.append(entry)
            began = time.monotonic()
            self._inflight = (entry, began)
            try:
                result = original(*args, **kwargs)
            finally:
                self._inflight = None
            if kwargs.get("async_op") and result is not None and hasattr(result, "is_completed"):
                # The Work handle is a C++ object we must not replace; ask it at report time.
                with self._lock:
                    self._pending[id(entry)] = (entry, result)
            else:
                entry["state"] = "completed"
                self._add_phase("collective", (time.monotonic() - began) * 1000.0)
            return result

        return wrapper

    WATCH_AFTER_S = 2.0

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            current = self._inflight
            if current is None:
                continue
            entry, began = current
            if time.monotonic() - began < self.WATCH_AFTER_S or self._watched == id(entry):
                continue
            self._watched = id(entry)
            try:
                with self._lock:
                    window = [dict(e) for e in self.entries]
                self.reporter.collective(window)
            except Exception:  # noqa: BLE001, S112 -- instrumentation never breaks training
                continue

    def install(self) -> Recorder:
        # Optional dependency, loaded only when asked.
        import torch.distributed as dist

        import torch

        self._dist = dist
        for op in OPS:
            original = getattr(dist, op, None)
            if original is None or op in self._originals:
                continue
            self._originals[op] = original
            setattr(dist, op, self._wrap(torch, op, original))
        if self._watchdog is None:
            self._watchdog = threading.Thread(
                target=self._watch, name="faultline-collective-watch", daemon=True
            )
            self._watchdog.start()
        return self

    def uninstall(self) -> None:
        self._stop.set()
        for op, original in self._originals.items():
            setattr(self._dist, op, original)
        self._originals.clear()

    def _add_phase(self, name: str, ms: float) -> None:
        self.phases[name] = self.phases.get(name, 0.0) + ms

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time a step phase (compute, collective, input, checkpoint, optimizer)."""
        began = time.monotonic()
        try:
            yield
        finally:
            if name in PHASES:
                self._add_phase(name, (time.monotonic() - began) * 1000.0)

    def report_step(
        self,
        step: int,
        *,
        loss: Any = None,
        grad_norm: Any = None,
        loss_scale: Any = None,
        overflow: bool | None = None,
        tokens: int = 0,
        data_cursor: int | None = None,
    ) -> None:
        """Send the step (duration since the previous one, phases) and the collective window."""
        try:
            now = time.monotonic()
            duration = (now - self._step_started) * 1000.0
            self._step_started = now
            phases = {k: round(v, 3) for k, v in self.phases.items()}
            self.phases = {}
            self._next_step = step + 1
            self.reporter.step(
                step,
                tokens=tokens,
                data_cursor=data_cursor,
                duration_ms=round(duration, 3),
                phases=phases or None,
                loss=_number(loss),
                grad_norm=_number(grad_norm),
                loss_scale=_number(loss_scale),
                overflow=overflow,
            )
            with self._lock:
                for key, (entry, work) in list(self._pending.items()):
                    with contextlib.suppress(Exception):
                        if work.is_completed():
                            entry["state"] = "completed"
                            del self._pending[key]
                    if entry not in self.entries:
                        self._pending.pop(key, None)  # fell out of the window
                window = [dict(e) for e in self.entries]
            if window:
                self.reporter.collective(window)
        except Exception:  # noqa: BLE001, S110 -- instrumentation never breaks training
            pass


def _number(value: Any) -> float | None:
    if value is None:
        return None
    if hasattr(value, "item"):
        value = value.item()  # a 0-dim tensor: one sync, once per step
    return float(value)


_recorder: Recorder | None = None


def install(rep: _reporter.Reporter | None = None, window: int = 256) -> Recorder:
    """Wrap torch.distributed collectives for this process (idempotent)."""
    global _recorder
    if _recorder is None:
        _recorder = Recorder(rep, window).install()
    return _recorder


def phase(name: str) -> contextlib.AbstractContextManager[None]:
    return install().phase(name)


def report_step(step: int, **kwargs: Any) -> None:
    install().report_step(step, **kwargs)
