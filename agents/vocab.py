"""The shared vocabularies: group states, GPU health, severities, hardware faults, and the
action output limit. Each is spelled here once and imported everywhere else.

Beside the wire contract (agents/protocol.py, which types its records with these) and, like
agents/wire.py, standard library only and pure constants: the node agent imports it without
msgspec, the diagnosis engine and policy without Django, and the console derives its model
choices and the pages' JSON from it. tests/test_vocab.py fails when a second definition of
any of these sets or of the limit appears elsewhere in the source tree.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

# -- group states ----------------------------------------------------------------------------
# What a `transition` record may carry (the protocol's GroupState) and so what a group's
# state can be; no state is the service's own.
INITIALIZING: Final = "initializing"
RUNNING: Final = "running"
QUIESCING: Final = "quiescing"
CHECKPOINTING: Final = "checkpointing"
RECOVERING: Final = "recovering"
COMPLETED: Final = "completed"
FAILED: Final = "failed"
STOPPED: Final = "stopped"

# A Literal must spell its values; the assertion below keeps it equal to the names above.
GroupStateName = Literal[
    "initializing",
    "running",
    "quiescing",
    "checkpointing",
    "recovering",
    "completed",
    "failed",
    "stopped",
]
GROUP_STATES: Final[tuple[str, ...]] = get_args(GroupStateName)
assert GROUP_STATES == (  # noqa: S101 - an import-time check that the two spellings agree
    INITIALIZING,
    RUNNING,
    QUIESCING,
    CHECKPOINTING,
    RECOVERING,
    COMPLETED,
    FAILED,
    STOPPED,
)
# The group has ended: nothing of it runs until a new generation starts it again.
TERMINAL_GROUP_STATES: Final = frozenset({COMPLETED, FAILED, STOPPED})

# -- GPU and node health ---------------------------------------------------------------------
HEALTH_OK: Final = "ok"
HEALTH_UNKNOWN: Final = "unknown"
HEALTH_WARNING: Final = "warning"
HEALTH_CRITICAL: Final = "critical"
HEALTH_DOWN: Final = "down"  # a node the service has not heard from (the silence sweep)
# Best to worst: a node is as healthy as its worst GPU; a grid cell shows the worst.
HEALTH_ORDER: Final[tuple[str, ...]] = (
    HEALTH_OK,
    HEALTH_UNKNOWN,
    HEALTH_WARNING,
    HEALTH_CRITICAL,
    HEALTH_DOWN,
)

# -- severities ------------------------------------------------------------------------------
SEVERITY_CRITICAL: Final = "critical"
SEVERITY_MAJOR: Final = "major"
SEVERITY_MINOR: Final = "minor"
SEVERITY_INFO: Final = "info"
# Most to least severe: incidents and findings sort by it.
SEVERITY_ORDER: Final[tuple[str, ...]] = (
    SEVERITY_CRITICAL,
    SEVERITY_MAJOR,
    SEVERITY_MINOR,
    SEVERITY_INFO,
)
SEVERITY_RANK: Final[dict[str, int]] = {s: i for i, s in enumerate(SEVERITY_ORDER)}

# -- hardware faults -------------------------------------------------------------------------
# Device events (`device_event.event`) that are faults of the hardware itself: the GPU goes
# critical at once and the fault latches its node (or only the GPU) out of service.
XID: Final = "xid"
GPU_LOST: Final = "gpu_lost"
ECC_DBE: Final = "ecc_dbe"
ROW_REMAP_FAILURE: Final = "row_remap_failure"
# An Xid is one only when its class is hardware (agents/xid.py); the others always are.
HARDWARE_FAULT_KINDS: Final = frozenset({XID, GPU_LOST, ECC_DBE, ROW_REMAP_FAILURE})

# -- remediation actions ---------------------------------------------------------------------
# The most characters of a command's output an action's result keeps: the agent clips to
# it before sending and the service clips anything longer again.
ACTION_OUTPUT_LIMIT: Final = 4096
