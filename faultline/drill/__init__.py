"""`faultline drill`: break a real PyTorch job on purpose and measure what Faultline saw.

Owns the drill session: start a real service (`faultline up` on free ports, embedded
Postgres and Valkey under a work directory) and a real agent watching the checkpoint root,
run each drill of the matrix (faultline.drill.runner) one after the other, and report a
terminal table, JSON and Markdown. torch is optional: without it the command says so in
one line and exits 2. Everything it starts is stopped before it returns (no orphan ranks,
agents or servers), on Ctrl-C and SIGTERM too.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import signal
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

COLUMNS = (
    ("drill", "drill"),
    ("expected_root_cause", "expected"),
    ("found_root_cause", "found"),
    ("detection_s", "detect s"),
    ("quiesce_s", "quiesce s"),
    ("lost_steps", "lost steps"),
    ("restore_s", "restore s"),
    ("repeated_steps", "repeated"),
    ("advice_correct", "advice ok"),
)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    return str(value)


def table(rows: list[dict[str, Any]]) -> str:
    """A plain terminal table, one line per drill (errors on their own line)."""
    cells = [[h for _, h in COLUMNS]] + [[_cell(r.get(k)) for k, _ in COLUMNS] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for r in rows:
        if r.get("error"):
            lines.append(f"{r['drill']}: {r['error']}")
    return "\n".join(lines)


def markdown(rows: list[dict[str, Any]]) -> str:
    head = "| fault | " + " | ".join(h for _, h in COLUMNS[1:]) + " |"
    rule = "| --- " * len(COLUMNS) + "|"
    body = [
        f"| {r['fault']} | " + " | ".join(_cell(r.get(k)) for k, _ in COLUMNS[1:]) + " |"
        for r in rows
    ]
    return "\n".join([head, rule, *body]) + "\n"


def run_remediation(args: argparse.Namespace) -> int:
    """`faultline drill --remediation` (faultline.drill.remediation): figures, then JSON."""
    from faultline.drill.remediation import run_drill

    work = Path(args.data_dir).resolve() if args.data_dir else None
    try:
        row = run_drill(work, fake=args.fake_scheduler)
    except (TimeoutError, RuntimeError, AssertionError) as exc:
        print(f"faultline: remediation drill failed: {exc}")
        return 1
    except KeyboardInterrupt:
        print("faultline: drill interrupted; stopping everything")
        return 130
    print(f"scheduler: {row['scheduler']}")
    print(f"fault -> node out of service on the scheduler: {row['fault_to_out_of_service_s']} s")
    print(f"fault -> job requeued without it:              {row['fault_to_job_requeued_s']} s")
    print(f"scheduler reason: {row['reason']}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps([row], indent=2) + "\n")
    return 0


def run(args: argparse.Namespace) -> int:
    if getattr(args, "remediation", False):
        return run_remediation(args)
    if importlib.util.find_spec("torch") is None:
        print("faultline: drill needs PyTorch; install it with pip install 'faultline[torch]'")
        return 2
    from faultline.drill.runner import MATRIX, Drill
    from faultline.testing.service import start_service, stop_service, wait_for

    specs = [s for s in MATRIX if (s.quick or not args.quick)]
    if args.only:
        unknown = sorted(set(args.only) - {s.name for s in MATRIX})
        if unknown:
            names = ", ".join(s.name for s in MATRIX)
            print(f"faultline: unknown drill {', '.join(unknown)}; known: {names}")
            return 2
        specs = [s for s in MATRIX if s.name in args.only]
    own_dir = args.data_dir is None
    work = Path(args.data_dir or tempfile.mkdtemp(prefix="faultline-drill-")).resolve()
    work.mkdir(parents=True, exist_ok=True)

    def on_signal(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # unwind through the finally blocks: nothing is left behind

    signal.signal(signal.SIGTERM, on_signal)
    began = time.monotonic()
    service = None
    rows: list[dict[str, Any]] = []
    try:
        print(f"faultline: drill: starting a service under {work}", flush=True)
        service = start_service(work / "service")
        ckpt = work / "ckpt"
        ckpt.mkdir(exist_ok=True)
        service.start_agent("drill-node", "--checkpoint-root", str(ckpt), "--interval", "0.5")
        socket = service.data_dir / "agents" / "drill-node" / "reporter.sock"
        wait_for(socket.exists, 30, "the drill agent's reporter socket")
        tag = uuid.uuid4().hex[:6]
        for spec in specs:
            print(f"faultline: drill {spec.name}: {spec.fault}", flush=True)
            result = Drill(spec, service, work, socket, tag).run()
            rows.append(result.as_dict())
            verdict = "ok" if result.passed else f"MISMATCH ({result.error or 'see table'})"
            print(
                f"faultline: drill {spec.name}: found {result.found_root_cause}, "
                f"detected in {result.detection_s}s: {verdict}",
                flush=True,
            )
    except KeyboardInterrupt:
        print("faultline: drill interrupted; stopping everything")
        return 130
    finally:
        if service is not None:
            stop_service(service)
        if own_dir:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print(table(rows))
    print(f"\n{len(rows)} drill(s) in {time.monotonic() - began:.0f}s")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=2) + "\n")
    if args.markdown:
        Path(args.markdown).write_text(markdown(rows))
    ok = all(r["error"] is None and r["found_root_cause"] == r["expected_root_cause"] for r in rows)
    return 0 if ok else 1
