"""The demo's stand-in for Slurm: `scontrol`, `sinfo` and `squeue` scripts over one JSON file.

Owns the fake scheduler the demo's agents drive through their real Slurm backend
(agents/schedulers/slurm.py, `scheduler = "slurm"` in each demo agent's config): node
drain/resume and job requeue are written to `<dir>/state.json` under a file lock (every
demo agent shares it), and read back in the output shapes of Slurm 22.05 that the backend
parses. It is a demo prop, never a scheduler: `faultline demo` cannot assume Slurm.
A job id it has not seen is taken as a running job (the demo's training groups report
a numeric `job` on their transitions). The real Slurm tests are tests/system.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

STATE_ENV = "FAULTLINE_FAKE_SLURM_DIR"
TOOLS = ("scontrol", "sinfo", "squeue")

SCRIPT = r"""
import fcntl, json, os, sys
root = os.environ["FAULTLINE_FAKE_SLURM_DIR"]
tool, args = os.path.basename(sys.argv[0]), sys.argv[1:]
lock = open(os.path.join(root, "lock"), "a")
fcntl.flock(lock, fcntl.LOCK_EX)
path = os.path.join(root, "state.json")
st = json.load(open(path)) if os.path.exists(path) else {"nodes": {}, "jobs": {}}
def save():
    tmp = path + ".tmp"
    json.dump(st, open(tmp, "w"), indent=1); os.replace(tmp, path)
def node(name):
    return st["nodes"].setdefault(name, {"state": "IDLE", "reason": ""})
def job(jid):
    return st["jobs"].setdefault(jid, {"state": "RUNNING", "restarts": 0})
def kv(prefix):
    return next((a.split("=", 1)[1] for a in args if a.lower().startswith(prefix)), None)
with open(os.path.join(root, "calls.jsonl"), "a") as f:
    f.write(json.dumps([tool, *args]) + "\n")
if tool == "scontrol" and args[:2] == ["show", "node"]:
    n = node(args[2]); save()
    reason = f" Reason={n['reason']} [root@demo]" if n["reason"] else ""
    print(f"NodeName={args[2]} CPUTot=8 State={n['state']} Partitions=demo{reason}")
elif tool == "scontrol" and args[:2] == ["show", "job"]:
    j = job(args[2]); save()
    print(f"JobId={args[2]} JobName={args[2]} JobState={j['state']} Reason=None Requeue=1 "
          f"Restarts={j['restarts']} BatchFlag=1 NodeList=demo")
elif tool == "scontrol" and args[:1] == ["update"]:
    n = node(kv("nodename="))
    if kv("state=") == "drain":
        n["state"], n["reason"] = "IDLE+DRAIN", kv("reason=") or ""
    elif kv("state=") == "resume":
        n["state"], n["reason"] = "IDLE", ""
    save()
elif tool == "scontrol" and args[:1] == ["requeue"]:
    j = job(args[1])
    # Queued again; the demo's workload restarts the group on a spare node itself.
    j["state"], j["restarts"] = "PENDING", j["restarts"] + 1
    save()
elif tool == "sinfo":
    n = node(args[args.index("-n") + 1])
    print("drained" if "DRAIN" in n["state"] else "idle")
elif tool == "squeue" and "-j" in args:
    print(job(args[args.index("-j") + 1])["state"])
else:
    print(f"fake {tool}: unsupported: {' '.join(args)}", file=sys.stderr); sys.exit(1)
"""


def install(root: Path) -> dict[str, str]:
    """Write the scripts under `root/bin`; returns the env the agents need (PATH first)."""
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for tool in TOOLS:
        path = bin_dir / tool
        path.write_text(f"#!{sys.executable}\n{SCRIPT}")
        path.chmod(0o755)
    return {STATE_ENV: str(root), "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}


def state(root: Path) -> dict[str, Any]:
    path = root / "state.json"
    return json.loads(path.read_text()) if path.exists() else {"nodes": {}, "jobs": {}}
