"""The serving rows: real serving workers (faultline.drill.serving_loop) broken on purpose.

Owns the serving choreography: the drill plays the router (a stream of requests, round
robin over the workers in rotation, ~10 a second) and the client (it reads every streamed
token back), starts the workers with the drill agent's reporter socket, breaks them, and
measures what Faultline said through its REST API.

* `serving_worker_exit`: a worker is SIGKILLed while it holds live KV. Declared serving
  semantics: the router fails the dead worker's requests over at once (its health check,
  not Faultline) and each re-runs on a peer from the tokens the client already received
  (re-prefill: repeated KV work, no token streamed twice) and reports the exit as a
  launcher would (`reporter.serving_exit`); Faultline must name the lost worker
  (`worker_lost`, with its in-flight requests) and not blame the survivor; then
  the worker is restarted (on Faultline's finding, as an operator would).
* `canary_switch`: of four workers on model toy-v1 / KV schema kv-1, one becomes a healthy
  canary (toy-v2 with its own kv-2) and one a mismatched canary (toy-v1 with an adapter
  built for kv-2). Faultline must flag the mismatched one (`stale_version`), blame no
  healthy worker (the healthy canary included); the drill rolls it back (out of
  rotation, in-flight requests finish, back to toy-v1/kv-1) and the finding must clear.

Must not judge faults itself: the found root cause is whatever the console named.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from faultline.drill import invariants
from faultline.drill.util import first_error

Drill = Any  # faultline.drill.runner.Drill (runner imports this module: no cycle)

REQUEST_EVERY_S = 0.1
TOKENS_PER_REQUEST = 24
PROMPT_TOKENS = 12
WARM_S = 4.0
WORKER_LOST_TIMEOUT_S = 25.0  # the launcher reports the exit; silence alone takes >= 5 s
DETECT_TIMEOUT_S = 25.0
CLEAR_TIMEOUT_S = 30.0
BASE = {"model_version": "toy-v1", "adapter_version": "", "kv_schema": "kv-1"}
HEALTHY_CANARY = {"model_version": "toy-v2", "adapter_version": "", "kv_schema": "kv-2"}
MISMATCHED = {"model_version": "toy-v1", "adapter_version": "lora-kv2", "kv_schema": "kv-2"}


class Fleet:
    """The serving workers of one drill, the router in front of them, the client behind."""

    def __init__(self, drill: Drill, workers: int) -> None:
        self.drill = drill
        self.dir = drill.work / "serve" / drill.group
        for sub in ("streams", "done", "control", "state"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self.logs = drill.work / "logs"
        self.logs.mkdir(exist_ok=True)
        self.names = [f"w{i}" for i in range(workers)]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.rotation = list(self.names)
        self.requests: dict[str, dict[str, Any]] = {}  # rid -> the request as first sent
        self.assigned: dict[str, str] = {}  # rid -> worker it is on now
        self.failed_over: dict[str, int] = {}  # rid -> tokens the client had at failover
        self.lock = threading.Lock()
        self.stop_flag = threading.Event()
        self.router: threading.Thread | None = None
        self.count = 0
        self.starts = 0

    # -- workers ---------------------------------------------------------------------------
    def start(self, name: str) -> None:
        versions = self.control(name) or BASE
        env = dict(
            os.environ, FAULTLINE_REPORTER_SOCKET=str(self.drill.socket), PYTHONWARNINGS="ignore"
        )
        self.starts += 1
        log = open(self.logs / f"{self.drill.group}-{name}-{self.starts}.log", "wb")  # noqa: SIM115
        self.procs[name] = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "faultline.drill.serving_loop",
                "--group",
                self.drill.group,
                "--worker",
                name,
                "--dir",
                str(self.dir),
                "--model-version",
                versions["model_version"],
                "--adapter-version",
                versions["adapter_version"],
                "--kv-schema",
                versions["kv_schema"],
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()

    def state(self, name: str) -> dict[str, Any]:
        with contextlib.suppress(OSError, ValueError):
            return dict(json.loads((self.dir / "state" / f"{name}.json").read_text()))
        return {}

    def control(self, name: str, versions: dict[str, str] | None = None) -> dict[str, str]:
        path = self.dir / "control" / f"{name}.json"
        if versions is not None:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(versions))
            os.replace(tmp, path)
        with contextlib.suppress(OSError, ValueError):
            return dict(json.loads(path.read_text()))
        return {}

    def ready(self, name: str, since: float = 0.0) -> bool:
        s = self.state(name)
        proc = self.procs.get(name)
        return (
            bool(s.get("ready"))
            and s.get("ts", 0) > since
            and proc is not None
            and (proc.poll() is None and s.get("pid") == proc.pid)
        )

    def why(self) -> str:
        return first_error(sorted(self.logs.glob(f"{self.drill.group}-*.log")))

    def stop_all(self) -> None:
        self.stop_flag.set()
        if self.router is not None:
            self.router.join(5)
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    # -- the router ------------------------------------------------------------------------
    def _send(self, rid: str, worker: str, resume: list[int] | None = None) -> None:
        req = dict(self.requests[rid], resume=resume or [])
        inbox = self.dir / "inbox" / worker
        inbox.mkdir(parents=True, exist_ok=True)
        tmp = inbox / f".{rid}.tmp"
        tmp.write_text(json.dumps(req))
        os.replace(tmp, inbox / f"{rid}.json")
        self.assigned[rid] = worker

    def _route(self) -> None:
        turn = 0
        while not self.stop_flag.is_set():
            with self.lock:
                live = [w for w in self.rotation if self.procs[w].poll() is None]
                if live:
                    rid = f"r{self.count:06d}"
                    rng = random.Random(self.count)  # noqa: S311 - prompts, not secrets
                    self.requests[rid] = {
                        "rid": rid,
                        "prompt": [rng.randrange(61) for _ in range(PROMPT_TOKENS)],
                        "n": TOKENS_PER_REQUEST,
                        "enqueued": time.time(),
                    }
                    self._send(rid, live[turn % len(live)])
                    self.count += 1
                    turn += 1
            time.sleep(REQUEST_EVERY_S)

    def serve(self) -> None:
        self.router = threading.Thread(target=self._route, name="router", daemon=True)
        self.router.start()

    def fail_over(self, dead: str) -> tuple[int, int, int]:
        """Move the dead worker's requests to live peers, each from the tokens the client
        already has. Returns (requests moved, of them still queued in its inbox, prompt +
        delivered tokens re-prefilled)."""
        moved = queued = prefill = 0
        with self.lock:
            if dead in self.rotation:
                self.rotation.remove(dead)
            live = [w for w in self.rotation if self.procs[w].poll() is None]
            for i, rid in enumerate(sorted(r for r, w in self.assigned.items() if w == dead)):
                if self.client(rid)["done"]:
                    continue
                with contextlib.suppress(OSError):
                    (self.dir / "inbox" / dead / f"{rid}.json").unlink()
                    queued += 1  # never claimed: it was queued, not active
                got = self.client(rid)["tokens"]
                self.failed_over[rid] = len(got)
                self._send(rid, live[i % len(live)], resume=got)
                moved += 1
                prefill += PROMPT_TOKENS + len(got)
        return moved, queued, prefill

    def report_exit(self, dead: str, active: int, queued: int, exit_code: int | None) -> None:
        """As a launcher or router that saw the exit would: a serving window with `exited`
        and the requests it had in flight on the worker (the worker cannot say it died)."""
        from agents.reporter import Reporter

        rep = Reporter(socket_path=str(self.drill.socket), group=self.drill.group)
        rep.serving_exit(dead, active=active, queued=queued, exit_code=exit_code)
        rep.close()

    # -- the client ------------------------------------------------------------------------
    def client(self, rid: str) -> dict[str, Any]:
        """What the client received for `rid`: complete token lines from every worker that
        served it (torn lines are not delivered), duplicates and finishes counted."""
        by_index: dict[int, int] = {}
        duplicates = 0
        for path in self.dir.glob(f"streams/{rid}.*.tok"):
            with contextlib.suppress(OSError):
                data = path.read_text()
                for line in data.splitlines(keepends=True):
                    if not line.endswith("\n"):
                        continue
                    tok = json.loads(line)
                    if tok["i"] in by_index:
                        duplicates += 1
                    by_index[tok["i"]] = tok["t"]
        done = [json.loads(p.read_text()) for p in self.dir.glob(f"done/{rid}.*")]
        tokens = [by_index[i] for i in range(len(by_index)) if i in by_index]
        gaps = len(by_index) != len(tokens) or (by_index and max(by_index) != len(by_index) - 1)
        return {"tokens": tokens, "duplicates": duplicates, "done": done, "gaps": bool(gaps)}

    def drain(self, timeout: float = 30.0) -> bool:
        """Stop sending; wait until every request sent has finished somewhere."""
        self.stop_flag.set()
        if self.router is not None:
            self.router.join(5)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(self.client(rid)["done"] for rid in self.requests):
                return True
            time.sleep(0.2)
        return False

    def outcomes(self) -> dict[str, dict[str, Any]]:
        """Every request's client view plus its reference output (computed here)."""
        from faultline.drill.serving_loop import TinyLM, generate

        models: dict[tuple[str, str], TinyLM] = {}
        out = {}
        for rid, req in self.requests.items():
            seen = self.client(rid)
            # The version that finished it (a request never switches version mid-stream).
            fin = seen["done"][0] if seen["done"] else {}
            key = (fin.get("model_version") or "", fin.get("adapter_version") or "")
            if key[0] and key not in models:
                models[key] = TinyLM(key[0], key[1] or None)
            seen["reference"] = generate(models[key], req["prompt"], req["n"]) if key[0] else None
            seen["n"] = req["n"]
            out[rid] = seen
        return out


def _alerts(drill: Drill) -> list[dict[str, Any]]:
    try:
        return list(drill.service.api(f"/api/v1/alerts/?group={drill.group}")["results"])
    except Exception:  # noqa: BLE001 - the group may not exist yet
        return []


def _blamed(drill: Drill, workers: list[str], since: float) -> list[str]:
    """Findings on these workers' subjects seen since `since` (any kind, any role)."""
    from datetime import datetime

    out = []
    for a in _alerts(drill):
        ts = datetime.fromisoformat(str(a["last_seen"]).replace("Z", "+00:00")).timestamp()
        worker = str(a["subject"]).rsplit("/", 1)[-1]
        if worker in workers and ts >= since - 1.0:
            out.append(f"{a['kind']}@{worker}")
    return sorted(set(out))


def _detect(drill: Drill, t0: float, kind: str, worker: str, timeout: float) -> dict[str, Any]:
    """Poll until an incident of `kind` on `worker` opened after t0; record it."""
    r = drill.result
    deadline = time.monotonic() + timeout
    found: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        found = drill.new_incidents(t0) or found
        hit = [i for i in found if i["kind"] == kind and str(i["subject"]).endswith(f"/{worker}")]
        if hit:
            r.detection_s = round(time.time() - t0, 2)
            r.found_root_cause = kind
            r.other_root_causes = sorted({i["kind"] for i in found if i["kind"] != kind})
            recovery = hit[0].get("recovery") or {}
            r.auto_restart_safe = recovery.get("auto_restart_safe")
            r.advice_correct = r.auto_restart_safe == drill.spec.expected_auto_restart_safe
            r.measured["named_subject"] = hit[0]["subject"]
            return hit[0]
        time.sleep(0.1)
    kinds = sorted({f"{i['kind']}@{i['subject']}" for i in found})
    r.found_root_cause = found[0]["kind"] if found else None
    raise RuntimeError(
        f"{kind} on {worker} not named within {timeout:.0f}s; incidents: {kinds or 'none'}"
    )


def _warm(fleet: Fleet) -> None:
    for name in fleet.names:
        fleet.start(name)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not all(fleet.ready(n) for n in fleet.names):
        if any(p.poll() is not None for p in fleet.procs.values()):
            break
        time.sleep(0.1)
    if not all(fleet.ready(n) for n in fleet.names):
        raise RuntimeError(f"the serving workers never became ready: {fleet.why()}")
    fleet.serve()
    time.sleep(WARM_S)


def worker_exit(drill: Drill) -> None:
    """A serving worker SIGKILLed with live KV; failover, detection, restart, invariants."""
    r = drill.result
    fleet = Fleet(drill, 2)
    victim, survivor = "w1", "w0"
    try:
        _warm(fleet)
        # Kill it while it holds live KV (requests mid-decode), not between requests.
        live = None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            live = fleet.state(victim)
            if len(live.get("active", [])) >= 2 and live.get("kv_tokens", 0) > 0:
                break
            time.sleep(0.01)
        fleet.procs[victim].send_signal(signal.SIGKILL)
        t0 = time.time()
        code = fleet.procs[victim].wait(5)
        held = fleet.state(victim)  # its last live counters (written every tick)
        moved, queued, prefill = fleet.fail_over(victim)  # the router's health check, at once
        r.quiesce_s = round(time.time() - t0, 2)
        # The launcher saw the exit (waitpid returned): it tells Faultline at once.
        fleet.report_exit(victim, moved - queued, queued, 128 - code if code < 0 else code)
        r.lost_steps = moved
        r.lost_tokens = int(held.get("kv_tokens", 0))
        r.repeated_steps = moved
        r.measured.update(
            in_flight_at_kill=len(held.get("active", [])),
            kv_tokens_at_kill=held.get("kv_tokens"),
            requests_failed_over=moved,
            reprefilled_tokens=prefill,
            delivered_before_kill={rid: fleet.failed_over[rid] for rid in fleet.failed_over},
        )
        _detect(drill, t0, "worker_lost", victim, WORKER_LOST_TIMEOUT_S)
        lost = [a for a in _alerts(drill) if a["kind"] == "worker_lost"]
        r.faultline_lost_steps = (lost[0]["evidence"] or {}).get("lost_requests") if lost else None
        # Restore: the worker restarts (the operator acting on the finding) and rejoins.
        began = time.time()
        fleet.start(victim)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not fleet.ready(victim, since=began):
            time.sleep(0.05)
        if not fleet.ready(victim, since=began):
            raise RuntimeError(f"{victim} never came back: {fleet.why()}")
        with fleet.lock:
            fleet.rotation.append(victim)
        r.restore_s = round(time.time() - began, 2)
        time.sleep(2.0)
        drained = fleet.drain()
        outcomes = fleet.outcomes()
        r.invariants = invariants.serving(outcomes, drained)
        r.invariants["lost_requests_named"] = bool(r.faultline_lost_steps)
        blamed = _blamed(drill, [survivor], t0)
        r.measured["survivor_findings"] = blamed
        r.invariants["healthy_worker_not_blamed"] = not blamed
        r.measured["requests"] = len(outcomes)
    finally:
        fleet.stop_all()


def canary_switch(drill: Drill) -> None:
    """A healthy and a mismatched canary; the mismatched one flagged and rolled back."""
    r = drill.result
    fleet = Fleet(drill, 4)
    bad, good_canary, healthy = "w2", "w3", ["w0", "w1"]
    try:
        _warm(fleet)
        fleet.control(good_canary, HEALTHY_CANARY)
        fleet.control(bad, MISMATCHED)
        t0 = time.time()
        _detect(drill, t0, "stale_version", bad, DETECT_TIMEOUT_S)
        detected = time.time()
        # Rollback: out of rotation, in-flight requests finish, back to the fleet's version.
        with fleet.lock:
            fleet.rotation.remove(bad)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (
            fleet.state(bad).get("active") or any((fleet.dir / "inbox" / bad).glob("*.json"))
        ):
            time.sleep(0.05)
        r.quiesce_s = round(time.time() - detected, 2)
        began = time.time()
        fleet.control(bad, BASE)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (
            fleet.ready(bad, since=began) and fleet.state(bad).get("kv_schema") == "kv-1"
        ):
            time.sleep(0.05)
        with fleet.lock:
            fleet.rotation.append(bad)
        r.restore_s = round(time.time() - began, 2)
        # The finding must clear once the rolled-back worker reports the fleet's version.
        cleared = None
        deadline = time.monotonic() + CLEAR_TIMEOUT_S
        while time.monotonic() < deadline:
            active = [a for a in _alerts(drill) if a["kind"] == "stale_version" and a["active"]]
            if not active:
                cleared = round(time.time() - began, 2)
                break
            time.sleep(0.25)
        r.measured["finding_cleared_s"] = cleared
        drained = fleet.drain()
        outcomes = fleet.outcomes()
        r.lost_steps = sum(1 for o in outcomes.values() if not o["done"])
        r.repeated_steps = sum(max(0, len(o["done"]) - 1) for o in outcomes.values())
        r.invariants = invariants.serving(outcomes, drained)
        blamed = _blamed(drill, [*healthy, good_canary], t0)
        r.measured.update(healthy_findings=blamed, requests=len(outcomes))
        r.measured["versions_served"] = sorted(
            {
                f"{o['done'][0]['model_version']}/{o['done'][0]['kv_schema']}"
                for o in outcomes.values()
                if o["done"]
            }
        )
        r.invariants["healthy_versions_not_blamed"] = not blamed
        r.invariants["mismatch_cleared_after_rollback"] = cleared is not None
    finally:
        fleet.stop_all()


def run(drill: Drill) -> None:
    {"serving_worker_exit": worker_exit, "canary_switch": canary_switch}[drill.spec.name](drill)
