"""Node and GPU health lifecycle: the states, the legal moves, and what clears each fault.

Owns the lifecycle vocabulary (`healthy → suspect → faulted → out_of_service → repairing →
validating → healthy`), the one table of what each fault kind needs before it clears
(`REPAIR_NEEDS`, the Xid rows read from the catalog in agents/xid.py), the validation
window and the repeat-offender rule. Plain Python over plain values: the caller passes
`now`; it must not touch the ORM, the clock or the network (console.actions.fleet stores
what it decides).

A clean sample never clears a fault. What clears one is evidence of repair (the node
rebooted: its agent's `boot_id` changed; or a recorded GPU reset) followed by a window with
no new fault in which every repaired GPU reported again, or an approver who says why. A
node Faultline took out for a condition rather than a fault (silent, a NIC down, a full
disk) latches when it is taken out and is repaired by the condition clearing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from agents import xid


class HealthState(StrEnum):
    HEALTHY = "healthy"
    SUSPECT = "suspect"
    FAULTED = "faulted"
    OUT_OF_SERVICE = "out_of_service"
    REPAIRING = "repairing"
    VALIDATING = "validating"


class Repair(StrEnum):
    """What a fault needs before the hardware may run work again."""

    NONE = "none"  # an application error: restart the job, the hardware stays in service
    # A condition of the node (silent, a NIC down, a full disk), not a broken part: it is
    # repaired when the agent shows the condition gone (or the node rebooted), each of
    # the node's open conditions (the caller checks that none is left).
    CONDITION = "condition"
    GPU_RESET = "gpu_reset"  # a GPU reset (or a reboot, which resets every GPU)
    NODE_REBOOT = "node_reboot"  # only a reboot clears it
    OPERATOR = "operator"  # mechanics, firmware, vendor support: a person says it is fixed


class TakenOutBy(StrEnum):
    """Who took the hardware out of service: Faultline may return only its own."""

    NOBODY = ""
    FAULTLINE = "faultline"
    OPERATOR = "operator"
    SCHEDULER = "scheduler"  # found already drained/cordoned by someone else


# States that carry a latched fault: new work must not land there.
LATCHED = frozenset(
    {
        HealthState.FAULTED,
        HealthState.OUT_OF_SERVICE,
        HealthState.REPAIRING,
        HealthState.VALIDATING,
    }
)

TRANSITIONS: dict[HealthState, frozenset[HealthState]] = {
    HealthState.HEALTHY: frozenset({HealthState.SUSPECT, HealthState.FAULTED}),
    HealthState.SUSPECT: frozenset({HealthState.HEALTHY, HealthState.FAULTED}),
    # Repair evidence that arrives after the fact (a new boot_id) goes straight to validating.
    HealthState.FAULTED: frozenset(
        {
            HealthState.OUT_OF_SERVICE,
            HealthState.REPAIRING,
            HealthState.VALIDATING,
            HealthState.HEALTHY,
        }
    ),
    HealthState.OUT_OF_SERVICE: frozenset(
        {
            HealthState.REPAIRING,
            HealthState.VALIDATING,
            HealthState.FAULTED,
            HealthState.HEALTHY,
        }
    ),
    HealthState.REPAIRING: frozenset(
        {HealthState.VALIDATING, HealthState.FAULTED, HealthState.HEALTHY}
    ),
    # A fault inside the window starts over; a passed window (or an approver) returns it.
    HealthState.VALIDATING: frozenset({HealthState.HEALTHY, HealthState.FAULTED}),
}


class HealthTransitionError(ValueError):
    """A lifecycle move the table does not allow."""


def check_move(current: str, target: str) -> HealthState:
    cur, tgt = HealthState(current), HealthState(target)
    if tgt in TRANSITIONS[cur]:
        return tgt
    options = ", ".join(sorted(s.value for s in TRANSITIONS[cur]))
    raise HealthTransitionError(
        f'cannot move from "{cur}" to "{tgt}"; from "{cur}" it may go to: {options}'
    )


# -- what each fault needs ------------------------------------------------------------------
# Xid immediate actions (NVIDIA's buckets in agents/xid.py) → the repair that clears them.
_XID_ACTION_REPAIR: dict[str, Repair] = {
    "RESTART_APP": Repair.NONE,
    "IGNORE": Repair.NONE,
    "RESET_GPU": Repair.GPU_RESET,
    "WORKFLOW_XID_48": Repair.GPU_RESET,
    "WORKFLOW_NVLINK_ERR": Repair.GPU_RESET,
    "WORKFLOW_NVLINK5_ERR": Repair.GPU_RESET,
    "CHECK_UVM": Repair.GPU_RESET,
    "RESTART_BM": Repair.NODE_REBOOT,
    "RESTART_VM": Repair.NODE_REBOOT,
    "CONTACT_SUPPORT": Repair.OPERATOR,
    "CHECK_MECHANICALS": Repair.OPERATOR,
    "UPDATE_SWFW": Repair.OPERATOR,
}
# The driver's recovery action (device_event.recovery_action) overrides the Xid row.
_RECOVERY_REPAIR: dict[str, Repair] = {
    "gpu_reset": Repair.GPU_RESET,
    "drain_and_reset": Repair.GPU_RESET,
    "drain_p2p": Repair.GPU_RESET,
    "node_reboot": Repair.NODE_REBOOT,
}
# Device events that are faults whatever they carry.
REPAIR_NEEDS: dict[str, Repair] = {
    "ecc_dbe": Repair.GPU_RESET,
    "gpu_lost": Repair.NODE_REBOOT,  # a GPU off the bus comes back only with a reboot
    # No spare rows left: NVIDIA's guidance is a field diagnostic and, failing it, an RMA.
    "row_remap_failure": Repair.OPERATOR,
}


# A `device_event` the agent (or a site hook) sends after `nvidia-smi -r` succeeded: the
# recorded GPU reset that answers a `gpu_reset` need.
GPU_RESET_EVENT = "gpu_reset"
# Repair evidence of a condition: the agent reports again, the link is up, the disk has room.
CONDITION_CLEARED = "condition_cleared"


def xid_needs(code: int | None, recovery_action: str | None = None) -> Repair:
    """The repair an Xid needs: none for application (and informational, consequence)
    classes; for a hardware class (or a driver recovery action) the catalog's action."""
    if recovery_action in _RECOVERY_REPAIR:
        return _RECOVERY_REPAIR[recovery_action]
    info = xid.classify(code)
    if xid.effective_class(info, recovery_action) != xid.HARDWARE:
        return Repair.NONE
    return _XID_ACTION_REPAIR.get(info.immediate, Repair.OPERATOR)


def repair_needed(
    event: str, code: int | None = None, recovery_action: str | None = None
) -> Repair:
    """What a device event needs before its GPU may run work again (NONE: no latch)."""
    if event == "xid":
        return xid_needs(code, recovery_action)
    if recovery_action in _RECOVERY_REPAIR:
        return _RECOVERY_REPAIR[recovery_action]
    return REPAIR_NEEDS.get(event, Repair.NONE)


def repaired_by(needed: str, evidence: str) -> bool:
    """Whether this repair evidence ("node_reboot", "gpu_reset") answers this need.

    A reboot resets every GPU; a GPU reset does not reboot the node; an operator-only
    repair is answered by no automatic evidence (a person returns it).
    """
    if needed == Repair.NONE:
        return True
    if needed == Repair.OPERATOR:
        return False
    if evidence == Repair.NODE_REBOOT:
        return True
    if needed == Repair.CONDITION:
        return evidence == CONDITION_CLEARED
    return evidence == Repair.GPU_RESET and needed == Repair.GPU_RESET


# -- validation and repeat offenders --------------------------------------------------------
@dataclass(frozen=True)
class HealthPolicy:
    validation_window: timedelta = timedelta(minutes=10)
    repeat_faults: int = 3
    repeat_window: timedelta = timedelta(days=7)


def validation_passed(
    validating_since: datetime,
    now: datetime,
    policy: HealthPolicy,
    gpus: Iterable[tuple[datetime | None, datetime | None]] = (),
) -> bool:
    """Medik8s-style: the repaired hardware ran a whole window with no new fault, and each
    repaired GPU (`gpus`: when it began validating, when it last reported) was heard from
    after its repair. A new boot id says the node rebooted; it says nothing of a GPU that
    has not reported since (a GPU still off the bus, or a reboot that was only a new id).
    """
    if now - validating_since < policy.validation_window:
        return False
    return all(seen is not None and seen > (since or validating_since) for since, seen in gpus)


def repeat_offender(fault_times: Iterable[datetime], now: datetime, policy: HealthPolicy) -> bool:
    """N faults (this one included) inside the window: flag for replacement, not return.

    The caller asks twice: with one GPU's faults, and with every fault episode of the
    node (on any of its GPUs, or the node's own): faults spread over several GPUs point
    at the node (its board, power, cooling) as surely as repeats of one GPU.
    """
    since = now - policy.repeat_window
    return sum(1 for t in fault_times if t >= since) >= policy.repeat_faults


# -- silence of many nodes at once --------------------------------------------------------
# Nodes found silent in one sweep: at least this many, and at least this share of the nodes
# reporting until then, more likely lost the path to Faultline (its ingest, a proxy, the
# network, DNS) than each had a fault of its own. One fleet incident names them all, rather
# than an incident and a page per node: a 16k-rank bench whose nodes' liveness paused for
# 10 s had one sweep open 1,345 node incidents.
MASS_SILENCE_NODES = 16
MASS_SILENCE_SHARE = 0.25


def mass_silence(silent: int, reporting: int) -> bool:
    """Whether `silent` nodes going quiet together, of `reporting` (the silent included),
    is one event of the fleet's, not `silent` node faults. A small fleet never is: below
    MASS_SILENCE_NODES each node keeps its own incident."""
    return silent >= MASS_SILENCE_NODES and silent >= MASS_SILENCE_SHARE * max(reporting, 1)


# -- a node's conditions: a port down, a full local disk -----------------------------------
# A checkpoint root's disk with at most this share free is full (the diagnosis engine's
# disk_full uses the same 1 %); it is free again above twice that, so a disk hovering at
# the line does not open and resolve an incident every sample.
DISK_FULL_FRACTION = 0.01
DISK_CLEAR_FRACTION = 0.02


def port_up(state: str | None) -> bool:
    """An InfiniBand port ACTIVE, an Ethernet interface up (agents/host.py's reading)."""
    return (state or "").upper() in ("ACTIVE", "UP")


def disk_full(free: int | None, total: int | None, *, fraction: float = DISK_FULL_FRACTION) -> bool:
    return free is not None and bool(total) and free / float(total or 1) <= fraction


def local_disk(device: str | None) -> bool:
    """Whether a checkpoint root's filesystem source is the node's own: a network
    filesystem (`server:/export`, Lustre's `10.0.0.1@o2ib:/fs`) full is not a node's
    condition, and is the same on every node that mounts it."""
    return bool(device) and ":" not in (device or "") and "@" not in (device or "")


def condition_hold(
    kind: str, since: datetime, now: datetime, *, others: int, reporting: int
) -> str:
    """Why a node is not taken out for a NIC down or a full disk now ('' when it may be):
    it has not lasted TAKE_OUT_AFTER (a link flap, a disk being cleaned), the same
    checkpoint root is full on another node too (a shared filesystem, not this disk), or
    so many nodes lost a port at once that the fabric is more likely than each node."""
    if kind == "disk_full" and others:
        return (
            f"the same checkpoint root is full on {others} other node(s): a shared "
            "filesystem, not this node's disk; no node is taken out for it"
        )
    if kind == "nic_down" and mass_silence(others + 1, reporting):
        return (
            f"{others + 1} of {reporting} nodes lost a port together: more likely the "
            "fabric (a switch) than each node; none is taken out for it"
        )
    if now - since < TAKE_OUT_AFTER:
        return (
            f"{kind.replace('_', ' ')} since {since:%H:%M:%S} UTC: a node is taken out once "
            f"it has lasted {TAKE_OUT_AFTER.total_seconds():.0f} s"
        )
    return ""


# -- remediation of a silent node ----------------------------------------------------------
# A node silent this long (after the sweep marked it down), or a condition this old, may be
# taken out (a silent one by a controller agent, since its own cannot be heard): long
# enough for nodes going quiet over a few sweeps to be seen as the one fleet silence they
# are (none of them is taken out) and for a link flap to come back, short against the
# scheduler placing the next job on a dead node.
TAKE_OUT_AFTER = timedelta(seconds=30)
SILENT_TAKE_OUT_AFTER = TAKE_OUT_AFTER


def silence_hold(
    silent_since: datetime | None,
    now: datetime,
    *,
    fleet_silence: bool,
    silent: int,
    reporting: int,
) -> str:
    """Why a silent node is not taken out now ('' when it may be): a fleet silence is open,
    the nodes silent right now are a mass (`mass_silence`, over every silent node, not one
    sweep's: a path that fails over a minute is still the path), or it has not been silent
    SILENT_TAKE_OUT_AFTER yet."""
    if fleet_silence:
        return (
            "a fleet silence is open (many nodes went quiet together): more likely the path "
            "to Faultline than this node; no node is taken out for it"
        )
    if mass_silence(silent, reporting):
        return (
            f"{silent} of {reporting} nodes are silent: more likely the path to Faultline "
            "than each node; none is taken out for silence"
        )
    if silent_since is None or now - silent_since < SILENT_TAKE_OUT_AFTER:
        since = f"since {silent_since:%H:%M:%S} UTC" if silent_since is not None else "just now"
        return (
            f"silent {since}: a silent node is taken out once it has been silent "
            f"{SILENT_TAKE_OUT_AFTER.total_seconds():.0f} s"
        )
    return ""
