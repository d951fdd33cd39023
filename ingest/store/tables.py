"""The telemetry tables ingest COPYs into: their columns, in the order COPY lines are built.

One definition of each COPY column list, shared by the batch writer (which formats one text
line per record in this order) and the benchmarks. Must not hold live-state SQL.
"""

from __future__ import annotations

from django.db import connection

COLUMNS: dict[str, tuple[str, ...]] = {
    "devicesample": (
        "ts",
        "node_id",
        "gpu",
        "index",
        "temp_c",
        "power_w",
        "sm_clock_mhz",
        "mem_clock_mhz",
        "util_pct",
        "mem_used_bytes",
        "ecc_sbe",
        "ecc_dbe",
        "retired_or_remapped_pending",
        "throttle_reasons",
        "nvlink_errors",
        "pcie_replays",
        "mem_util_pct",
    ),
    "deviceevent": ("ts", "node_id", "gpu", "event", "code", "detail", "recovery_action"),
    "steprecord": (
        "ts",
        "node_id",
        "group_id",
        "generation",
        "stale",
        "rank",
        "step",
        "tokens",
        "data_cursor",
        "duration_ms",
        "phases",
        "loss",
        "grad_norm",
        "loss_scale",
        "overflow",
        "model_flops",
        "hw_flops",
        "lr",
    ),
    "collectivewindow": ("ts", "node_id", "group_id", "generation", "stale", "rank", "entries"),
    "processgroupsrecord": ("ts", "node_id", "group_id", "generation", "stale", "rank", "groups"),
    "processrecord": (
        "ts",
        "node_id",
        "group_id",
        "generation",
        "stale",
        "rank",
        "event",
        "pid",
        "gpu",
        "exit_code",
        "signal",
        "reason",
        "error_type",
        "message",
        "launcher_root_cause",
    ),
    "checkpointrecord": (
        "ts",
        "node_id",
        "group_id",
        "generation",
        "stale",
        "checkpoint_id",
        "step",
        "phase",
        "manifest",
        "duration_ms",
        "detail",
        "data_cursor",
    ),
    "transitionrecord": (
        "ts",
        "node_id",
        "group_id",
        "generation",
        "stale",
        "from_state",
        "to_state",
        "reason",
        "restart_count",
        "world_size",
        "topology",
        "data_cursor",
        "model_version",
    ),
    "servingwindow": (
        "ts",
        "node_id",
        "group_id",
        "generation",
        "stale",
        "worker",
        "model_version",
        "adapter_version",
        "kv_schema",
        "ready",
        "draining",
        "window",
    ),
    "proberecord": (
        "ts",
        "node_id",
        "group_id",
        "generation",
        "stale",
        "probe",
        "rank",
        "worker",
        "step",
        "value",
        "checksum",
        "duration_ms",
        "model_version",
    ),
    # -- host, network and kernel evidence
    "hostevent": ("ts", "node_id", "event", "device", "code", "pid", "comm", "severity"),
    "netevent": (
        "ts",
        "node_id",
        "port",
        "link",
        "event",
        "state",
        "rate_gbps",
        "prev_rate_gbps",
        "counters",
    ),
    "netsample": ("ts", "node_id", "port", "link", "state", "rate_gbps", "counters", "interval_s"),
    "hostsample": (
        "ts",
        "node_id",
        "mem_some_avg10",
        "mem_full_avg10",
        "io_full_avg10",
        "swap_used_bytes",
        "swap_total_bytes",
        "d_state",
        "disks",
    ),
}

COPY_SQL = {
    # Columns quoted: "window" is reserved.
    table: "COPY ingest_{} ({}) FROM STDIN".format(table, ", ".join(f'"{c}"' for c in cols))
    for table, cols in COLUMNS.items()
}


def copy_rows(rows: dict[str, list[str]]) -> None:
    """One COPY per table, each from one string of its lines."""
    with connection.connection.cursor() as raw:
        for table, lines in rows.items():
            with raw.copy(COPY_SQL[table]) as copy:
                copy.write("".join(lines))
