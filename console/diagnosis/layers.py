"""The layer a root cause blames: the one mapping from finding kind (and Xid) to layer.

Owns the reliability record's vocabulary of layers (GPU, HBM, NVLink, network, host,
storage, software, data, model, and `undetermined` for what nobody could place), the
category each layer belongs to (hardware or not: the share large-scale training reports
publish, ~78 % hardware for Llama 3) and `layer_of`, which the fleet report, the incident
page and the CLI all call. An Xid's layer is agents.xid's (`xid_layer`): the catalog knows
which codes are memory or link errors. Pure: no ORM, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agents.xid import xid_layer

GPU, HBM, NVLINK, NETWORK, HOST, STORAGE = "gpu", "hbm", "nvlink", "network", "host", "storage"
SOFTWARE, DATA, MODEL, UNDETERMINED = "software", "data", "model", "undetermined"
LAYERS: tuple[str, ...] = (
    GPU,
    HBM,
    NVLINK,
    NETWORK,
    HOST,
    STORAGE,
    SOFTWARE,
    DATA,
    MODEL,
    UNDETERMINED,
)
LAYER_LABELS: dict[str, str] = {
    GPU: "GPU",
    HBM: "HBM",
    NVLINK: "NVLink",
    NETWORK: "network",
    HOST: "host",
    STORAGE: "storage",
    SOFTWARE: "software",
    DATA: "data",
    MODEL: "model",
    UNDETERMINED: "undetermined",
}
HARDWARE_LAYERS = frozenset({GPU, HBM, NVLINK, NETWORK, HOST, STORAGE})
HARDWARE, WORKLOAD = "hardware", "workload"

# Finding kind -> layer (DESIGN §5 and the rule families' own kinds). `xid` is decided by
# its code; a kind missing here is `undetermined` (a test lists every kind the rules emit).
KIND_LAYER: dict[str, str] = {
    "gpu_lost": GPU,
    "thermal_throttle": GPU,
    "power_throttle": GPU,
    "straggler": GPU,
    "ecc_dbe": HBM,
    "row_remap_pending": HBM,
    "row_remap_failure": HBM,
    "nvlink_errors": NVLINK,
    "nvswitch_error": NVLINK,
    "network_slow": NETWORK,
    "network_partition": NETWORK,
    "collective_timeout": NETWORK,
    "split_brain": NETWORK,
    "node_down": HOST,
    "agent_silent": HOST,
    "clock_skew": HOST,
    "machine_check": HOST,
    "pcie_aer": HOST,
    "hung_task": HOST,
    "checkpoint_partial": STORAGE,
    "checkpoint_corrupt": STORAGE,
    "checkpoint_missing_shard": STORAGE,
    "checkpoint_modified": STORAGE,
    "checkpoint_failed": STORAGE,
    "disk_full": STORAGE,
    "io_error": STORAGE,
    "process_exit": SOFTWARE,
    "oom": SOFTWARE,
    "exception": SOFTWARE,
    "rank_hang": SOFTWARE,
    "group_stall": SOFTWARE,
    "collective_mismatch": SOFTWARE,
    "stale_generation": SOFTWARE,
    "non_monotonic": SOFTWARE,
    "slo_breach": SOFTWARE,
    "ready_before_loaded": SOFTWARE,
    "drained_worker_traffic": SOFTWARE,
    "duplicate_finish": SOFTWARE,
    "stale_version": SOFTWARE,
    "retry_storm": SOFTWARE,
    "worker_lost": SOFTWARE,
    "input_stall": DATA,
    "data_cursor_regression": DATA,
    "nan_loss": MODEL,
    "grad_explosion": MODEL,
    "loss_scale_collapse": MODEL,
    "probe_divergence": MODEL,
}


def layer_of(kind: str, evidence: Mapping[str, Any] | None = None) -> str:
    """The layer a root cause of `kind` blames (an Xid by its code in the evidence)."""
    if kind == "xid":
        code = (evidence or {}).get("code")
        return xid_layer(code if isinstance(code, int) else None)
    return KIND_LAYER.get(kind, UNDETERMINED)


def category_of(layer: str) -> str:
    """`hardware` for the machine's layers, else the layer itself (software, data, ...)."""
    return HARDWARE if layer in HARDWARE_LAYERS else layer
