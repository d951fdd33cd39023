"""The scale goals in one run: the benches that measure them, each goal met or not.

Made for a box bigger than the project's 2-vCPU machine, where the goals that depend on
cores (steady ingest against one COPY connection; a 16k-rank job stepping once a second)
could not be met: copy the checkout there, install it as the README says, and run

    python bench/scale_goals.py                      # about 20-25 minutes
    python bench/scale_goals.py --ranks 1024 --trials 2 --page-runs 5   # a smoke run

It runs `bench/ingest.py --quick` (steady and backlog shapes, each against a raw COPY of
the same rows in the same run), `bench/detect.py --ranks N` (a real `faultline up`, faults
injected over HTTP, incidents read from a logged-in websocket) and `bench/fleet_page.py`
(2,048 nodes / 16,384 GPUs), keeps each one's whole output under --out, reads the summary
lines they print, and prints one line per goal. Nothing here measures: a figure it cannot
find in a bench's output is reported as missing, never as met.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The summary lines the benches print (bench/ingest.py main, bench/detect_scale.py
# run_scale, bench/fleet_page.py _print), matched loosely on their keys.
_INGEST = re.compile(r"^\[(steady|backlog)\] records/s (\d+) p99_ms (\d+) ratio ([\d.]+)$")
_SCALE = re.compile(
    r"^scale_ranks (\d+) explicit_p99_s (\S+) silent_p99_s (\S+) straggler_steps_max (\S+)"
    r" false_hangs (\d+) pass_mean_ms (\d+)"
)
_PAGE = re.compile(r"^this\s+\d+\s+([\d.]+)\s+([\d.]+)\s")


@dataclass(frozen=True)
class Goal:
    name: str
    figure: float | None  # None: the bench did not print it
    limit: float
    higher_is_better: bool
    unit: str

    @property
    def met(self) -> bool | None:
        if self.figure is None:
            return None
        if self.higher_is_better:
            return self.figure >= self.limit
        return self.figure <= self.limit

    def line(self) -> str:
        verdict = {True: "met", False: "NOT MET", None: "MISSING"}[self.met]
        op = ">=" if self.higher_is_better else "<="
        fig = "-" if self.figure is None else f"{self.figure:g}"
        return f"{verdict:<8} {self.name}: {fig} {self.unit} (goal {op} {self.limit:g})"


def _num(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # "-": no trial of that kind ran


def ingest_goals(output: str) -> list[Goal]:
    """Steady and backlog records/s as a ratio of the same run's COPY (goal >= 0.5)."""
    ratios: dict[str, float] = {}
    for line in output.splitlines():
        if m := _INGEST.match(line.strip()):
            ratios[m.group(1)] = float(m.group(4))
    return [
        Goal(f"ingest {shape} / raw COPY", ratios.get(shape), 0.5, True, "ratio")
        for shape in ("steady", "backlog")
    ]


def detect_goals(output: str, step_s: float) -> list[Goal]:
    """Xid -> incident p99 <= 1 s; silent hang <= max(3 x step, 5 s) + 1 s; a straggler
    named within 10 steps; no healthy rank called hung."""
    found = None
    for line in output.splitlines():
        if m := _SCALE.match(line.strip()):
            found = m
    ranks = found.group(1) if found else "?"
    get = (lambda i: _num(found.group(i))) if found else (lambda i: None)
    return [
        Goal(f"{ranks} ranks: Xid -> incident p99", get(2), 1.0, False, "s"),
        Goal(
            f"{ranks} ranks: silent hang -> incident p99",
            get(3),
            max(3 * step_s, 5.0) + 1.0,
            False,
            "s",
        ),
        Goal(f"{ranks} ranks: straggler named after", get(4), 10, False, "steps"),
        Goal(f"{ranks} ranks: healthy ranks called hung", get(5), 0, False, "ranks"),
    ]


def page_goals(output: str) -> list[Goal]:
    """The fleet page at 2,048 nodes / 16,384 GPUs: the worst round's p95 <= 300 ms."""
    p95s = [float(m.group(2)) for ln in output.splitlines() if (m := _PAGE.match(ln.strip()))]
    return [Goal("fleet page p95 (worst round)", max(p95s) if p95s else None, 300, False, "ms")]


def _run(name: str, cmd: list[str], out: Path) -> str:
    """Run one bench, its output teed to out/<name>.log; returns the output."""
    print(f"== {name}: {' '.join(cmd)}", flush=True)
    t0 = time.monotonic()
    proc = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    text = proc.stdout + proc.stderr
    (out / f"{name}.log").write_text(text)
    print(f"   {time.monotonic() - t0:.0f} s, exit {proc.returncode}, log {out / name}.log")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    cores = os.cpu_count() or 2
    parser.add_argument("--ranks", type=int, default=16384)
    parser.add_argument("--step-s", type=float, default=1.0)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument(
        "--workers",
        type=int,
        default=max(2, cores // 4),
        help="gunicorn workers for the ingest bench (default: a quarter of the cores, >= 2)",
    )
    parser.add_argument("--page-runs", type=int, default=20)
    parser.add_argument("--skip", default="", help="comma-separated: ingest, detect, page")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(os.environ.get("OUT", "/tmp")) / "scale-goals",
        help="where each bench's output and goals.json go",
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    skip = {s for s in args.skip.split(",") if s}
    py = sys.executable
    load = os.getloadavg()[0]
    print(f"{cores} cores, load average {load:.1f} at start", flush=True)
    goals: list[Goal] = []
    if "ingest" not in skip:
        text = _run(
            "ingest", [py, "bench/ingest.py", "--quick", "--workers", str(args.workers)], args.out
        )
        goals += ingest_goals(text)
    if "detect" not in skip:
        text = _run(
            "detect",
            [
                py,
                "bench/detect.py",
                "--ranks",
                str(args.ranks),
                "--trials",
                str(args.trials),
                "--step-s",
                str(args.step_s),
            ],
            args.out,
        )
        goals += detect_goals(text, args.step_s)
    if "page" not in skip:
        text = _run(
            "page",
            [py, "bench/fleet_page.py", "--rounds", "1", "--runs", str(args.page_runs)],
            args.out,
        )
        goals += page_goals(text)
    print()
    for goal in goals:
        print(goal.line())
    report = {
        "cores": cores,
        "load_at_start": load,
        "goals": [{**asdict(g), "met": g.met} for g in goals],
    }
    (args.out / "goals.json").write_text(json.dumps(report, indent=1))
    return 0 if all(g.met for g in goals) else 1


if __name__ == "__main__":
    sys.exit(main())
