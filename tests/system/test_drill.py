"""`faultline drill --quick`: a real gloo job broken on purpose, judged through the REST API."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest

from faultline.drill import markdown, table
from tests.system.conftest import BIN


def real_drill(test):
    """Marks for the tests that run the real quick drill (slow, needs torch)."""
    for mark in (
        pytest.mark.slow,
        pytest.mark.torch,
        pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="no torch"),
    ):
        test = mark(test)
    return test


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    work = tmp_path_factory.mktemp("drill")
    out = work / "drill.json"
    proc = subprocess.run(
        [str(BIN / "faultline"), "drill", "--quick", "--json", str(out),
         "--markdown", str(work / "drill.md"), "--data-dir", str(work / "run")],
        capture_output=True, text=True, timeout=280,
        env={k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")},
    )  # fmt: skip
    artifacts = Path("test-artifacts")
    artifacts.mkdir(exist_ok=True)
    (artifacts / "drill-quick.log").write_text(proc.stdout + proc.stderr)
    rows = json.loads(out.read_text())
    return {row["drill"]: row for row in rows}


def _alive_pids(pattern: str) -> list[str]:
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    return out.stdout.split()


@real_drill
@pytest.mark.parametrize("drill", ["kill", "oom", "nan", "stale_generation"])
def test_it_names_the_injected_root_cause(quick_run: dict[str, dict], drill: str) -> None:
    row = quick_run[drill]
    assert row["error"] is None
    assert row["found_root_cause"] == row["expected_root_cause"]
    assert 0 <= row["detection_s"] < 10


@real_drill
def test_it_names_a_corrupted_committed_shard(quick_run: dict[str, dict]) -> None:
    row = quick_run["corrupt_checkpoint"]
    assert row["found_root_cause"] == "checkpoint_modified"
    assert row["other_root_causes"] == []


@real_drill
def test_it_refuses_an_automatic_restart_after_a_nan_loss(quick_run: dict[str, dict]) -> None:
    row = quick_run["nan"]
    assert row["auto_restart_safe"] is False
    assert row["advice_correct"] is True


@real_drill
def test_it_advises_a_restart_from_checkpoint_after_a_killed_rank(quick_run) -> None:
    assert quick_run["kill"]["advice_correct"] is True


@real_drill
def test_it_restores_and_measures_the_repeated_work(quick_run: dict[str, dict]) -> None:
    row = quick_run["kill"]
    assert row["quiesce_s"] is not None and row["quiesce_s"] < 15
    assert row["restore_s"] is not None and row["restore_s"] > 0
    assert row["lost_steps"] >= 0
    assert row["repeated_steps"] == row["lost_steps"]


@real_drill
def test_it_leaves_no_rank_agent_or_server_behind(quick_run: dict[str, dict]) -> None:
    assert quick_run  # the run finished
    assert _alive_pids("faultline.drill.trainer") == []
    assert _alive_pids("drill-node") == []


def test_it_renders_one_table_row_and_one_markdown_row_per_drill() -> None:
    rows = [
        {"drill": "kill", "fault": "SIGKILL rank 1", "expected_root_cause": "process_exit",
         "found_root_cause": "process_exit", "detection_s": 0.5, "advice_correct": False,
         "error": None},
        {"drill": "nan", "fault": "NaN loss", "expected_root_cause": "nan_loss",
         "found_root_cause": None, "detection_s": None, "advice_correct": None,
         "error": "RuntimeError: nan_loss not named within 40s"},
    ]  # fmt: skip
    text = table(rows)
    assert text.splitlines()[2].split()[:4] == ["kill", "process_exit", "process_exit", "0.5"]
    assert "nan: RuntimeError: nan_loss not named within 40s" in text
    md = markdown(rows).splitlines()
    assert len(md) == 4 and md[2].startswith("| SIGKILL rank 1 | process_exit |")


def test_it_says_in_one_line_that_torch_is_missing(tmp_path: Path) -> None:
    # A site dir whose `torch` cannot be found: shadow it with a module that hides itself.
    shim = tmp_path / "sitecustomize.py"
    shim.write_text(
        "import importlib.util, sys\n"
        "_find = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda n, *a: None if n == 'torch' else _find(n, *a)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    out = subprocess.run(
        [str(BIN / "faultline"), "drill", "--quick"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stdout.strip().splitlines() == [
        "faultline: drill needs PyTorch; install it with pip install 'faultline[torch]'"
    ]


@pytest.mark.slow
@pytest.mark.parametrize("fake", [True, False], ids=["fake-scontrol", "real-slurm"])
def test_it_times_the_remediation_loop_on_the_scheduler(tmp_path: Path, fake: bool) -> None:
    from tests.system.slurm import slurm_available

    if not fake and slurm_available():
        pytest.skip(slurm_available())
    out = tmp_path / "remediation.json"
    fake_flag = ["--fake-scheduler"] if fake else []
    argv = [str(BIN / "faultline"), "drill", "--remediation", "--json", str(out),
            "--data-dir", str(tmp_path / "run"), *fake_flag]  # fmt: skip
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=280,
        env={k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (row,) = json.loads(out.read_text())
    assert row["scheduler"].startswith("fake scontrol" if fake else "real Slurm")
    assert 0 < row["fault_to_out_of_service_s"] <= row["fault_to_job_requeued_s"] < 120
    assert row["reason"].startswith("faultline: ") and "xid" in row["reason"].lower()
    artifacts = Path("test-artifacts")
    artifacts.mkdir(exist_ok=True)
    (artifacts / f"drill-remediation-{'fake' if fake else 'slurm'}.json").write_text(
        json.dumps(row, indent=2)
    )
