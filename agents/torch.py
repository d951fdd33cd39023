"""Optional torch.distributed instrumentation on top of the reporter.

Owns per-rank collective bookkeeping by wrapping `torch.distributed` collectives: per
process group `seq`, op, numel and dtype in and out, all_to_all splits, send/recv peer and
p2p order, coalesced batches (`batch_isend_irecv`, `_coalescing_manager`), the process
groups this rank belongs to (`process_groups` records), step-phase timing (`phase("compute")`), and
`report_step(...)`. torch is imported lazily inside `install()`: importing this module
costs nothing on a node without torch, and nothing here is needed by the agent itself.
The per-rank window feeds the console's "same step, same order, same count and dtype on
every rank?" checks (DESIGN.md §1) that come before any timeout is blamed on the network.

    from agents import reporter, torch as fl_torch
    reporter.init(group="llama", generation=3, rank=dist.get_rank())  # or nothing: see install
    fl_torch.install()
    with fl_torch.phase("compute"): loss = model(batch)
    fl_torch.report_step(step, loss=loss, tokens=n)
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from agents import reporter as _reporter
from agents.wire import iso_ts, step_id

OPS = (
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
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


# -- what one call moved ------------------------------------------------------
# op -> (input argument, output argument): lists of tensors count their elements together.
_TENSORS = {
    "all_reduce": ("tensor", "tensor"),
    "broadcast": ("tensor", "tensor"),
    "reduce": ("tensor", "tensor"),
    "all_gather": ("tensor", "tensor_list"),
    "all_gather_into_tensor": ("input_tensor", "output_tensor"),
    "all_gather_single": ("input_tensor", "output_tensor"),
    "reduce_scatter": ("input_list", "output"),
    "reduce_scatter_tensor": ("input", "output"),
    "reduce_scatter_single": ("input", "output"),
    "all_to_all_single": ("input", "output"),
    "all_to_all": ("input_tensor_list", "output_tensor_list"),
    "gather": ("tensor", "gather_list"),
    "scatter": ("scatter_list", "tensor"),
    "send": ("tensor", None),
    "recv": (None, "tensor"),
}
_P2P = {"send": "dst", "recv": "src", "isend": "dst", "irecv": "src"}
_CODE = re.compile(r"[^A-Za-z0-9_.:\-]")


def _dtype(t: Any) -> str:
    return str(t.dtype).replace("torch.", "")


def _numel(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, list | tuple):
        return sum(int(t.numel()) for t in value) if value else None
    return int(value.numel())


def _first(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return value[0] if value else None
    return value


def _splits(t: Any, sizes: Any, group_size: int | None) -> list[int] | None:
    """all_to_all_single split sizes (rows of dim 0) as element counts."""
    numel = int(t.numel())
    if sizes is None or len(sizes) == 0:
        if not group_size or numel % group_size:
            return None
        return [numel // group_size] * group_size
    rows = int(t.shape[0]) if t.dim() > 0 else 0
    per_row = numel // rows if rows else 0
    return [int(n) * per_row for n in sizes]


def _code(text: Any) -> str | None:
    if not text:
        return None
    return _CODE.sub("_", str(text))[:64] or None


class Recorder:
    """Wraps collectives and times phases for one rank."""

    GROUPS_EVERY_S = 60.0  # resend process groups this often (datagrams can be lost)

    def __init__(self, rep: _reporter.Reporter | None = None, window: int = 256) -> None:
        self.rep = rep
        self.entries: deque[dict[str, Any]] = deque(maxlen=window)
        # id(entry) -> (the entry, its state when encoded, its JSON): a step re-encodes
        # only the entries that are new or changed since (report_step's window).
        self._encoded: dict[int, tuple[dict[str, Any], str, str]] = {}
        self.seq: dict[str, int] = {}
        self.p2p_order: dict[str, int] = {}  # pg -> this rank's p2p calls (their `seq`)
        self.p2p_seq: dict[tuple[str, int, str], int] = {}  # (pg, peer, send|recv) -> k
        self.phases: dict[str, float] = {}
        self._step_started = time.monotonic()
        self._originals: dict[str, Callable[..., Any]] = {}
        self._lock = threading.Lock()
        self._dist: Any = None
        self._pending: dict[int, tuple[dict[str, Any], Any]] = {}
        self._next_step: int | None = None  # the step in progress (correlation: step_id)
        self._signatures: dict[str, inspect.Signature | None] = {}
        self._batches = 0
        self._coalescing: dict[str, Any] | None = None  # open coalesced batch
        self._groups_sent: list[dict[str, Any]] | None = None
        self._groups_sent_at = 0.0
        # A rank blocked inside a collective cannot report from its own thread: a watchdog
        # sends the window once a call has been in flight for WATCH_AFTER_S, so the console
        # sees which rank waits at which seq (and which rank never arrived), and again every
        # WATCH_RESEND_S while it stays blocked: the reporter drops a datagram when the
        # agent's queue is full, and one lost window hid where a rank waits.
        self._inflight: tuple[dict[str, Any], float] | None = None
        self._watched: tuple[int, float] | None = None  # (entry id, when last sent)
        self._stop = threading.Event()
        self._watchdog: threading.Thread | None = None

    @property
    def reporter(self) -> _reporter.Reporter:
        return self.rep or _reporter.get()

    def _pg_of(self, group: Any) -> str:
        dist = self._dist
        if group is None or (dist is not None and group is getattr(dist.group, "WORLD", None)):
            return "default"
        name = getattr(group, "group_name", None)
        return str(name or f"pg-{id(group):x}")[:64]

    def _pg_name(self, kwargs: dict[str, Any]) -> str:
        return self._pg_of(kwargs.get("group"))

    def _bind(
        self, op: str, original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> dict[str, Any]:
        if op not in self._signatures:
            try:
                self._signatures[op] = inspect.signature(original)
            except (TypeError, ValueError):
                self._signatures[op] = None
        sig = self._signatures[op]
        if sig is None:
            return dict(kwargs)
        try:
            bound = sig.bind_partial(*args, **kwargs)
        except TypeError:
            return dict(kwargs)
        return dict(bound.arguments)

    def _group_size(self, group: Any) -> int | None:
        try:
            return int(self._dist.get_world_size(group)) if self._dist is not None else None
        except Exception:  # noqa: BLE001 -- a size we cannot read is one we do not send
            return None

    def _peer(self, op: str, bound: dict[str, Any]) -> int | None:
        key = _P2P[op]
        peer = bound.get(key)
        if peer is None and bound.get(f"group_{key}") is not None and self._dist is not None:
            with contextlib.suppress(Exception):
                peer = self._dist.get_global_rank(bound.get("group"), bound[f"group_{key}"])
        return None if peer is None else int(peer)

    def _describe(self, torch: Any, op: str, bound: dict[str, Any]) -> dict[str, Any]:
        """numel/dtype in and out, splits and peer of one call, from its bound arguments."""
        out: dict[str, Any] = {}
        names = _TENSORS.get(op)
        if names is None:
            t = _first_tensor(torch, (), bound)
            if t is not None:
                out.update(numel=int(t.numel()), dtype=_dtype(t))
            return out
        src, dst = (bound.get(n) if n else None for n in names)
        if _first(src) is not None:
            out.update(numel=_numel(src), dtype=_dtype(_first(src)))
        if _first(dst) is not None and names[0] != names[1]:
            out.update(out_numel=_numel(dst), out_dtype=_dtype(_first(dst)))
            if "numel" not in out:  # recv: its buffer is what it expects
                out.update(numel=out.pop("out_numel"), dtype=out.pop("out_dtype"))
        elif _first(dst) is not None and "numel" in out:
            out["out_numel"] = out["numel"]
        if op == "all_to_all_single" and src is not None and dst is not None:
            size = self._group_size(bound.get("group"))
            ins = _splits(src, bound.get("input_split_sizes"), size)
            outs = _splits(dst, bound.get("output_split_sizes"), size)
            if ins is not None and outs is not None:
                out.update(in_splits=ins, out_splits=outs)
        elif op == "all_to_all" and src and dst:
            out.update(
                in_splits=[int(t.numel()) for t in src], out_splits=[int(t.numel()) for t in dst]
            )
        if op in _P2P:
            peer = self._peer(op, bound)
            if peer is not None:
                out["peer"] = peer
        return out

    def _entry(self, op: str, group: Any, fields: dict[str, Any]) -> dict[str, Any]:
        """Number and append one entry (caller holds the lock)."""
        pg = self._pg_of(group)
        entry: dict[str, Any] = {
            "seq": 0,
            "pg": pg,
            "op": op,
            "state": "started",
            "started_ts": iso_ts(),
            **fields,
        }
        if op in _P2P:
            self.p2p_order[pg] = self.p2p_order.get(pg, 0) + 1
            entry["seq"] = self.p2p_order[pg]
            if "peer" in fields:
                key = (pg, fields["peer"], "send" if op in ("send", "isend") else "recv")
                self.p2p_seq[key] = self.p2p_seq.get(key, 0) + 1
                entry["p2p_seq"] = self.p2p_seq[key]
        else:
            batch = self._coalescing
            if batch is not None and pg in batch["seq"]:
                entry["seq"] = batch["seq"][pg]  # members of one batch share its seq
            else:
                self.seq[pg] = self.seq.get(pg, 0) + 1
                entry["seq"] = self.seq[pg]
                if batch is not None:
                    batch["seq"][pg] = entry["seq"]
        if self._next_step is not None:
            gen = self.reporter.generation
            entry["step_id"] = step_id(gen, self._next_step)
        if self._coalescing is not None:
            entry["coalesced"] = self._coalescing["id"]
            self._coalescing["entries"].append(entry)
        self.entries.append(entry)
        return entry

    def _wrap(self, torch: Any, op: str, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            entry: dict[str, Any] | None = None
            try:
                bound = self._bind(op, original, args, kwargs)
                fields = self._describe(torch, op, bound)
                with self._lock:
                    entry = self._entry(op, bound.get("group"), fields)
            except Exception:  # noqa: BLE001, S110 -- instrumentation never breaks training
                pass
            began = time.monotonic()
            if entry is not None:
                self._inflight = (entry, began)
            try:
                result = original(*args, **kwargs)
            finally:
                self._inflight = None
            if entry is None or entry.get("coalesced") is not None:
                return result  # a coalesced member completes with its batch
            if kwargs.get("async_op") and result is not None and hasattr(result, "is_completed"):
                # The Work handle is a C++ object we must not replace; ask it at report time.
                with self._lock:
                    self._pending[id(entry)] = (entry, result)
            else:
                entry["state"] = "completed"
                self._add_phase("collective", (time.monotonic() - began) * 1000.0)
            return result

        return wrapper

    def _wrap_batch(self, torch: Any, original: Callable[..., Any]) -> Callable[..., Any]:
        """batch_isend_irecv: one coalesced batch of sends and recvs, each recorded."""

        @functools.wraps(original)
        def wrapper(p2p_op_list: Any, *args: Any, **kwargs: Any) -> Any:
            entries: list[dict[str, Any]] = []
            try:
                with self._lock:
                    self._batches += 1
                    batch = self._batches
                    for p2p in p2p_op_list:
                        op = getattr(p2p.op, "__name__", "isend")
                        op = op if op in _P2P else "isend"
                        key = _P2P[op]
                        bound = {"tensor": p2p.tensor, "group": p2p.group, key: p2p.peer}
                        fields = self._describe(torch, "send" if key == "dst" else "recv", bound)
                        fields["coalesced"] = batch
                        entries.append(self._entry(op, p2p.group, fields))
            except Exception:  # noqa: BLE001, S110 -- instrumentation never breaks training
                pass
            if entries:
                self._inflight = (entries[0], time.monotonic())
            try:
                works = original(p2p_op_list, *args, **kwargs)
            finally:
                self._inflight = None
            with self._lock:
                for entry, work in zip(entries, works or (), strict=False):
                    self._pending[id(entry)] = (entry, work)
            return works

        return wrapper

    def _wrap_coalescing(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """_coalescing_manager: collectives inside share one seq per pg and a batch id."""

        @contextlib.contextmanager
        def manager(*args: Any, **kwargs: Any) -> Iterator[Any]:
            with self._lock:
                self._batches += 1
                outer = self._coalescing
                batch: dict[str, Any] = {"id": self._batches, "seq": {}, "entries": []}
                self._coalescing = batch
            try:
                with original(*args, **kwargs) as cm:
                    yield cm
            finally:
                with self._lock:
                    self._coalescing = outer
            works = list(getattr(cm, "works", None) or ())
            with self._lock:
                for entry in batch["entries"]:
                    if works:
                        self._pending[id(entry)] = (entry, works[-1])
                    else:
                        entry["state"] = "completed"

        return manager

    # -- process groups ----------------------------------------------------------------
    def process_groups(self) -> list[dict[str, Any]]:
        """The process groups this rank belongs to: default (the world) first, then by name."""
        dist = self._dist
        if dist is None:
            return []
        out: list[dict[str, Any]] = []
        try:
            world = dist.group.WORLD
            out.append(
                {
                    "pg": "default",
                    "size": int(dist.get_world_size()),
                    "backend": _code(dist.get_backend()),
                }
            )
            c10d = dist.distributed_c10d
            for pg, name in sorted(c10d._world.pg_names.items(), key=lambda kv: str(kv[1])):
                if pg is world:
                    continue
                ranks = [int(r) for r in dist.get_process_group_ranks(pg)]
                info = {
                    "pg": str(name)[:64],
                    "size": len(ranks),
                    "ranks": ranks,
                    "desc": _code(getattr(pg, "group_desc", None)),
                }
                with contextlib.suppress(Exception):
                    info["backend"] = _code(dist.get_backend(pg))
                out.append({k: v for k, v in info.items() if v is not None})
        except Exception:  # noqa: BLE001, S110 -- private torch state moved: send what we have
            pass
        return [{k: v for k, v in g.items() if v is not None} for g in out]

    def _send_groups(self, *, force: bool = False) -> None:
        groups = self.process_groups()
        if not groups:
            return
        now = time.monotonic()
        fresh = now - self._groups_sent_at < self.GROUPS_EVERY_S
        if not force and groups == self._groups_sent and fresh:
            return
        send = getattr(self.reporter, "process_groups", None)
        if send is None:
            return
        if send(groups) is False:
            return  # dropped (the agent's buffer was full): tried again on the next step
        self._groups_sent, self._groups_sent_at = groups, now

    WATCH_AFTER_S = 2.0
    WATCH_RESEND_S = 5.0  # one agent send interval: what the console may wait for a window

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            current = self._inflight
            if current is None:
                continue
            entry, began = current
            now = time.monotonic()
            if now - began < self.WATCH_AFTER_S:
                continue
            watched = self._watched
            if watched and watched[0] == id(entry) and now - watched[1] < self.WATCH_RESEND_S:
                continue
            self._watched = (id(entry), now)
            try:
                with self._lock:
                    window = [dict(e) for e in self.entries]
                self.reporter.collective(window)
            except Exception:  # noqa: BLE001, S112 -- instrumentation never breaks training
                continue
            with contextlib.suppress(Exception):
                self._send_groups(force=True)  # a hang is when membership matters most

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
        # isend/irecv stay unwrapped: P2POp accepts only the originals. Their batches are
        # recorded here; a bare isend/irecv is not.
        batch = getattr(dist, "batch_isend_irecv", None)
        if batch is not None and "batch_isend_irecv" not in self._originals:
            self._originals["batch_isend_irecv"] = batch
            dist.batch_isend_irecv = self._wrap_batch(torch, batch)
        manager = getattr(dist, "_coalescing_manager", None)
        if manager is not None and "_coalescing_manager" not in self._originals:
            self._originals["_coalescing_manager"] = manager
            dist._coalescing_manager = self._wrap_coalescing(manager)
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
        model_flops: float | None = None,
        hw_flops: float | None = None,
        lr: float | None = None,
    ) -> None:
        """Send the step (duration since the previous one, phases) and the collective window.
        `model_flops`/`hw_flops`: the step's FLOPs on this rank (agents.flops), for MFU/HFU."""
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
                model_flops=model_flops,
                hw_flops=hw_flops,
                lr=_number(lr),
            )
            with self._lock:
                for key, (entry, work) in list(self._pending.items()):
                    with contextlib.suppress(Exception):
                        if work.is_completed():
                            entry["state"] = "completed"
                            del self._pending[key]
                    if entry not in self.entries:
                        self._pending.pop(key, None)  # fell out of the window
                fragments = self._fragments()
            if fragments:
                self._send_groups()
                self.reporter.collective_encoded(fragments)
        except Exception:  # noqa: BLE001, S110 -- instrumentation never breaks training
            pass

    def _fragments(self) -> list[str]:
        """The window's entries as JSON, re-encoding only new ones and those whose state
        moved (an entry changes nothing else after it is appended; caller holds the lock).
        The cache holds the entry itself, so its id cannot be reused while cached."""
        cache, out = self._encoded, []
        fresh: dict[int, tuple[dict[str, Any], str, str]] = {}
        for e in self.entries:
            hit = cache.get(id(e))
            if hit is None or hit[0] is not e or hit[1] != e["state"]:
                hit = (e, e["state"], _reporter.encode(e))
            fresh[id(e)] = hit
            out.append(hit[2])
        self._encoded = fresh
        return out


def _number(value: Any) -> float | None:
    if value is None:
        return None
    if hasattr(value, "item"):
        value = value.item()  # a 0-dim tensor: one sync, once per step
    return float(value)


_recorder: Recorder | None = None


def install(rep: _reporter.Reporter | None = None, window: int = 256) -> Recorder:
    """Wrap torch.distributed collectives for this process (idempotent). It is also the one
    line of zero glue: with no reporter configured yet (and none passed), it configures the
    module reporter from what the launcher told the process (`reporter.auto`: group,
    generation, rank from torchrun or Slurm; docs/integrations.md)."""
    global _recorder
    if _recorder is None:
        if rep is None:
            _reporter.auto()
        _recorder = Recorder(rep, window).install()
    return _recorder


def phase(name: str) -> contextlib.AbstractContextManager[None]:
    return install().phase(name)


def report_step(step: int, **kwargs: Any) -> None:
    install().report_step(step, **kwargs)
