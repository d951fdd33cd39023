"""TorchElastic (torchrun): the launcher's view of its workers, reported to Faultline.

Owns TorchElastic's error files (the JSON `@record` writes to `TORCHELASTIC_ERROR_FILE`:
torch.distributed.elastic.multiprocessing.errors.ErrorHandler): reading one, and writing
one for an uncaught exception as `@record` would (agents.launch does, so torchrun's own
report names the exception of a script that never decorated its main). And the launcher
side of `python -m agents.torchrun`: per generation the group's transitions (running,
recovering, failed, completed, stopped), every worker failure the elastic agent reaps
(global rank, exit code or signal, the error file's exception type, message and time) and
which of them torchrun itself names "Root Cause (first observed failure)".

torch is imported only by `elastic_agent_class` (called by agents.torchrun). Everything
else is plain Python over plain values, tested without torch. It must never raise into
torchrun: a telemetry fault must not take the launcher down.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agents import launcher_env
from agents.reporter import Reporter, classify_error_name

ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"
MAX_ERROR_FILE_BYTES = 1024 * 1024  # a traceback, not a log: read no more than this
NOT_AVAILABLE = "<N/A>"  # TorchElastic's error_file of a failure that wrote none
# "ValueError: boom", "torch.OutOfMemoryError: CUDA out of memory": a type, then its text.
_TYPED = re.compile(r"^(?P<type>[A-Za-z_][\w.]*): ?(?P<text>.*)$", re.DOTALL)


@dataclass(frozen=True, slots=True)
class ErrorFile:
    """What a TorchElastic error file says about one failure."""

    error_type: str | None = None
    message: str | None = None
    timestamp: int | None = None  # TorchElastic's own stamp: whole seconds, what it orders by


def _split_typed(text: str) -> tuple[str | None, str]:
    m = _TYPED.match(text.strip())
    if m is None:
        return None, text.strip()
    return m.group("type"), m.group("text").strip()


def parse_error_file(data: Any) -> ErrorFile:
    """An error file's JSON in either of the formats ProcessFailure reads: `message` an
    object {message, extraInfo {py_callstack, timestamp}} (what `@record` writes), or a
    string with `timestamp` beside it. Anything else gives an empty ErrorFile."""
    if not isinstance(data, dict):
        return ErrorFile()
    raw = data.get("message")
    stamp: Any = data.get("timestamp")
    callstack = ""
    if isinstance(raw, dict):
        extra = raw.get("extraInfo")
        extra = extra if isinstance(extra, dict) else {}
        stamp = extra.get("timestamp")
        callstack = str(extra.get("py_callstack") or "")
        raw = raw.get("message")
    text = raw if isinstance(raw, str) else ""
    error_type, message = _split_typed(text) if text else (None, "")
    # The traceback's last line names the type with its module (torch.OutOfMemoryError),
    # where the message has only the class name.
    last = next((ln for ln in reversed(callstack.splitlines()) if ln.strip()), "")
    qualified, _ = _split_typed(last) if last and not last.startswith(" ") else (None, "")
    if qualified and error_type and qualified.rsplit(".", 1)[-1] == error_type:
        error_type = qualified
    try:
        timestamp = int(stamp) if stamp is not None else None
    except (TypeError, ValueError):
        timestamp = None
    return ErrorFile(error_type=error_type, message=message or None, timestamp=timestamp)


def read_error_file(path: str | None) -> tuple[ErrorFile, float] | None:
    """(parsed, the file's mtime) of the error file at `path`; None when there is none.

    The mtime says when the worker wrote it, to the microsecond: TorchElastic's own stamp
    is whole seconds."""
    if not path or path == NOT_AVAILABLE:
        return None
    try:
        with open(path, "rb") as fh:
            written = os.fstat(fh.fileno()).st_mtime
            data = json.loads(fh.read(MAX_ERROR_FILE_BYTES))
    except (OSError, ValueError):
        return None
    return parse_error_file(data), written


def error_file_data(exc: BaseException) -> dict[str, Any]:
    """The JSON `@record` writes for `exc` (ErrorHandler.record_exception's format)."""
    return {
        "message": {
            "message": f"{type(exc).__name__}: {exc}",
            "extraInfo": {
                "py_callstack": "".join(traceback.format_exception(exc)),
                "timestamp": str(int(time.time())),
            },
        }
    }


def record_exception(exc: BaseException, path: str | None = None) -> bool:
    """Write `exc` to this worker's TorchElastic error file, as `@record` does, unless the
    program's own `@record` wrote it already. False when there is no error file to write."""
    path = path or os.environ.get(ERROR_FILE_ENV)
    if not path or os.path.exists(path):
        return False
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as fh:
            json.dump(error_file_data(exc), fh)
    except OSError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class Failure:
    """One worker failure as the elastic agent reaped it (its ProcessFailure, plain)."""

    rank: int  # global rank
    pid: int
    exitcode: int  # negative: killed by that signal
    timestamp: int  # TorchElastic's: the error file's, else when it was reaped (whole s)
    error_file: str | None
    seen_at: float  # when the launcher saw it (epoch s)
    # Killed by the agent's own teardown after another worker failed (TorchElastic lists
    # those too, "for bookkeeping"): a symptom, stamped after the failures it followed.
    teardown: bool = False


def first_failure(failures: Mapping[int, Failure]) -> int:
    """The rank torchrun prints as "Root Cause (first observed failure)": its
    ChildFailedError.get_first_failure, the smallest TorchElastic timestamp, a tie going
    to the first in the agent's order. Whole seconds: within one second, the agent's order
    (local rank) decides, not which failed first."""
    return min(failures, key=lambda r: failures[r].timestamp)


def exit_fields(failure: Failure) -> dict[str, Any]:
    """The `process` record of one failure: exit code or signal, and from its error file
    the exception's type, message and the time it was written (else when it was reaped)."""
    found = read_error_file(failure.error_file)
    error, written = found if found is not None else (None, None)
    fields: dict[str, Any] = {"pid": failure.pid, "at": written or failure.seen_at}
    if failure.exitcode < 0:
        sig = -failure.exitcode
        fields.update(sig=sig, exit_code=128 + sig, reason="killed")
    else:
        fields.update(exit_code=failure.exitcode, reason="exit_code")
    if error is not None and error.error_type:
        fields.update(reason=classify_error_name(error.error_type), error_name=error.error_type)
    if error is not None and error.message:
        fields["message"] = error.message
    return fields


class LauncherReport:
    """What one torchrun agent reports for its worker group, generation by generation.

    Generation, group and job follow agents.launcher_env from the environment the workers
    get (TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT; Slurm's job and requeue count),
    so the launcher's records and its workers' always agree. Every node's agent reports
    its own workers' exits; only the rendezvous' node 0 (`lead`, set after each rendezvous)
    sends the group's transitions, once per group as rank 0 would."""

    def __init__(
        self,
        *,
        run_id: str,
        max_restarts: int,
        env: Mapping[str, str] | None = None,
        reporter: Reporter | None = None,
    ) -> None:
        self.env = dict(os.environ if env is None else env)
        self.run_id, self.max_restarts = run_id, max_restarts
        self.group = self.facts(0).group
        self.rep = reporter or Reporter(group=self.group, rank=0)
        self.started_once = False
        self.last_restart_count: int | None = None
        self.lead = True  # this agent is the rendezvous' node 0 (group rank 0)
        if self.group is None:
            print(
                "faultline: torchrun has no run id (--rdzv-id) and this is no Slurm job: "
                "set FAULTLINE_GROUP or --rdzv-id to report this job to Faultline",
                file=sys.stderr,
            )

    def facts(self, restart_count: int) -> launcher_env.LaunchFacts:
        return launcher_env.from_environ(
            {
                **self.env,
                "TORCHELASTIC_RUN_ID": self.run_id,
                "TORCHELASTIC_RESTART_COUNT": str(restart_count),
                "TORCHELASTIC_MAX_RESTARTS": str(self.max_restarts),
            }
        )

    def generation(self, restart_count: int) -> int:
        return self.facts(restart_count).generation or 0

    def _transition(self, to_state: str, **fields: Any) -> None:
        if self.lead:
            self.rep.transition(to_state, **fields)

    def started(self, *, restart_count: int, world_size: int | None) -> None:
        """The workers of a generation started (after the rendezvous)."""
        if self.group is None:
            return
        if not self.started_once:
            from_state, reason = "initializing", "launch"
        elif restart_count == self.last_restart_count:
            # TorchElastic restarts the workers for new nodes without counting a restart.
            from_state, reason = "running", "membership_change"
        else:
            from_state, reason = "recovering", "restart"
        self.started_once, self.last_restart_count = True, restart_count
        self._transition(
            "running",
            from_state=from_state,
            reason=reason,
            restart_count=self.generation(restart_count),
            world_size=world_size,
            generation=self.generation(restart_count),
        )

    def failed(
        self, failures: Mapping[int, Failure], *, restart_count: int, will_restart: bool
    ) -> None:
        """Workers failed: one exit per failure (the one torchrun names marked), then the
        group recovers (another attempt is left) or has failed."""
        if self.group is None or not failures:
            return
        generation = self.generation(restart_count)
        root = first_failure(failures)
        for rank in sorted(failures):
            self.rep.process(
                "exited",
                rank=rank,
                generation=generation,
                launcher_root_cause=launcher_env.TORCHELASTIC if rank == root else None,
                **exit_fields(failures[rank]),
            )
        self._transition(
            "recovering" if will_restart else "failed",
            from_state="running",
            reason="worker_failed",
            restart_count=generation,
            generation=generation,
        )

    def finished(self, *, restart_count: int) -> None:
        if self.group is not None:
            generation = self.generation(restart_count)
            self._transition(
                "completed", from_state="running", reason="succeeded", generation=generation
            )

    def stopped(self, *, restart_count: int, signal_name: str) -> None:
        """torchrun itself was told to stop (SIGTERM from the scheduler, Ctrl-C)."""
        if self.group is not None:
            generation = self.generation(restart_count)
            reason = re.sub(r"[^A-Za-z0-9_.:\-]", "_", signal_name)[:64] or "signal"
            self._transition("stopped", from_state="running", reason=reason, generation=generation)


def _quietly(fn: Callable[[], None]) -> None:
    with contextlib.suppress(Exception):  # never raise into torchrun
        fn()


def elastic_agent_class(base: type[Any]) -> type[Any]:
    """`base` (TorchElastic's LocalElasticAgent) reporting to Faultline: after each start
    of its workers and each poll that finds them failed or finished. Overrides the agent's
    `_initialize_workers`, `_monitor_workers` and `run`, calling through first; their
    results and torchrun's decisions are unchanged."""

    class FaultlineElasticAgent(base):  # type: ignore[misc]  # torch's class, known at run time
        _faultline_report: LauncherReport | None = None

        def _faultline(self) -> LauncherReport:
            if self._faultline_report is None:
                spec = self._worker_group.spec
                self._faultline_report = LauncherReport(
                    run_id=str(spec.rdzv_handler.get_run_id()), max_restarts=spec.max_restarts
                )
            return self._faultline_report

        def _faultline_restarts(self) -> int:
            return int(self._worker_group.spec.max_restarts - self._remaining_restarts)

        def _initialize_workers(self, worker_group: Any) -> None:
            super()._initialize_workers(worker_group)
            world = worker_group.workers[0].world_size if worker_group.workers else None

            def started() -> None:
                report = self._faultline()
                report.lead = getattr(worker_group, "group_rank", 0) in (0, None)
                report.started(restart_count=self._faultline_restarts(), world_size=world)

            _quietly(started)

        def _monitor_workers(self, worker_group: Any) -> Any:
            # The workers that failed before the agent tore the rest down: its process
            # context closes (SIGTERM) the others, then lists them as failures as well.
            before: dict[int, float] = {}
            context = getattr(self, "_pcontext", None)
            close = getattr(context, "close", None)
            if context is not None and callable(close):

                def close_noting_failures(*args: Any, **kwargs: Any) -> Any:
                    _quietly(
                        lambda: before.update(
                            dict.fromkeys(getattr(context, "_failures", None) or {}, time.time())
                        )
                    )
                    return close(*args, **kwargs)

                context.close = close_noting_failures
            try:
                result = super()._monitor_workers(worker_group)
            finally:
                if context is not None and callable(close):
                    with contextlib.suppress(AttributeError):
                        del context.close
            _quietly(lambda: self._faultline_observe(result, worker_group, before))
            return result

        def _faultline_observe(
            self, result: Any, worker_group: Any, before: dict[int, float]
        ) -> None:
            state = getattr(result.state, "name", str(result.state))
            restarts = self._faultline_restarts()
            if state == "FAILED" and result.failures:
                seen = time.time()
                local = {w.global_rank: w.local_rank for w in worker_group.workers}
                failures = {
                    int(rank): Failure(
                        rank=int(rank),
                        pid=int(f.pid),
                        exitcode=int(f.exitcode),
                        timestamp=int(f.timestamp),
                        error_file=None if f.error_file == NOT_AVAILABLE else f.error_file,
                        seen_at=before.get(local.get(rank, -1), seen),
                        teardown=bool(before) and local.get(rank, -1) not in before,
                    )
                    for rank, f in result.failures.items()
                }
                # _invoke_run restarts exactly when attempts are left (and then counts one).
                self._faultline().failed(
                    failures, restart_count=restarts, will_restart=self._remaining_restarts > 0
                )
            elif state == "SUCCEEDED":
                self._faultline().finished(restart_count=restarts)

        def run(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return super().run(*args, **kwargs)
            except Exception as exc:
                if type(exc).__name__ == "SignalException":
                    name = str(getattr(getattr(exc, "sigval", None), "name", "") or "signal")
                    _quietly(
                        lambda: self._faultline().stopped(
                            restart_count=self._faultline_restarts(), signal_name=name
                        )
                    )
                raise

    FaultlineElasticAgent.__qualname__ = FaultlineElasticAgent.__name__
    return FaultlineElasticAgent
