"""The action contract on Slurm through `scontrol`, `sinfo` and `squeue`.

Owns the Slurm command lines and reading their outcome back: a node's state and reason
before acting (so a node someone else drained is left alone and said so) and after (the
result is what Slurm shows, not the exit code). Slurm has one way to take a node out that
lets running work end (`state=drain`): cordon_node, drain_node and quarantine_node all use
it; stopping the job is restart_group's act (`scontrol requeue`), and only of a job that runs
on this node (the service's group names the job, but the node acts on its own allocations
only). Slurm cannot take one GPU out without a reconfiguration, so isolate_gpu/release_gpu
are "unsupported" here (a hook may do it). It must not cancel jobs or change a reason it
did not write. It also reads which jobs run on the node: the agent attests them
(agents.schedulers.Attestation).
"""

from __future__ import annotations

import re
import time
from typing import Any

from agents import actions_contract as contract
from agents.schedulers.base import Runner

REQUEUE_SETTLE_S = 15.0
_TAKE_OUT = frozenset(k for k, spec in contract.KINDS.items() if spec.node_out)
# A requeued job is held back and pending, or already started again.
_REQUEUED_STATES = frozenset(
    {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "RUNNING"}
)
# Slurm appends "[user@time]" to a reason; without it, the reason ends at the next Key=.
_REASON = re.compile(r"\bReason=(?P<reason>.*?) \[(?P<by>[^@\]\s]+)@(?P<at>[^\]\s]+)\]")
_BARE_REASON = re.compile(r"\bReason=(?P<reason>.*?)(?= [A-Z][A-Za-z]+=|$)")


def parse_node(line: str) -> dict[str, str]:
    """`scontrol show node N -o` → {"flags": "IDLE+DRAIN", "reason", "by", "at"}."""
    line = line.strip()
    flags = re.search(r"\bState=(\S+)", line)
    info = {"flags": flags.group(1) if flags else "", "reason": "", "by": "", "at": ""}
    match = _REASON.search(line)
    if match:
        info.update(by=match.group("by"), at=match.group("at"))
    match = match or _BARE_REASON.search(line)
    if match:
        info["reason"] = match.group("reason").strip()
        if info["reason"] == "(null)":
            info["reason"] = ""
    return info


def parse_job(line: str) -> dict[str, str]:
    """`scontrol show job J -o` → {"state", "restarts", "reason", "nodes"}."""
    fields = dict(re.findall(r"\b(JobState|Restarts|Reason|NodeList|BatchHost)=(\S*)", line))
    return {
        "state": fields.get("JobState", ""),
        "restarts": fields.get("Restarts", ""),
        "reason": fields.get("Reason", ""),
        "nodes": fields.get("NodeList", ""),
    }


def out_of_service(flags: str) -> bool:
    parts = set(flags.upper().rstrip("*~#!%$@^-").split("+"))
    return bool(parts & {"DRAIN", "DRAINED", "DRAINING", "DOWN", "FAIL", "FAILING"})


class Slurm:
    name = "slurm"
    kinds = contract.BACKEND_KINDS["slurm"]

    # -- reading ---------------------------------------------------------------------
    def read_node(self, run: Runner, node: str) -> dict[str, str] | None:
        shown = run("scontrol", "show", "node", node, "-o")
        if not shown.ok or f"NodeName={node} " not in shown.out + " ":
            return None
        info = parse_node(shown.out.splitlines()[0] if shown.out else "")
        # sinfo's word (idle, drained, draining, down, mixed...) is what operators read.
        state = run("sinfo", "-h", "-n", node, "-o", "%T")
        info["state"] = state.out.strip().splitlines()[0] if state.ok and state.out.strip() else ""
        return info

    def jobs_on(self, run: Runner, node: str) -> list[str] | None:
        """The jobs allocated on `node` (running, completing, suspended): each job's id and,
        for an array task, its `<array>_<task>` id too. None when squeue cannot say."""
        listed = run("squeue", "-h", "-w", node, "-o", "%A %i")
        if not listed.ok:
            return None
        return sorted({word for line in listed.out.splitlines() for word in line.split()})

    def runs_on(self, run: Runner, job: str, node: str) -> bool:
        """`job` is allocated on `node` (squeue's node filter reads the job's allocation)."""
        listed = run("squeue", "-h", "-j", job, "-w", node, "-o", "%A")
        return listed.ok and bool(listed.out.split())

    def read_job(self, run: Runner, job: str) -> dict[str, str] | None:
        shown = run("scontrol", "show", "job", job, "-o")
        if not shown.ok or f"JobId={job} " not in shown.out:
            return None
        info = parse_job(shown.out)
        queued = run("squeue", "-h", "-j", job, "-o", "%T")
        info["squeue"] = queued.out.strip() if queued.ok else ""
        return info

    # -- planning (dry run) ----------------------------------------------------------
    def plan(self, action: dict[str, Any], *, node: str) -> list[list[str]]:
        kind = action["kind"]
        target = contract.node_name(action, node)
        if kind == contract.RESTART_GROUP:
            job = contract.job_id(action) or "<job>"
            return [
                ["squeue", "-h", "-j", job, "-w", node, "-o", "%A"],
                ["scontrol", "requeue", job],
            ]
        if kind in _TAKE_OUT:
            reason = contract.reason_text(action)
            return [["scontrol", "update", f"nodename={target}", "state=drain", f"reason={reason}"]]
        if kind == contract.UNCORDON_NODE:
            return [["scontrol", "update", f"nodename={target}", "state=resume"]]
        return []

    # -- acting ----------------------------------------------------------------------
    def run(self, action: dict[str, Any], *, node: str, runner: Runner) -> contract.Result:
        kind = action["kind"]
        if kind in _TAKE_OUT:
            return self._take_out(action, contract.node_name(action, node), runner)
        if kind == contract.UNCORDON_NODE:
            return self._resume(action, contract.node_name(action, node), runner)
        if kind == contract.RESTART_GROUP:
            return self._requeue(action, node, runner)
        return contract.result(
            "unsupported",
            f"slurm backend cannot run {kind} (Slurm isolates a GPU only by reconfiguring "
            f'gres); configure [hooks] {kind} = "..."',
            scheduler=self.name,
        )

    def _take_out(self, action: dict[str, Any], node: str, run: Runner) -> contract.Result:
        before = self.read_node(run, node)
        if before is None:
            return contract.result("error", f"slurm: node {node} unknown to scontrol", target=node)
        if out_of_service(before["flags"]):
            ours = contract.is_faultline_reason(before["reason"])
            state = "already" if ours else "held_by_other"
            who = "faultline" if ours else "other"
            text = (
                f"node {node} already out of service ({before['state']}, reason "
                f'"{before["reason"]}" by {before["by"] or "?"}): left as it is'
            )
            return contract.result(
                state, text, target=node, before=before, after=before, taken_out_by=who
            )
        reason = contract.reason_text(action)
        done = run("scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}")
        after = self.read_node(run, node) or {}
        applied = out_of_service(after.get("flags", "")) and after.get("reason") == reason
        state = "applied" if applied else "not_applied"
        text = f"node {node}: {before['state']} -> {after.get('state', '?')}"
        return contract.result(
            state,
            text,
            exit_code=done.code,
            target=node,
            before=before,
            after=after,
            taken_out_by="faultline" if applied else "",
        )

    def _resume(self, action: dict[str, Any], node: str, run: Runner) -> contract.Result:
        before = self.read_node(run, node)
        if before is None:
            return contract.result("error", f"slurm: node {node} unknown to scontrol", target=node)
        if not out_of_service(before["flags"]):
            text = f"node {node} already in service ({before['state']})"
            return contract.result(
                "already", text, target=node, before=before, after=before, taken_out_by=""
            )
        params = contract.params_of(action)
        ours = contract.is_faultline_reason(before["reason"])
        if not ours and params.get("force") is not True:
            text = (
                f'refused: node {node} was taken out by someone else (reason "{before["reason"]}"'
                f" by {before['by'] or '?'}); params.force=true returns it anyway"
            )
            return contract.result(
                "refused", text, target=node, before=before, after=before, taken_out_by="other"
            )
        done = run("scontrol", "update", f"nodename={node}", "state=resume")
        after = self.read_node(run, node) or {}
        applied = bool(after) and not out_of_service(after.get("flags", ""))
        text = f"node {node}: {before['state']} -> {after.get('state', '?')}"
        return contract.result(
            "applied" if applied else "not_applied",
            text,
            exit_code=done.code,
            target=node,
            before=before,
            after=after,
            taken_out_by="" if applied else before.get("by", ""),
        )

    def _requeue(self, action: dict[str, Any], node: str, run: Runner) -> contract.Result:
        job = contract.job_id(action)
        if not job.isdigit() and not re.fullmatch(r"\d+_\d+", job):
            return contract.result(
                "error", f'restart_group needs params.job = a Slurm job id, got "{job}"'
            )
        before = self.read_job(run, job)
        if before is None:
            return contract.result("error", f"slurm: job {job} unknown to scontrol", target=job)
        if before["state"] in ("PENDING", "REQUEUED", "REQUEUE_HOLD"):
            # Not running: it starts again by itself, on nodes still in service.
            text = f"job {job} is {before['state']} already: it restarts when scheduled"
            return contract.result("already", text, target=job, before=before, after=before)
        if not self.runs_on(run, job, node):
            # The group's job id came from the service: act only on a job of this node's
            # allocations, never on another user's job elsewhere.
            text = (
                f"refused: job {job} does not run on node {node} (its nodes: "
                f"{before['nodes'] or '?'}); a node requeues only its own jobs"
            )
            return contract.result("refused", text, target=job, before=before, after=before)
        done = run("scontrol", "requeue", job)
        after = self.read_job(run, job) or {}
        # Slurm first shows COMPLETING (Restarts already +1) while it stops the job's steps,
        # then PENDING: wait, bounded, for it to be queued again.
        deadline = time.monotonic() + REQUEUE_SETTLE_S
        while after.get("state") == "COMPLETING" and time.monotonic() < deadline:
            time.sleep(0.25)
            after = self.read_job(run, job) or {}
        restarted = after.get("restarts", "") != before["restarts"]
        applied = restarted and after.get("state") in _REQUEUED_STATES
        text = (
            f"job {job}: {before['state']} (restarts {before['restarts']}) -> "
            f"{after.get('state', '?')} (restarts {after.get('restarts', '?')})"
        )
        return contract.result(
            "applied" if applied else "not_applied",
            text,
            exit_code=done.code,
            target=job,
            before=before,
            after=after,
        )
