"""`python -m agents.launch train.py ...`: run an unmodified training script with Faultline.

Owns the worker side of zero glue (DESIGN.md §7): before the script runs, the reporter is
configured from what the launcher told the process (agents.launcher_env: torchrun's run
id, restart count and ranks, or Slurm's job, requeue count and task ids), its process hooks
installed and, on rank 0, the generation's `running` transition sent (unless Faultline's
launcher wrapper sends it: agents.torchrun). When the script imports torch, its
collectives are wrapped (agents.torch); when it imports torchft, its Manager reports
quorums and committed steps (agents.integrations.torchft). An uncaught exception is written
to TorchElastic's error file as `@record` would. The script then runs as `python train.py`
would run it: `__main__`, its own directory first on sys.path, its argv.

    srun python -m agents.launch train.py --lr 3e-4              # Slurm, no torchrun
    torchrun --nproc-per-node 8 -m agents.launch train.py        # workers only
    python -m agents.torchrun --nproc-per-node 8 train.py        # launcher too (preferred)

It must not import torch or torchft itself: only the script's own import of them does.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import runpy
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from agents import reporter

USAGE = "usage: python -m agents.launch (script.py | -m module) [args ...]"


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls `callback(module)` once `name` has been imported (its body has run)."""

    def __init__(self, name: str, callback: Callable[[ModuleType], None]) -> None:
        self.name, self.callback = name, callback

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)  # once: and the real finders must find it now
        spec = importlib.util.find_spec(fullname)
        loader = spec.loader if spec is not None else None
        exec_module = getattr(loader, "exec_module", None)
        if spec is None or exec_module is None:
            return spec
        callback = self.callback

        def exec_then_call(module: ModuleType) -> None:
            exec_module(module)
            with contextlib.suppress(Exception):  # instrumentation never breaks the import
                callback(module)

        loader.exec_module = exec_then_call  # type: ignore[method-assign,union-attr]  # this spec's loader only
        return spec


def after_import(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Run `callback` when the program imports `name` (at once if it already has)."""
    module = sys.modules.get(name)
    if module is not None:
        with contextlib.suppress(Exception):
            callback(module)
        return
    sys.meta_path.insert(0, _AfterImport(name, callback))


def _wrap_torch(_: ModuleType) -> None:
    from agents import torch as fl_torch

    fl_torch.install()


def _wrap_torchft(module: ModuleType) -> None:
    import agents.integrations.torchft as fl_torchft

    fl_torchft.install(module)


def prepare() -> reporter.Reporter:
    """The reporter from the launcher's environment, and the framework hooks, armed."""
    rep = reporter.auto()
    after_import("torch", _wrap_torch)
    after_import("torchft.manager", _wrap_torchft)
    return rep


def _record(exc: BaseException) -> None:
    from agents.integrations import torchelastic

    with contextlib.suppress(Exception):
        torchelastic.record_exception(exc)


def run(argv: Sequence[str]) -> None:
    """Run `script.py args` or `-m module args` as `python` would, Faultline armed."""
    args = list(argv)
    if not args or args[0] in ("-h", "--help") or (args[0] == "-m" and len(args) < 2):
        raise SystemExit(USAGE)
    rep = prepare()
    try:
        if args[0] == "-m":
            sys.argv = [args[1], *args[2:]]
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            script = args[0]
            sys.argv = [script, *args[1:]]
            # `python train.py` puts the script's directory first on sys.path, not ours.
            sys.path[0] = os.path.dirname(os.path.abspath(script))
            runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        rep.exiting(exc.code)  # `raise SystemExit(2)` never passed through sys.exit
        raise
    except BaseException as exc:
        _record(exc)  # for torchrun's own report (and ours: agents.torchrun reads it)
        raise


def run_script_path(training_script: str, *training_script_args: str) -> Any:
    """torchrun's `--run-path` entrypoint (torch.distributed.run.run_script_path), armed:
    agents.torchrun starts this one in its place."""
    rep = prepare()
    sys.argv = [training_script, *training_script_args]
    try:
        runpy.run_path(training_script, run_name="__main__")
    except SystemExit as exc:
        rep.exiting(exc.code)
        raise
    except BaseException as exc:
        _record(exc)
        raise


def main() -> None:
    run(sys.argv[1:])


if __name__ == "__main__":
    main()
