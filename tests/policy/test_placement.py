"""The remediation policy over the per-placement table of docs/safety.md, as written there.

The table is read from the document, so the policy and what the document promises cannot
drift apart: each row is a root cause, each column where it sits (idle node, node hosting
ranks, launcher-only host, serving worker), each cell the action kinds proposed. A fault
on a node that hosts a group is planned as the node's incident and as the group's root
cause; the cell is what both propose together (one per kind and target). Pure: no Django.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents import actions_contract as contract
from console.policy import remediation as rp

DOC = Path(__file__).resolve().parents[2] / "docs" / "safety.md"
SAFE = {"auto_restart_safe": True, "reason": "restart from c7", "checkpoint": "c7"}
COLUMNS = {
    "idle node": rp.IDLE,
    "node hosting ranks": rp.RANKS,
    "launcher-only host": rp.LAUNCHER,
    "serving worker": rp.SERVING,
}
K8S = rp.RemediationPolicy.from_dict({"default": {"scheduler": "kubernetes"}})
SLURM = rp.RemediationPolicy()


def _table() -> dict[str, dict[str, list[str]]]:
    """The rows under "### Per placement": {root cause: {placement: [kinds]}}."""
    text = DOC.read_text()
    section = text.split("### Per placement", 1)[1].split("\n### ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[1:] == list(COLUMNS), header
    rows: dict[str, dict[str, list[str]]] = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = {
            COLUMNS[name]: re.findall(r"`([a-z_]+)`", cell) if cell != "none" else []
            for name, cell in zip(header[1:], cells[1:], strict=True)
        }
    return rows


# Each row of the document as causes: (kind, evidence, scheduler policy).
ROWS: dict[str, list[tuple[str, dict[str, object], rp.RemediationPolicy]]] = {
    "hardware fault on a GPU (Xid of class hardware, `ecc_dbe`), Slurm": [
        ("xid", {"code": 79, "takes_gpu_out": True}, SLURM),
        ("ecc_dbe", {}, SLURM),
    ],
    "hardware fault on a GPU, Kubernetes": [
        ("xid", {"code": 48, "takes_gpu_out": True}, K8S),
        ("ecc_dbe", {}, K8S),
    ],
    "`gpu_lost`": [("gpu_lost", {}, SLURM), ("gpu_lost", {}, K8S)],
    "`row_remap_failure` (a GPU out of spare rows), Slurm": [("row_remap_failure", {}, SLURM)],
    "`nic_down`, `disk_full`": [
        ("nic_down", {"port": "mlx5_0/1"}, SLURM),
        ("disk_full", {"root": "/ckpt"}, SLURM),
        ("nic_down", {"port": "mlx5_0/1"}, K8S),
    ],
    "`node_silent`": [("node_silent", {}, SLURM), ("node_silent", {}, K8S)],
    "Xid of class application": [("xid", {"code": 13, "takes_gpu_out": False}, SLURM)],
}


# Node faults a group's diagnosis also finds as its root cause (console/diagnosis/rules/
# device.py): a failed row remap is not one (the Xid or DBE before it is).
GROUP_ROOT_CAUSES = frozenset({"xid", "ecc_dbe", "gpu_lost"})


def _node_cause(kind: str, evidence: dict[str, object], placement: str) -> rp.Cause:
    gpu = None if kind in rp.CONDITION_KINDS | rp.SILENCE_KINDS else "GPU-7"
    return rp.Cause(
        kind=kind,
        subject=f"gpu:{gpu}" if gpu else "node:n7",
        finding=f"hardware:{gpu or 'n7'}@1",
        summary=f"{kind} on n7",
        evidence={**evidence, "node": "n7", "gpu": gpu or ""},
        node="n7",
        gpu=gpu,
        incident=1,
        placement=placement,
        reporting=kind not in rp.SILENCE_KINDS,
        controller_reporting=True,
    )


def _group_cause(node_cause: rp.Cause, placement: str) -> rp.Cause:
    """The same fault as a group's root cause (a device fault the group's diagnosis finds)."""
    return rp.Cause(
        kind=node_cause.kind,
        subject=node_cause.subject,
        finding="fp-group",
        summary=node_cause.summary,
        evidence=node_cause.evidence,
        recovery=SAFE,
        node="n7",
        gpu=node_cause.gpu,
        group="train" if placement == rp.RANKS else "serve",
        job="4242" if placement == rp.RANKS else None,
        incident=2,
        placement=placement,
        reporting=node_cause.reporting,
    )


def planned(
    kind: str, evidence: dict[str, object], pol: rp.RemediationPolicy, placement: str
) -> list[str]:
    """What the service plans for this fault here: the node's incident, then each group's."""
    with_controller = rp.RemediationPolicy(
        default=rp.PoolPolicy(**{**pol.default.__dict__, "controller": "ctl"})
    )
    cause = _node_cause(kind, evidence, placement)
    kinds: list[str] = []
    keys: set[tuple[str, str]] = set()
    causes = [cause]
    if placement in (rp.RANKS, rp.SERVING) and kind in GROUP_ROOT_CAUSES:
        causes.append(_group_cause(cause, placement))
    for c in causes:
        out = rp.plan(c, with_controller, keys)
        keys |= {p.key for p in out.proposals}
        kinds += [p.kind for p in out.proposals]
    return kinds


def test_the_document_has_a_row_for_every_cause_the_test_plans() -> None:
    assert set(_table()) == set(ROWS)


@pytest.mark.parametrize("row", sorted(ROWS))
@pytest.mark.parametrize("placement", list(COLUMNS.values()))
def test_the_policy_proposes_what_the_placement_table_says(row: str, placement: str) -> None:
    want = _table()[row][placement]
    for kind, evidence, pol in ROWS[row]:
        got = planned(kind, evidence, pol, placement)
        assert got == want, f"{kind} on a {placement} node ({pol.default.scheduler}): {got}"


def test_a_launcher_only_host_says_why_nothing_is_taken_out() -> None:
    out = rp.plan(_node_cause("xid", {"code": 79, "takes_gpu_out": True}, rp.LAUNCHER), SLURM)
    assert out.proposals == ()
    assert "launcher-only host" in out.notes[0]


def test_every_proposal_of_the_table_is_one_its_agent_can_run() -> None:
    for row in ROWS.values():
        for kind, evidence, pol in row:
            for placement in COLUMNS.values():
                cause = _node_cause(kind, evidence, placement)
                for p in rp.plan(cause, pol).proposals:
                    assert contract.problems(p.kind, dict(p.params), p.target) == []
                    assert pol.default.can_run(p.kind)


@given(
    kind=st.sampled_from(sorted(rp.NODE_SCOPE_KINDS)),
    placement=st.sampled_from(rp.PLACEMENTS),
    scheduler=st.sampled_from(sorted(contract.BACKEND_KINDS)),
    reporting=st.booleans(),
    controller=st.sampled_from(["", "ctl"]),
    controller_reporting=st.booleans(),
    node_out=st.booleans(),
)
def test_it_never_takes_out_a_launcher_host_and_routes_only_what_an_agent_can_run(
    kind: str,
    placement: str,
    scheduler: str,
    reporting: bool,
    controller: str,
    controller_reporting: bool,
    node_out: bool,
) -> None:
    """The space around the table: any node-scope fault, anywhere, any scheduler, the node
    heard or not, a controller or none. A launcher-only host is never taken out; a
    silent node's action goes to the controller only for a kind a controller runs, and
    says why it waits when no agent can run it now; nothing is proposed twice."""
    pol = rp.RemediationPolicy.from_dict(
        {"default": {"scheduler": scheduler, "controller": controller}}
    )
    cause = rp.Cause(
        kind=kind,
        subject="node:n7",
        finding="f",
        evidence={"node": "n7", "takes_gpu_out": True},
        node="n7",
        gpu=None if kind in rp.CONDITION_KINDS | rp.SILENCE_KINDS else "GPU-7",
        placement=placement,
        reporting=reporting and kind not in rp.SILENCE_KINDS,
        controller_reporting=controller_reporting,
        node_out=node_out,
    )
    out = rp.plan(cause, pol)
    if placement == rp.LAUNCHER:
        assert out.proposals == () and out.waits == ()
        return
    assert len({p.key for p in out.proposals}) == len(out.proposals)
    for p in out.proposals:
        assert pol.default.can_run(p.kind), p
        if cause.reporting:
            assert p.executor is None
        elif p.executor is not None:
            assert p.executor == controller and p.kind in contract.CONTROLLER_KINDS
        if (p.executor is None and not cause.reporting) or (
            p.executor and not controller_reporting
        ):
            assert out.waits, p
    if node_out:
        assert all(p.kind == contract.ISOLATE_GPU for p in out.proposals)
