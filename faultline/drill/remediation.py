"""`faultline drill --remediation`: time the remediation loop from a hardware fault.

Owns one drill: a real service (`faultline up` on free ports), a real agent with
`scheduler = "slurm"`, and a scheduler — the real one-node slurmctld + slurmd of
faultline/testing/slurm.py where the packages and root allow it, else the demo's fake
`scontrol` (faultline/demo/fake_slurm.py); the report says which. A training group with a
valid checkpoint runs as a scheduler job on the node; an Xid 79 goes in through ingest;
the remediation policy proposes drain_node and restart_group, the drill's gate policy
auto-approves both (so the figures are the machine's, not an approver's), the agent's
Slurm backend drains the node and requeues the job. Figures: fault → node out of service
on the scheduler, and fault → job requeued off it (on a one-node cluster it then waits for
a node in service). Everything started is stopped before it returns.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from console.policy.lifecycle import TERMINAL

GROUP = "drill-remediation"
POLICY = {
    "gates": {
        "auto_approve": {"drain_node": ["xid"], "restart_group": ["xid"]},
        "max_nodes_out_per_pool": 1,
        "max_nodes_out_fleet": 1,
    },
    "remediation": {"default": {"scheduler": "slurm", "take_out": "drain_node"}},
}
# An action that reached one of these never succeeds later.
ENDED = frozenset(str(s) for s in TERMINAL) - {"succeeded"}


class _Scheduler:
    """The real Slurm harness or the fake scontrol, behind the few calls the drill needs."""

    def __init__(self, work: Path, *, fake: bool) -> None:
        from faultline.testing import slurm as harness

        self.why_fake = "--fake-scheduler given" if fake else harness.slurm_available()
        self.real: Any = None
        if not self.why_fake:
            self.real = harness.start_slurm()
            self.node, self.env = self.real.node, dict(self.real.env)
            self.kind = "real Slurm (slurmctld + slurmd)"
        else:
            from faultline.demo import fake_slurm

            self.env = fake_slurm.install(work / "fake-slurm")
            self.node = "drill-node"
            self.kind = f"fake scontrol (real Slurm not used: {self.why_fake})"

    def run(self, *argv: str) -> str:
        out = subprocess.run(
            list(argv),
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
        return out.stdout.strip()

    def submit(self, work: Path) -> str:
        if self.real is None:
            return "10001"  # the fake takes an unseen job id as running
        job = self.run(
            "sbatch", "--parsable", f"--chdir={work}", "--output=/dev/null", "--wrap", "sleep 600"
        ).split(";")[0]
        _until(lambda: self.run("squeue", "-h", "-j", job, "-o", "%T") == "RUNNING", 30)
        return job

    def reason(self) -> str:
        return (
            self.run("sinfo", "-h", "-n", self.node, "-o", "%E")
            if self.real
            else (_fake_reason(self.env))
        )

    def stop(self, job: str | None) -> None:
        if self.real is None:
            return
        from faultline.testing import slurm as harness

        if job:
            self.run("scancel", "--quiet", job)
        harness.stop_slurm(self.real)


def _fake_reason(env: dict[str, str]) -> str:
    from faultline.demo import fake_slurm

    state = fake_slurm.state(Path(env[fake_slurm.STATE_ENV]))
    nodes: list[dict[str, Any]] = list(state["nodes"].values())
    return str(nodes[0].get("reason", "")) if nodes else ""


def _until(check: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.1)
    raise TimeoutError(f"gave up after {timeout:g} s")


def _records(node: str, job: str, start: datetime) -> list[dict[str, Any]]:
    from agents.fake_nvml import fake_uuid
    from agents.wire import iso_ts

    def ts(s: float) -> str:
        return iso_ts((start + timedelta(seconds=s)).timestamp())

    manifest = {
        "shards": [{"path": "rank0.pt", "bytes": 4096, "sha256": "ab" * 32}],
        "total_bytes": 4096,
    }
    out: list[dict[str, Any]] = [
        {
            "kind": "transition",
            "group": GROUP,
            "generation": 1,
            "from_state": "initializing",
            "to_state": "running",
            "restart_count": 0,
            "world_size": 1,
            "job": job,
            "ts": ts(0),
        },
        {
            "kind": "process",
            "group": GROUP,
            "generation": 1,
            "rank": 0,
            "event": "started",
            "pid": 100,
            "gpu": fake_uuid(node, 0),
            "ts": ts(0),
        },
        {
            "kind": "checkpoint",
            "group": GROUP,
            "generation": 1,
            "checkpoint_id": "step-4",
            "step": 4,
            "phase": "committed",
            "manifest": manifest,
            "ts": ts(4.5),
        },
    ]
    out += [
        {
            "kind": "step",
            "group": GROUP,
            "generation": 1,
            "rank": 0,
            "step": s,
            "tokens": 2048,
            "duration_ms": 1000.0,
            "loss": 2.5,
            "ts": ts(s),
        }
        for s in range(8)
    ]
    return out


def _ingest(url: str, token: str, node: str, records: list[dict[str, Any]], seq: int) -> None:
    import urllib.request

    from agents.wire import iso_ts

    body = {
        "agent": {"id": f"drill-{node}", "node": node, "version": "drill"},
        "seq": seq,
        "sent_at": iso_ts(),
        "records": records,
    }
    request = urllib.request.Request(  # noqa: S310 - the drill's own service, http://127.0.0.1
        url + "/api/v1/ingest",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - as above
        if response.status != 202:
            raise RuntimeError(f"ingest answered {response.status}")


def _report(path: Path, records: list[dict[str, Any]]) -> None:
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        for rec in records:
            sock.sendto(json.dumps(rec).encode(), str(path))


def _group_seen(svc: Any) -> bool:
    try:
        group = svc.api(f"/api/v1/groups/{GROUP}/")
    except Exception:  # noqa: BLE001 - not there yet (404) while the agent's batch travels
        return False
    return group.get("state") == "running"


def _safe(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception as exc:  # noqa: BLE001 - the explanation must not hide the timeout
        return f"unreadable: {exc}"


def _state(svc: Any, sched: _Scheduler, agent_dir: Path) -> dict[str, Any]:
    """What the loop's pieces say now, through the REST API and the agent's own files:
    the actions (state, gate reasons, the agent's output), the group's incidents, the node,
    the breaker, the audit log's newest rows, and what the agent ran or refused."""
    keep = (
        "id",
        "kind",
        "target",
        "state",
        "group",
        "generation",
        "trigger",
        "gate_reasons",
        "proposed_at",
        "decided_at",
        "dispatched_at",
        "finished_at",
    )

    def actions() -> list[dict[str, Any]]:
        rows = svc.api("/api/v1/actions/?page_size=50")["results"]
        return [
            {
                **{k: a.get(k) for k in keep},
                "output": str((a.get("result") or {}).get("output") or "")[:300],
            }
            for a in rows
        ]

    def incidents() -> list[dict[str, Any]]:
        rows = svc.api("/api/v1/incidents/?page_size=50")["results"]
        return [
            {
                k: i.get(k)
                for k in (
                    "id",
                    "group",
                    "node",
                    "generation",
                    "kind",
                    "state",
                    "role",
                    "subject",
                    "summary",
                    "opened_at",
                )
            }
            for i in rows
        ]

    def audit() -> list[str]:
        rows = svc.api("/api/v1/audit/?page_size=40")["results"]
        return [
            f"{r.get('ts')} {r.get('actor')} {r.get('verb')} "
            f"{r.get('object_type')}:{r.get('object_id')} {str(r.get('reason'))[:200]}"
            for r in rows
        ]

    def agent() -> dict[str, Any]:
        ran = json.loads((agent_dir / "executor.json").read_text())
        log = (agent_dir / "agent.log").read_text().splitlines()[-20:]
        done = {
            k: f"{v.get('status')}: {str(v.get('output'))[:300]}"
            for k, v in ran.get("done", {}).items()
        }
        return {"done": done, "generations": ran.get("generations"), "log_tail": log}

    return {
        "scheduler_reason": _safe(sched.reason),
        "actions": _safe(actions),
        "incidents": _safe(incidents),
        "group": _safe(
            lambda: {
                k: v
                for k, v in svc.api(f"/api/v1/groups/{GROUP}/").items()
                if k in ("name", "state", "generation", "scheduler_job")
            }
        ),
        "node": _safe(
            lambda: {
                k: v
                for k, v in svc.api(f"/api/v1/nodes/{sched.node}/").items()
                if k not in ("devices", "history", "incidents")
            }
        ),
        "breaker": _safe(lambda: svc.api("/api/v1/breaker/")),
        "audit": _safe(audit),
        "agent": _safe(agent),
    }


def _explained(
    step: str, check: Callable[[], Any], timeout: float, dump: Callable[[], Path]
) -> Any:
    """`_until`, but a timeout says what the loop was waiting on and where its state went."""
    try:
        return _until(check, timeout)
    except TimeoutError as exc:
        where = dump()
        raise TimeoutError(f"{step}: {exc}; the loop's state is in {where}") from None


def run_drill(work: Path | None = None, *, fake: bool = False) -> dict[str, Any]:
    """Run the drill; returns its figures (seconds) and which scheduler ran it."""
    from agents.fake_nvml import fake_uuid
    from agents.wire import iso_ts
    from faultline.testing.service import BIN, start_service, stop_service

    work = work or Path(tempfile.mkdtemp(prefix="faultline-drill-remediation-"))
    work.mkdir(parents=True, exist_ok=True)
    policy = work / "remediation.json"
    policy.write_text(json.dumps(POLICY))
    os.environ["FAULTLINE_REMEDIATION_POLICY"] = str(policy)
    sched = _Scheduler(work, fake=fake)
    service, job = None, None
    try:
        service = svc = start_service(work / "service")
        token = svc.token(sched.node)
        state = work / "agent"
        state.mkdir(exist_ok=True)
        (state / "agent.toml").write_text('scheduler = "slurm"\naction_poll_s = 1\n')
        agent = subprocess.Popen(
            [
                str(BIN / "faultline-agent"),
                "run",
                "--config",
                str(state / "agent.toml"),
                "--server",
                service.url,
                "--token",
                token,
                "--node",
                sched.node,
                "--fake-gpus",
                "2",
                "--state-dir",
                str(state),
                "--log-level",
                "WARNING",
            ],
            env={**os.environ, **sched.env},
            stdout=subprocess.DEVNULL,
            stderr=open(state / "agent.log", "wb"),  # noqa: SIM115 - lives with the process
        )
        svc.agents.append(agent)
        _until(
            lambda: any(n["name"] == sched.node for n in svc.api("/api/v1/nodes/")["results"]), 60
        )
        # The node is listed from its token's enrolment, before the agent has bound its
        # socket: on a loaded box the job's records were sent to a socket not there yet.
        _until((state / "reporter.sock").exists, 60)
        job = sched.submit(work)
        history = _records(sched.node, job, datetime.now(UTC) - timedelta(seconds=10))
        # The job's records reach the service as a job's do: through the node agent's
        # reporter socket, so the agent knows which groups it hosts (a restart_group for a
        # group it never saw is refused).
        _report(state / "reporter.sock", history)
        _until(lambda: _group_seen(svc), 60)
        fault = time.monotonic()
        xid = {
            "kind": "device_event",
            "gpu": fake_uuid(sched.node, 0),
            "event": "xid",
            "code": 79,
            "detail": "GPU has fallen off the bus",
            "ts": iso_ts(),
        }
        _ingest(svc.url, token, sched.node, [xid], 1)

        def dump() -> Path:
            where = work / "remediation-state.json"
            where.write_text(json.dumps(_state(svc, sched, state), indent=2, default=str))
            return where

        _explained(
            "node never out of service on the scheduler",
            lambda: sched.reason().startswith("faultline:"),
            120,
            dump,
        )
        out_s = time.monotonic() - fault

        def requeued() -> bool:
            rows = [
                a for a in svc.api("/api/v1/actions/")["results"] if a["kind"] == "restart_group"
            ]
            if any(a["state"] == "succeeded" for a in rows):
                return True
            ended = [a for a in rows if a["state"] in ENDED]
            if ended and len(ended) == len(rows):
                # Nothing proposes it again for the same finding: waiting is pointless.
                out = str((ended[0].get("result") or {}).get("output") or "")[:200]
                gates = "; ".join(ended[0].get("gate_reasons") or [])
                why = out if ended[0]["state"] == "failed" else gates or out  # agent vs gate
                raise RuntimeError(
                    f"restart_group {ended[0]['id']} ended {ended[0]['state']}: {why}; "
                    f"the loop's state is in {dump()}"
                )
            return False

        _explained("restart_group never succeeded", requeued, 120, dump)
        requeue_s = time.monotonic() - fault
        return {
            "drill": "remediation",
            "scheduler": sched.kind,
            "fault_to_out_of_service_s": round(out_s, 2),
            "fault_to_job_requeued_s": round(requeue_s, 2),
            "reason": sched.reason(),
        }
    finally:
        if service is not None:
            stop_service(service)
        sched.stop(job)
