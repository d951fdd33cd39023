"""Stateful stand-ins for `scontrol`, `sinfo`, `squeue` and `kubectl`, installed on PATH.

Each call appends its argv to `calls.jsonl` and reads/writes one JSON state file, so a
backend's read-back sees what its own commands did. Output shapes are copied from Slurm
22.05 (`scontrol show node -o`, measured on this machine) and kubectl 1.29 (recorded).
These exist to test command lines and parsing; the real Slurm tests live in tests/system.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

SCRIPT = r"""
import json, os, sys
root = os.environ["FAKE_SCHED_DIR"]
tool = os.path.basename(sys.argv[0])
args = sys.argv[1:]
with open(os.path.join(root, "calls.jsonl"), "a") as f:
    f.write(json.dumps([tool, *args]) + "\n")
path = os.path.join(root, "state.json")
st = json.load(open(path))
def save():
    json.dump(st, open(path, "w"))
def node(name):
    return st["nodes"].setdefault(name, {"state": "IDLE", "reason": "", "unschedulable": False,
                                         "taints": [], "annotations": {}})
def kv(prefix):
    return next((a.split("=", 1)[1] for a in args if a.lower().startswith(prefix)), None)
if tool == "scontrol":
    if args[:2] == ["show", "node"]:
        n = node(args[2])
        reason = f" Reason={n['reason']} [root@2026-12-01T10:07:58]" if n["reason"] else ""
        print(f"NodeName={args[2]} CPUTot=2 State={n['state']} Partitions=debug{reason}")
    elif args[:2] == ["show", "job"]:
        j = st["jobs"].get(args[2])
        if j is None:
            print("slurm_load_jobs error: Invalid job id specified", file=sys.stderr); sys.exit(1)
        print(f"JobId={args[2]} JobName=wrap JobState={j['state']} Reason=None Requeue=1 "
              f"Restarts={j['restarts']} BatchFlag=1 NodeList={','.join(j.get('nodes', ['vm']))}")
    elif args[0] == "update":
        n = node(kv("nodename="))
        if kv("state=") == "drain":
            n["state"], n["reason"] = "IDLE+DRAIN", kv("reason=")
        elif kv("state=") == "resume":
            n["state"], n["reason"] = "IDLE", ""
        save()
    elif args[0] == "requeue":
        j = st["jobs"][args[1]]
        j["state"], j["restarts"] = "PENDING", j["restarts"] + 1
        save()
elif tool == "sinfo":
    n = node(args[args.index("-n") + 1])
    print("drained" if "DRAIN" in n["state"] else "idle")
elif tool == "squeue":
    # -w: only jobs allocated on that node (a pending job has none); -o %A / "%A %i": ids.
    on = args[args.index("-w") + 1] if "-w" in args else None
    ids = [args[args.index("-j") + 1]] if "-j" in args else list(st["jobs"])
    for jid in ids:
        j = st["jobs"].get(jid)
        if j is None or (on is not None and (on not in j.get("nodes", ["vm"])
                                             or j["state"] == "PENDING")):
            continue
        fmt = args[args.index("-o") + 1] if "-o" in args else "%T"
        print(fmt.replace("%A", jid).replace("%i", jid).replace("%T", j["state"]))
elif tool == "kubectl":
    verb = args[0]
    if verb == "get":
        n = node(args[2])
        spec = {"unschedulable": True} if n["unschedulable"] else {}
        taints = [dict(zip(("key", "value", "effect"), t)) for t in n["taints"]]
        if taints:
            spec["taints"] = taints
        print(json.dumps({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": args[2], "annotations": n["annotations"]}, "spec": spec,
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}))
    elif verb in ("cordon", "uncordon", "drain"):
        n = node(args[1])
        n["unschedulable"] = verb != "uncordon"
        print(f"node/{args[1]} {verb}ed" if verb != "drain" else
              f"node/{args[1]} cordoned\nevicting pod default/train-0\npod/train-0 evicted\n"
              f"node/{args[1]} drained")
        save()
    elif verb == "annotate":
        n = node(args[2])
        for a in args[3:]:
            if a.endswith("-") and "=" not in a:
                n["annotations"].pop(a[:-1], None)
            elif "=" in a and not a.startswith("--"):
                k, v = a.split("=", 1); n["annotations"][k] = v
        save()
    elif verb == "taint":
        n = node(args[2])
        for a in args[3:]:
            if a.startswith("--"):
                continue
            if a.endswith("-"):
                key = a[:-1].split(":")[0]
                if not any(t[0] == key for t in n["taints"]):
                    print(f'error: taint "{key}" not found', file=sys.stderr); sys.exit(1)
                n["taints"] = [t for t in n["taints"] if t[0] != key]
            else:
                kv_, effect = a.rsplit(":", 1); k, v = kv_.split("=", 1)
                n["taints"] = [t for t in n["taints"] if t[0] != k] + [[k, v, effect]]
        save()
    elif verb == "delete":
        print("pod \"train-0\" deleted")
"""

TOOLS = ("scontrol", "sinfo", "squeue", "kubectl")


class FakeSchedulers:
    """`install()` puts the fakes first on PATH; `calls()` is every argv, in order."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = root / "bin"
        self.bin.mkdir(parents=True, exist_ok=True)
        for tool in TOOLS:
            path = self.bin / tool
            path.write_text(f"#!{sys.executable}\n{SCRIPT}")
            path.chmod(0o755)
        self.set_state({"nodes": {}, "jobs": {}})

    def env(self) -> dict[str, str]:
        return {
            "PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}",
            "FAKE_SCHED_DIR": str(self.root),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        (self.root / "state.json").write_text(json.dumps(state))

    def state(self) -> dict[str, Any]:
        return json.loads((self.root / "state.json").read_text())

    def calls(self) -> list[list[str]]:
        path = self.root / "calls.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]
