"""`python -m agents.launch`: an unmodified script, reported from its launcher's environment.

Each test runs a real child process with the environment torchrun (or srun) gives a
worker, and a real listener standing in for the node agent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from agents.launch import after_import
from agents.listener import Listener

from .conftest import validate

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, os, sys
print(json.dumps({"name": __name__, "argv": sys.argv, "path0": sys.path[0]}))
if os.environ.get("BOOM"):
    raise ValueError("rank found a malformed batch at /home/alice/data/7.bin")
if os.environ.get("EXIT"):
    raise SystemExit(int(os.environ["EXIT"]))
"""


def _worker_env(lis: Listener, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_"))}
    return {
        **env,
        "PYTHONPATH": str(ROOT),
        "FAULTLINE_REPORTER_SOCKET": lis.socket_path,
        "TORCHELASTIC_RUN_ID": "job-42",
        "TORCHELASTIC_RESTART_COUNT": "1",
        "TORCHELASTIC_MAX_RESTARTS": "3",
        "RANK": "0",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "0",
        **extra,
    }


def _run(short_dir: Path, args: list[str], **extra: str) -> tuple[Any, list[dict[str, Any]]]:
    got: list[dict[str, Any]] = []
    lis = Listener(got.append, socket_path=short_dir / "r.sock")
    lis.start()
    script = short_dir / "work" / "train.py"
    script.parent.mkdir(exist_ok=True)
    script.write_text(SCRIPT)
    argv = [a.replace("{script}", str(script)) for a in args]
    proc = subprocess.run(
        [sys.executable, "-m", "agents.launch", *argv],
        cwd=short_dir,
        env=_worker_env(lis, **extra),
        capture_output=True,
        text=True,
        timeout=120,
    )
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not got:
        time.sleep(0.02)
    time.sleep(0.2)
    lis.stop()
    validate(got)
    return proc, got


def test_it_runs_the_script_as_python_would(short_dir: Path) -> None:
    proc, _ = _run(short_dir, ["{script}", "--lr", "3e-4"])
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.splitlines()[0])
    script = str(short_dir / "work" / "train.py")
    assert seen == {"name": "__main__", "argv": [script, "--lr", "3e-4"],
                    "path0": str(short_dir / "work")}  # fmt: skip


def test_it_reports_the_generation_from_the_launchers_environment(short_dir: Path) -> None:
    proc, got = _run(short_dir, ["{script}"])
    assert proc.returncode == 0, proc.stderr
    (running,) = [r for r in got if r["kind"] == "transition"]
    assert (running["group"], running["generation"], running["world_size"]) == ("job-42", 1, 4)
    assert (running["from_state"], running["reason"]) == ("recovering", "restart")
    events = [(r["event"], r.get("reason")) for r in got if r["kind"] == "process"]
    assert events == [("started", None), ("exited", "clean")]


def test_only_rank_zero_announces_the_generation(short_dir: Path) -> None:
    proc, got = _run(short_dir, ["{script}"], RANK="3", LOCAL_RANK="3")
    assert proc.returncode == 0, proc.stderr
    assert [r for r in got if r["kind"] == "transition"] == []
    assert {r["rank"] for r in got} == {3}


def test_it_records_an_uncaught_exception_as_record_would(short_dir: Path) -> None:
    error_file = short_dir / "attempt_1" / "0" / "error.json"
    proc, got = _run(short_dir, ["{script}"], BOOM="1", TORCHELASTIC_ERROR_FILE=str(error_file))
    assert proc.returncode == 1 and "ValueError" in proc.stderr
    data = json.loads(error_file.read_text())
    assert data["message"]["message"].startswith("ValueError: rank found a malformed batch")
    assert int(data["message"]["extraInfo"]["timestamp"]) > 0
    (exited,) = [r for r in got if r.get("event") == "exited"]
    assert (exited["reason"], exited["error_type"]) == ("exception", "ValueError")
    assert "alice" not in exited["message"]  # scrubbed before it left the process


def test_it_reports_the_code_of_a_raised_system_exit(short_dir: Path) -> None:
    proc, got = _run(short_dir, ["{script}"], EXIT="3")
    assert proc.returncode == 3
    exited = [(r["exit_code"], r["reason"]) for r in got if r.get("event") == "exited"]
    assert exited == [(3, "exit_code")]


def test_it_leaves_exits_to_faultlines_launcher(short_dir: Path) -> None:
    error_file = short_dir / "error.json"
    proc, got = _run(short_dir, ["{script}"], BOOM="1", TORCHELASTIC_ERROR_FILE=str(error_file),
                     FAULTLINE_LAUNCHER="torchelastic")  # fmt: skip
    assert proc.returncode == 1
    assert [(r["kind"], r.get("event")) for r in got] == [("process", "started")]
    assert error_file.exists()  # what the launcher reads instead


def test_it_runs_a_module_with_dash_m(short_dir: Path) -> None:
    pkg = short_dir / "work" / "mypkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text(SCRIPT)
    proc, _ = _run(short_dir / "work", ["-m", "mypkg.train", "x"], PYTHONPATH=f"{ROOT}")
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.splitlines()[0])
    assert seen["name"] == "__main__" and seen["argv"][1:] == ["x"]
    assert seen["argv"][0].endswith("train.py")


def test_it_says_how_to_call_it_without_a_script() -> None:
    proc = subprocess.run([sys.executable, "-m", "agents.launch"], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert proc.returncode != 0 and "usage: python -m agents.launch" in proc.stderr


def test_it_calls_back_once_a_module_has_run_and_at_once_if_it_had(tmp_path: Path) -> None:
    (tmp_path / "fl_fake_framework.py").write_text("READY = True\n")
    seen: list[bool] = []
    sys.path.insert(0, str(tmp_path))
    try:
        after_import("fl_fake_framework", lambda m: seen.append(m.READY))
        assert seen == []
        import fl_fake_framework  # noqa: F401

        assert seen == [True]
        after_import("fl_fake_framework", lambda m: seen.append(m.READY))
        assert seen == [True, True]
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("fl_fake_framework", None)


@pytest.mark.torch
@pytest.mark.slow
def test_it_wraps_the_collectives_of_a_script_that_imports_torch(short_dir: Path) -> None:
    pytest.importorskip("torch")
    script = short_dir / "t.py"
    script.write_text(
        textwrap.dedent("""
        import torch.distributed as dist
        print(dist.all_reduce.__code__.co_filename.endswith("agents/torch.py"))
    """)
    )
    proc = subprocess.run([sys.executable, "-m", "agents.launch", str(script)], cwd=short_dir,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert proc.stdout.strip() == "True", proc.stderr
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                           timeout=120)  # fmt: skip
    assert plain.stdout.strip() == "False"


def test_fl_torch_install_is_the_one_line_alternative(short_dir: Path) -> None:
    got: list[dict[str, Any]] = []
    lis = Listener(got.append, socket_path=short_dir / "r.sock")
    lis.start()
    # agents.torch imports torch only in Recorder.install: stub it, the reporter part is ours.
    code = textwrap.dedent("""
        from agents import torch as fl_torch
        fl_torch.Recorder.install = lambda self: self
        fl_torch.install()
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_worker_env(lis),
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    time.sleep(0.3)
    lis.stop()
    assert proc.returncode == 0, proc.stderr
    validate(got)
    assert [(r["kind"], r.get("to_state") or r.get("event")) for r in got] == [
        ("process", "started"), ("transition", "running"), ("process", "exited"),
    ]  # fmt: skip
    assert {r["group"] for r in got} == {"job-42"}
