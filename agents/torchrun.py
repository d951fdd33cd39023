"""`python -m agents.torchrun ...`: torchrun, reporting to Faultline. The zero-glue line.

Owns starting TorchElastic's own launcher (torch.distributed.run, every flag as torchrun
takes it) with two changes: its elastic agent reports each generation's transitions and
every worker failure it reaps (agents.integrations.torchelastic), and each Python worker
runs through agents.launch, so an unmodified script reports steps' collectives, its start
and, on an uncaught exception, TorchElastic's error file. Workers leave their exits to
this launcher (FAULTLINE_LAUNCHER): a rank killed by SIGKILL cannot report itself, and one
exit told once keeps its timestamp. `--no-python` workers run as given (the launcher still
reports their failures). torch is imported in `main`, never at import.

    python -m agents.torchrun --nproc-per-node 8 --max-restarts 3 train.py --lr 3e-4
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

from agents import launcher_env

LAUNCH_MODULE = "agents.launch"


def worker_command(args: Any, cmd: Any, cmd_args: list[str]) -> tuple[Any, list[str]]:
    """torchrun's worker command (`config_from_args`'s cmd, cmd_args) through agents.launch:
    `python -u [-m] train.py ...` -> `python -u -m agents.launch [-m] train.py ...`, and
    `--run-path`'s entrypoint -> agents.launch.run_script_path. Anything else as it was."""
    if getattr(args, "run_path", False):
        from agents.launch import run_script_path

        return run_script_path, cmd_args
    if getattr(args, "no_python", False) or not isinstance(cmd, str):
        return cmd, cmd_args
    head = 1 if cmd_args[:1] == ["-u"] else 0
    return cmd, [*cmd_args[:head], "-m", LAUNCH_MODULE, *cmd_args[head:]]


def main(argv: Sequence[str] | None = None) -> None:
    from torch.distributed import run as torchrun
    from torch.distributed.launcher import api

    from agents.integrations import torchelastic

    api.LocalElasticAgent = torchelastic.elastic_agent_class(api.LocalElasticAgent)  # type: ignore[misc, unused-ignore]  # launch_agent reads the module's name (unused without torch: then Any)
    config_from_args = torchrun.config_from_args

    def through_launch(args: Any) -> Any:
        config, cmd, cmd_args = config_from_args(args)
        cmd, cmd_args = worker_command(args, cmd, list(cmd_args))
        return config, cmd, cmd_args

    torchrun.config_from_args = through_launch
    # The workers inherit it: their exits are this launcher's to report.
    os.environ[launcher_env.LAUNCHER_REPORTS] = launcher_env.TORCHELASTIC
    torchrun.main(list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
