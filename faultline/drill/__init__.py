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
import json
import os
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
    ("invariants", "invariants"),
    ("incident", "incident"),
    ("runs", "runs"),
    ("passed", "pass"),
)


def _cell(value: Any) -> str:
    if value is None or value == {}:
        return "-"
    if isinstance(value, dict):  # invariants: name -> held
        failed = [k for k, ok in value.items() if not ok]
        return f"all {len(value)} held" if not failed else "NO: " + ", ".join(failed)
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
        elif r.get("note"):
            lines.append(f"{r['drill']} ({r.get('runs')}): {r['note']}")
        if r.get("measured") and r.get("drill") == "telemetry_down":
            lines.append(f"{r['drill']}: {json.dumps(r['measured'])}")
    return "\n".join(lines)


def markdown(rows: list[dict[str, Any]]) -> str:
    head = "| fault | " + " | ".join(h for _, h in COLUMNS[1:]) + " |"
    rule = "| --- " * len(COLUMNS) + "|"
    body = [
        f"| {r['fault']} | " + " | ".join(_cell(r.get(k)) for k, _ in COLUMNS[1:]) + " |"
        for r in rows
    ]
    notes = [f"* `{r['drill']}` ({r.get('runs')}): {r['note']}" for r in rows if r.get("note")]
    notes += [incident_note(r) for r in rows if r.get("incident_costs")]
    notes += [f"* `{r['drill']}`: {r['error']}" for r in rows if r.get("error")]
    return "\n".join([head, rule, *body, *(["", *notes] if notes else [])]) + "\n"


def incident_note(row: dict[str, Any]) -> str:
    """One drill linked to its incident's costs as the console measured them."""
    c = row["incident_costs"]
    figures = ", ".join(
        f"{label} {_cell(c.get(key))}"
        for key, label in (
            ("detection_s", "detection s"),
            ("quiesce_s", "quiesce s"),
            ("lost_steps", "lost steps"),
            ("restore_s", "restore s"),
            ("repeated_steps", "repeated steps"),
            ("repeated_samples", "repeated samples"),
        )
    )
    return f"* `{row['drill']}`: incident #{row['incident']} measured {figures}"


def not_run_row(spec: Any, why: str) -> dict[str, Any]:
    """A row of the matrix that did not run here, and why (printed with the others)."""
    from faultline.drill.runner import Result

    r = Result(spec.fault, spec.name, spec.expected_root_cause)
    r.runs, r.layer, r.note = "not run here", spec.layer, why
    return r.as_dict()


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


def service_env(rows: int) -> dict[str, str]:
    """Settings of the drill's own service. Every row is a new job (a group or two) from
    the one drill node, so the per-node cap on new groups an hour (20) refused
    every row's records past the 20th of a whole-matrix run, and those rows named nothing:
    the drill's node gets room for its rows."""
    return {"FAULTLINE_INGEST_NEW_GROUPS_PER_HOUR": str(max(20, 3 * rows))}


def run(args: argparse.Namespace) -> int:
    if getattr(args, "remediation", False):
        return run_remediation(args)
    if getattr(args, "list", False):
        return print_matrix()
    from faultline.drill.prereqs import python_missing

    missing = python_missing()
    if missing:
        for m in missing:
            print(m.line())
        return 2
    from faultline.drill.matrix import NOT_HERE
    from faultline.drill.prereqs import network_missing
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
    skipped: dict[str, str] = {s.name: s.why for s in specs if s.runs == NOT_HERE}
    if any(s.network for s in specs):
        net = network_missing()
        for s in specs:
            if s.network and net:
                skipped[s.name] = "; ".join(m.line().removeprefix("faultline: drill ") for m in net)
    runnable = [s for s in specs if s.name not in skipped]
    own_dir = args.data_dir is None
    work = Path(args.data_dir or tempfile.mkdtemp(prefix="faultline-drill-")).resolve()
    from agents.listener import MAX_SOCKET_PATH

    longest = work / "service" / "agents" / "drill-net-0" / "reporter.sock"  # the agents' own
    if len(os.fsencode(longest)) > MAX_SOCKET_PATH:
        print(
            f"faultline: drill: --data-dir {work} is too long: the agents' reporter sockets "
            f"under it ({longest}) would pass the {MAX_SOCKET_PATH} bytes a Unix socket path "
            "may have; use a shorter one"
        )
        return 2
    work.mkdir(parents=True, exist_ok=True)

    def on_signal(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # unwind through the finally blocks: nothing is left behind

    signal.signal(signal.SIGTERM, on_signal)
    began = time.monotonic()
    service = None
    rows: list[dict[str, Any]] = []
    try:
        print(f"faultline: drill: starting a service under {work}", flush=True)
        service = start_service(work / "service", env=service_env(len(runnable)))
        print(f"faultline: drill: service ready in {time.monotonic() - began:.1f}s", flush=True)
        # The fake-NVML rows script the agent's fake GPUs through this directory.
        control = work / "nvml-control"
        control.mkdir(exist_ok=True)
        os.environ["FAULTLINE_FAKE_NVML_CONTROL_DIR"] = str(control)
        ckpt = work / "ckpt"
        ckpt.mkdir(exist_ok=True)
        service.start_agent("drill-node", "--checkpoint-root", str(ckpt), "--interval", "0.5")
        socket = service.data_dir / "agents" / "drill-node" / "reporter.sock"
        wait_for(socket.exists, 30, "the drill agent's reporter socket")
        tag = uuid.uuid4().hex[:6]
        drills: list[Drill] = []
        for spec in runnable:
            print(f"faultline: drill {spec.name}: {spec.fault}", flush=True)
            drills.append(Drill(spec, service, work, socket, tag))
            result = drills[-1].run()
            rows.append(result.as_dict())
            verdict = "ok" if result.passed else f"MISMATCH ({result.error or 'see table'})"
            phases = ", ".join(f"{k} {v}" for k, v in result.wall_s.items() if k != "row")
            print(
                f"faultline: drill {spec.name}: found {result.found_root_cause}, "
                f"detected in {result.detection_s}s: {verdict} "
                f"(row {result.wall_s.get('row')} s: {phases})",
                flush=True,
            )
        for i, done in enumerate(drills):  # the console's costs, final by now (runner.py)
            done.collect_incident_costs()
            rows[i] = done.result.as_dict()
        rows += [not_run_row(s, skipped[s.name]) for s in specs if s.name in skipped]
    except KeyboardInterrupt:
        print("faultline: drill interrupted; stopping everything")
        return 130
    finally:
        if service is not None:
            stop_service(service)
        failed = [r for r in rows if r.get("error")]
        if own_dir and not failed:
            shutil.rmtree(work, ignore_errors=True)
        elif own_dir:
            # An error names a log: keep the logs (not the checkpoints or the database).
            for bulky in ("ckpt", "status", "service/pg"):
                shutil.rmtree(work / bulky, ignore_errors=True)
            print(f"faultline: drill: {len(failed)} drill(s) failed; logs kept under {work}")
    print()
    print(table(rows))
    print(f"\n{len(rows)} drill(s) in {time.monotonic() - began:.0f}s")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=2) + "\n")
    if args.markdown:
        Path(args.markdown).write_text(markdown(rows))
    ok = all(r["passed"] is not False for r in rows)
    return 0 if ok else 1


def print_matrix() -> int:
    """`faultline drill --list`: every row, how it runs here, what it must name."""
    from faultline.drill.matrix import MATRIX

    head = ("drill", "layer", "runs", "quick", "expected", "fault")
    cells = [head] + [
        (s.name, s.layer, s.runs, "yes" if s.quick else "", s.expected_root_cause or "-", s.fault)
        for s in MATRIX
    ]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head) - 1)]
    for c in cells:
        print("  ".join(x.ljust(w) for x, w in zip(c[:-1], widths, strict=True)) + "  " + c[-1])
    return 0
