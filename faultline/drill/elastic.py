"""The zero-glue row: a plain torchrun job under `python -m agents.torchrun`, judged by REST.

Owns the `torchrun_restart` drill: faultline.drill.elastic_job (a script that imports
nothing of Faultline) on 2 gloo ranks under `python -m agents.torchrun --max-restarts 1`
with the drill's group as its rendezvous id; rank 1 raises in generation 0, torchrun
restarts the job, generation 1 finishes. The launcher and its workers report through the
drill node's agent and nothing else: no trainer flags, no launcher stand-in. The row checks
what the console says through its REST API: the root cause (`exception` on rank 1), the
launcher's own root cause beside it (torchrun's first observed failure) and whether they
agree, and that the group reached generation 1 and completed. Must not judge faults itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime
from typing import Any

from faultline.drill.util import wait
from faultline.embedded import free_port

Drill = Any  # faultline.drill.runner.Drill (runner imports this module: no cycle)

FAULT_RANK = 1
DETECT_TIMEOUT_S = 60.0  # torchrun starts its ranks (a torch import each) before the fault
RUN_TIMEOUT_S = 240.0


def _ts(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def torchrun_restart(drill: Drill) -> None:
    r = drill.result
    log_path = drill.work / "logs" / f"{drill.group}-torchrun.log"
    log_path.parent.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_"))}
    env.update(
        FAULTLINE_REPORTER_SOCKET=str(drill.socket),
        PYTHONWARNINGS="ignore",
        # torch's torchrun shares its rendezvous store across restarts, and a
        # restarted gloo generation reads the old one's addresses (docs/integrations.md).
        TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
    )
    cmd = [
        sys.executable,
        "-m",
        "agents.torchrun",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{free_port()}",
        "--rdzv-id",
        drill.group,
        "--monitor-interval",
        "0.1",
        "-m",
        "faultline.drill.elastic_job",
        "--steps",
        "5",
        "--pause-s",
        "1.0",
        "--raise-at",
        f"0:{FAULT_RANK}:3",
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        found = wait(lambda: drill.incidents(), DETECT_TIMEOUT_S, interval=0.5)
        drill.lap("detect")
        if not found:
            raise RuntimeError(f"no incident for {drill.group} (see {log_path})")
        incident = drill.service.api(f"/api/v1/incidents/{found[0]['id']}/")
        r.found_root_cause = incident["kind"]
        r.incident = incident["id"]
        r.other_root_causes = [f"{i['kind']} {i['subject']}" for i in found[1:]]
        first = (incident.get("root_cause") or {}).get("first_seen")
        if first:
            r.detection_s = round(_ts(incident["opened_at"]) - _ts(first), 2)
        advice = incident.get("recovery") or {}
        r.auto_restart_safe = advice.get("auto_restart_safe")
        r.advice_correct = r.auto_restart_safe == drill.spec.expected_auto_restart_safe
        launcher = incident.get("launcher_root_cause") or {}
        r.measured.update(
            culprit=incident["subject"],
            torchrun_root_cause_rank=launcher.get("rank"),
            torchrun_agrees=launcher.get("agrees"),
            message=launcher.get("message"),
        )
        code = proc.wait(RUN_TIMEOUT_S)
        drill.lap("run")
        done = wait(lambda: (g := drill.group_info()) and g.get("state") == "completed" and g, 15)
        group = done or drill.group_info() or {}
        r.invariants = {
            "culprit_rank": incident["subject"] == f"rank:{drill.group}/{FAULT_RANK}",
            "torchrun_root_cause_shown": launcher.get("rank") == FAULT_RANK,
            "restarted_to_generation_1": group.get("generation") == 1,
            "completed": code == 0 and group.get("state") == "completed",
        }
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
