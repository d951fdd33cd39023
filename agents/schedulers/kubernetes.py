"""The action contract on Kubernetes through `kubectl`, outcome read from `get node -o json`.

Owns the kubectl command lines and reading the node back. Kubernetes records no reason on
a cordon, so Faultline marks what it takes out with the annotation `faultline.io/taken-out`
(`faultline: <action id> <reason>`): a node cordoned without it was taken out by someone
else and is left alone (take out) or refused (put back, unless params.force). GPUs are
kept free with one NoSchedule taint per GPU. restart_group is workload-specific: it runs
through a hook (`[hooks] restart_group`), so this backend answers "unsupported" for it. It
also reads which jobs the node's running pods belong to, for the agent to attest.
Never run against a real API server here: tests use recorded kubectl outputs.
"""

from __future__ import annotations

import json
import re
from typing import Any

from agents import actions_contract as contract
from agents.schedulers.base import Runner

ANNOTATION = "faultline.io/taken-out"
QUARANTINE_TAINT = "faultline.io/quarantine"
_TAKE_OUT = frozenset(k for k, spec in contract.KINDS.items() if spec.node_out)


def gpu_taint_key(gpu: str) -> str:
    """`faultline.io/gpu-<uuid>`: a taint key's name part is ≤ 63 of [a-z0-9-._]."""
    name = re.sub(r"[^a-z0-9.\-_]", "-", gpu.lower().removeprefix("gpu-"))
    return f"faultline.io/gpu-{name}"[: len("faultline.io/") + 63].rstrip("-._")


def _label_value(text: str) -> str:
    """A taint value: ≤ 63 of [A-Za-z0-9-._], starting and ending alphanumeric."""
    return re.sub(r"[^A-Za-z0-9.\-_]", "-", text)[:63].strip("-._") or "faultline"


def parse_node(text: str) -> dict[str, Any] | None:
    """`kubectl get node N -o json` → {"unschedulable", "taints", "taken_out", "ready"}."""
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("kind") != "Node":
        return None
    spec = doc.get("spec") or {}
    meta = doc.get("metadata") or {}
    taints = [
        f"{t.get('key')}={t.get('value', '')}:{t.get('effect')}"
        for t in spec.get("taints") or []
        if isinstance(t, dict)
    ]
    ready = ""
    for cond in (doc.get("status") or {}).get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == "Ready":
            ready = str(cond.get("status", ""))
    return {
        "name": meta.get("name", ""),
        "unschedulable": bool(spec.get("unschedulable", False)),
        "taints": taints,
        "taken_out": str((meta.get("annotations") or {}).get(ANNOTATION, "")),
        "ready": ready,
    }


# The labels that name the job a pod belongs to: a batch Job, a Kubeflow PyTorchJob (and
# the other training operators), a JobSet. The first one a pod carries is its job.
JOB_LABELS = (
    "batch.kubernetes.io/job-name",
    "job-name",
    "training.kubeflow.org/job-name",
    "jobset.sigs.k8s.io/jobset-name",
)


def parse_pod_jobs(text: str) -> list[str] | None:
    """`kubectl get pods -o json` (a PodList) → the jobs its pods belong to; None when the
    output is not a pod list."""
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("items"), list):
        return None
    jobs: set[str] = set()
    for pod in doc["items"]:
        labels = ((pod or {}).get("metadata") or {}).get("labels") or {}
        job = next((labels[k] for k in JOB_LABELS if labels.get(k)), None)
        if isinstance(job, str):
            jobs.add(job)
    return sorted(jobs)


def has_taint(info: dict[str, Any], key: str) -> bool:
    return any(t.startswith(f"{key}=") for t in info.get("taints", []))


def parse_drain(output: str, node: str) -> dict[str, Any]:
    """What `kubectl drain` said: pods it evicted and whether it finished (`node/N drained`)."""
    return {
        "drained": f"node/{node} drained" in output,
        "evicting": re.findall(r"^evicting pod (\S+)$", output, re.M),
        "evicted": re.findall(r"^pod/(\S+) evicted$", output, re.M),
    }


class Kubernetes:
    name = "kubernetes"
    kinds = contract.BACKEND_KINDS["kubernetes"]

    def read_node(self, run: Runner, node: str) -> dict[str, Any] | None:
        got = run("kubectl", "get", "node", node, "-o", "json")
        return parse_node(got.out) if got.ok else None

    def jobs_on(self, run: Runner, node: str) -> list[str] | None:
        """The jobs of the pods running on `node` (their job labels, `JOB_LABELS`)."""
        selector = f"spec.nodeName={node},status.phase=Running"
        got = run("kubectl", "get", "pods", "-A", "--field-selector", selector, "-o", "json")
        return parse_pod_jobs(got.out) if got.ok else None

    # -- the command lines -----------------------------------------------------------
    def _commands(self, action: dict[str, Any], node: str) -> list[list[str]]:
        kind = action["kind"]
        mark = ["kubectl", "annotate", "node", node, "--overwrite"]
        if kind == contract.CORDON_NODE:
            return [
                ["kubectl", "cordon", node],
                [*mark, f"{ANNOTATION}={contract.reason_text(action)}"],
            ]
        if kind in (contract.DRAIN_NODE, contract.QUARANTINE_NODE):
            timeout = contract.drain_timeout_s(contract.params_of(action))
            cmds = [
                ["kubectl", "cordon", node],
                [*mark, f"{ANNOTATION}={contract.reason_text(action)}"],
                [
                    "kubectl",
                    "drain",
                    node,
                    "--ignore-daemonsets",
                    "--delete-emptydir-data",
                    f"--timeout={timeout}s",
                ],
            ]
            if kind == contract.QUARANTINE_NODE:
                value = _label_value(f"action-{action.get('id')}")
                cmds.append(
                    [
                        "kubectl",
                        "taint",
                        "node",
                        node,
                        "--overwrite",
                        f"{QUARANTINE_TAINT}={value}:NoSchedule",
                    ]
                )
            return cmds
        if kind == contract.UNCORDON_NODE:
            return [
                ["kubectl", "uncordon", node],
                ["kubectl", "taint", "node", node, f"{QUARANTINE_TAINT}:NoSchedule-"],
                ["kubectl", "annotate", "node", node, f"{ANNOTATION}-"],
            ]
        gpu = contract.gpu_id(action)
        if kind == contract.ISOLATE_GPU:
            value = _label_value(f"action-{action.get('id')}")
            return [
                [
                    "kubectl",
                    "taint",
                    "node",
                    node,
                    "--overwrite",
                    f"{gpu_taint_key(gpu)}={value}:NoSchedule",
                ]
            ]
        if kind == contract.RELEASE_GPU:
            return [["kubectl", "taint", "node", node, f"{gpu_taint_key(gpu)}:NoSchedule-"]]
        return []

    def plan(self, action: dict[str, Any], *, node: str) -> list[list[str]]:
        return self._commands(action, contract.node_name(action, node))

    # -- acting ----------------------------------------------------------------------
    def run(self, action: dict[str, Any], *, node: str, runner: Runner) -> contract.Result:
        kind = action["kind"]
        if kind not in self.kinds:
            return contract.result(
                "unsupported",
                f'kubernetes backend cannot run {kind}: configure [hooks] {kind} = "..." '
                "(restart_group is specific to the workload's controller)",
                scheduler=self.name,
            )
        node = contract.node_name(action, node)
        if kind in (contract.ISOLATE_GPU, contract.RELEASE_GPU) and not contract.gpu_id(action):
            return contract.result("error", f'{kind} needs params.gpu or target "gpu:<uuid>"')
        before = self.read_node(runner, node)
        if before is None:
            return contract.result("error", f"kubernetes: node {node} not found", target=node)
        ours = contract.is_faultline_reason(before["taken_out"])
        params = contract.params_of(action)
        common: dict[str, Any] = {"target": node, "before": before}

        # A node Faultline cordoned may still need draining or the quarantine taint: the
        # commands are idempotent, so only a plain cordon of Faultline's is "already".
        if (
            kind in _TAKE_OUT
            and before["unschedulable"]
            and (kind == contract.CORDON_NODE or not ours)
        ):
            state = "already" if ours else "held_by_other"
            who = f"by faultline: {before['taken_out']}" if ours else "not by faultline"
            text = f"node {node} already cordoned ({who}): left as it is"
            return contract.result(
                state, text, after=before, taken_out_by="faultline" if ours else "other", **common
            )
        if kind == contract.UNCORDON_NODE:
            if not before["unschedulable"] and not has_taint(before, QUARANTINE_TAINT):
                return contract.result(
                    "already", f"node {node} already schedulable", after=before, **common
                )
            if before["unschedulable"] and not ours and params.get("force") is not True:
                text = (
                    f"refused: node {node} was cordoned by someone else (no {ANNOTATION} "
                    "annotation); params.force=true returns it anyway"
                )
                return contract.result(
                    "refused", text, after=before, taken_out_by="other", **common
                )
        key = (
            gpu_taint_key(contract.gpu_id(action))
            if kind in (contract.ISOLATE_GPU, contract.RELEASE_GPU)
            else ""
        )
        if kind == contract.ISOLATE_GPU and has_taint(before, key):
            return contract.result(
                "already", f"GPU taint {key} already on {node}", after=before, **common
            )
        if kind == contract.RELEASE_GPU and not has_taint(before, key):
            return contract.result(
                "already", f"no GPU taint {key} on {node}", after=before, **common
            )

        code: int | None = 0
        drain: dict[str, Any] = {}
        try:
            commands = self._commands(action, node)
        except ValueError as exc:  # a param the executor should have refused already
            return contract.result("error", f"refused: {exc}", **common)
        for argv in commands:
            # kubectl drain stops itself at --timeout; the runner must not kill it first.
            wait = contract.drain_timeout_s(params) + 30 if argv[1] == "drain" else None
            ran = runner(*argv, timeout_s=max(wait, runner.timeout_s) if wait else None)
            removing = argv[-1].endswith("-")
            if ran.argv[1] == "drain":
                drain = parse_drain(ran.out, node)
            if not ran.ok and not (removing and "not found" in ran.out):
                code = ran.code
                if ran.argv[1] in ("cordon", "uncordon"):
                    break  # nothing else makes sense if the node did not change
        after = self.read_node(runner, node) or {}
        applied = self._holds(kind, after, key) and (not drain or drain["drained"])
        text = (
            f"node {node}: unschedulable {before['unschedulable']} -> {after.get('unschedulable')}"
        )
        if drain:
            finished = "finished" if drain["drained"] else "did not finish"
            text += f"; drain {finished}, evicted {len(drain['evicted'])} pod(s)"
        extra = {"drain": drain} if drain else {}
        return contract.result(
            "applied" if applied else "not_applied",
            text,
            exit_code=code,
            after=after,
            taken_out_by="faultline" if applied and kind in _TAKE_OUT else "",
            **common,
            **extra,
        )

    def _holds(self, kind: str, after: dict[str, Any], key: str) -> bool:
        if not after:
            return False
        if kind in _TAKE_OUT:
            marked = contract.is_faultline_reason(after.get("taken_out", ""))
            quarantined = kind != contract.QUARANTINE_NODE or has_taint(after, QUARANTINE_TAINT)
            return bool(after["unschedulable"]) and marked and quarantined
        if kind == contract.UNCORDON_NODE:
            return not after["unschedulable"] and not has_taint(after, QUARANTINE_TAINT)
        if kind == contract.ISOLATE_GPU:
            return has_taint(after, key)
        if kind == contract.RELEASE_GPU:
            return not has_taint(after, key)
        return False
