"""Xid classification: what an NVIDIA Xid code means and what an operator should do.

Owns only the table and its lookup. Meanings follow NVIDIA's Xid catalogue; the `action`
is the conservative first response the console proposes (a human approves it).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class XidInfo:
    code: int
    name: str
    meaning: str
    action: str
    severity: str  # "critical" (node/GPU must leave service) | "error" | "warning"


_TABLE = (
    XidInfo(48, "dbe", "double-bit ECC error (uncorrectable)", "drain_and_reset_gpu", "critical"),
    XidInfo(
        62,
        "internal_micro_controller_halt",
        "internal micro-controller halt",
        "drain_and_reset_gpu",
        "critical",
    ),
    XidInfo(
        63,
        "row_remap_pending",
        "ECC page retirement or row remapping recorded",
        "reset_gpu_when_idle",
        "warning",
    ),
    XidInfo(
        64,
        "row_remap_failure",
        "ECC page retirement or row remapping failed",
        "drain_and_rma_gpu",
        "critical",
    ),
    XidInfo(
        74,
        "nvlink_error",
        "NVLink error (link down, CRC or replay failure)",
        "drain_and_check_nvlink",
        "critical",
    ),
    XidInfo(
        79, "fallen_off_bus", "GPU has fallen off the bus", "drain_and_reboot_node", "critical"
    ),
    XidInfo(92, "high_sbe_rate", "high single-bit ECC error rate", "schedule_gpu_check", "warning"),
    XidInfo(
        94,
        "contained_ecc",
        "contained ECC error (only the affected app is hit)",
        "restart_workload",
        "error",
    ),
    XidInfo(
        95,
        "uncontained_ecc",
        "uncontained ECC error (all apps on the GPU affected)",
        "drain_and_reset_gpu",
        "critical",
    ),
    XidInfo(119, "gsp_rpc_timeout", "GSP RPC timeout", "drain_and_reset_gpu", "critical"),
    XidInfo(120, "gsp_error", "GSP firmware error", "drain_and_reset_gpu", "critical"),
    XidInfo(
        140,
        "unrecovered_ecc",
        "ECC unrecovered error (memory not usable)",
        "drain_and_reset_gpu",
        "critical",
    ),
    XidInfo(
        154,
        "recovery_action_changed",
        "GPU recovery action changed (reset or reboot required)",
        "follow_recovery_action",
        "critical",
    ),
)
XIDS: dict[int, XidInfo] = {info.code: info for info in _TABLE}


def classify(code: int) -> XidInfo:
    """The table entry for `code`, or a generic entry that asks a human to look."""
    known = XIDS.get(code)
    if known is not None:
        return known
    return XidInfo(
        code, "unknown", f"Xid {code} (not in the classification table)", "investigate", "error"
    )


def detail(code: int) -> str:
    """A short, bounded `device_event.detail` for an Xid."""
    info = classify(code)
    return f"{info.meaning}; action: {info.action}"[:256]
