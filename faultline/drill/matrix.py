"""The drill matrix: every row of the seed's fault-injection matrix, runnable here or not.

Owns the rows (`Spec`): what is injected, how (`inside` the rank via the trainer's
`--fault`, or from outside by the runner), what the console must name and advise, and
whether the row runs for real on this machine, with fakes, or not at all (and why). Must
not run anything: faultline.drill.runner does.
"""

from __future__ import annotations

from dataclasses import dataclass

# Late enough that the step-5 checkpoint is committed AND hashed by the agent: restart
# advice needs a verified checkpoint, and the drill judges that advice.
FAULT_STEP = 14
FAULT_RANK = 1

REAL = "real"  # a real gloo job, a real fault
FAKE = "fake"  # a real job, the hardware signal from fake NVML (labelled so)
NOT_HERE = "not run here"


@dataclass(frozen=True)
class Spec:
    """One row of the drill matrix."""

    name: str
    fault: str  # what is injected, in words
    expected_root_cause: str | None
    expected_auto_restart_safe: bool | None
    inside: str = ""  # fault fired inside the rank (trainer --fault)
    restore: bool = True
    quick: bool = True
    # Two ranks by default; a straggler or a probe majority needs three.
    world: int = 2
    fault_step: int = FAULT_STEP  # for inside faults
    runs: str = REAL
    why: str = ""  # for FAKE and NOT_HERE rows: what is faked or missing
    layer: str = "process"  # the seed's taxonomy layer, for the printed matrix
    network: bool = False  # needs ip netns / tc / nft (faultline.drill.prereqs)


MATRIX: tuple[Spec, ...] = (
    # -- worker / process -------------------------------------------------------------
    Spec("kill", "SIGKILL rank 1", "process_exit", True),
    Spec(
        "clean_exit",
        "rank 1 calls sys.exit(0) mid-run",
        "process_exit",
        True,
        inside="clean_exit",
        quick=False,
    ),
    # The stopped rank says nothing; its peers block in the next collective and their
    # agents.torch watchdogs report where they wait, so the console names the rank that
    # never arrived (undetermined: no exit or device evidence, so no automatic restart).
    Spec("hang", "SIGSTOP rank 1", "rank_hang", False, quick=False),
    # The step after a checkpoint carries its phase, which excused silence for 30 min;
    # now the grace is relative to the checkpoint's measured duration (10 s floor here).
    Spec(
        "hang_after_checkpoint",
        "rank 1 stops right after the step carrying the step-10 checkpoint",
        "rank_hang",
        False,
        inside="hang_after_ckpt",
        fault_step=11,
    ),
    Spec("oom", "torch.OutOfMemoryError in rank 1", "oom", True, inside="oom"),
    # -- collective ------------------------------------------------------------------------
    Spec(
        "fail_before_collective",
        "rank 1 raises before entering the step's all_reduce",
        "exception",
        True,
        inside="raise_before_collective",
        quick=False,
        layer="collective",
    ),
    Spec(
        "fail_after_collective",
        "rank 1 raises after the all_reduce, before its optimizer step",
        "exception",
        True,
        inside="raise_after_collective",
        quick=False,
        layer="collective",
    ),
    Spec(
        "stale_generation",
        "restart while generation 1 keeps writing",
        "split_brain",
        False,
        layer="control",
    ),
    # -- data --------------------------------------------------------------------------------
    Spec(
        "slow",
        "rank 1 sleeps in its input phase (3 ranks)",
        "input_stall",
        True,
        inside="slow",
        restore=False,
        quick=False,
        world=3,
        layer="data",
    ),
    Spec(
        "data_read_timeout",
        "rank 1's read of its next sample never returns",
        "rank_hang",
        False,
        inside="read_timeout",
        quick=False,
        layer="data",
    ),
    Spec(
        "bad_sample",
        "a malformed sample (wrong width) reaches rank 1's model",
        "exception",
        True,
        inside="bad_sample",
        quick=False,
        layer="data",
    ),
    Spec(
        "cursor_mismatch",
        "rank 1's data cursor jumps back 10 steps (its sampler restarted)",
        "data_cursor_regression",
        False,
        inside="cursor_mismatch",
        quick=False,
        layer="data",
    ),
    # -- model -------------------------------------------------------------------------------
    Spec(
        "nan",
        "NaN loss from a poisoned sample in rank 1",
        "nan_loss",
        False,
        inside="nan",
        layer="model",
    ),
    # Byzantine-like: nothing crashes, the loss stays finite; only the fixed-input probe
    # (every 5 steps, compared across ranks) says which rank went wrong.
    Spec(
        "silent_corruption",
        "rank 1's weights silently perturbed (3 ranks)",
        "probe_divergence",
        False,
        inside="corrupt_weights",
        fault_step=12,
        world=3,
        layer="model",
    ),
    # -- checkpoint ----------------------------------------------------------------------------
    Spec(
        "corrupt_checkpoint",
        "truncate a committed DCP shard",
        "checkpoint_modified",
        False,
        layer="storage",
    ),
    Spec(
        "ckpt_shard_missing",
        "delete a shard of the committed, verified step-10 checkpoint",
        "checkpoint_modified",
        False,
        quick=False,
        layer="storage",
    ),
    Spec(
        "ckpt_shard_duplicated",
        "a second copy of a shard appears in the committed step-10 checkpoint",
        "checkpoint_modified",
        False,
        quick=False,
        layer="storage",
    ),
    Spec(
        "ckpt_partial_manifest",
        "the DCP .metadata (the checkpoint's manifest) of step 10 is lost after commit",
        "checkpoint_modified",
        False,
        quick=False,
        layer="storage",
    ),
    # -- observer ------------------------------------------------------------------------------
    Spec(
        "telemetry_down",
        "the whole Faultline service SIGSTOPped for 8 s mid-run",
        None,
        None,
        restore=False,
        layer="observer",
    ),
    # -- network (real namespaces, tc and nftables) -------------------------------------------
    Spec(
        "slow_link",
        "tc tbf 2 mbit on node 1's link (3 nodes in their own network namespaces)",
        "network_slow",
        True,
        restore=False,
        quick=False,
        world=3,
        layer="network",
        network=True,
    ),
    Spec(
        "lossy_link",
        "nftables numgen random drop of 20 % of node 1's packets (3 namespaces)",
        "network_slow",
        True,
        restore=False,
        quick=False,
        world=3,
        layer="network",
        network=True,
    ),
    Spec(
        "partition",
        "node 2's link down (3 namespaces): {0, 1} vs {2}",
        "rank_hang",
        False,
        restore=False,
        quick=False,
        world=3,
        layer="network",
        network=True,
    ),
    # -- device (fake NVML: no GPU here) ---------------------------------------------------
    Spec(
        "xid",
        "Xid 79 on rank 1's GPU (fake NVML control file)",
        "xid",
        True,
        quick=False,
        runs=FAKE,
        why="no GPU here: the Xid comes from the agent's fake NVML backend",
        layer="device",
    ),
    # -- rows that cannot run here ---------------------------------------------------------
    Spec(
        "clock_throttle",
        "SM clock throttling on one GPU",
        "thermal_throttle",
        True,
        runs=NOT_HERE,
        why="needs a GPU whose compute slows; the rule is exercised on fake data in "
        "tests/diagnosis/test_stragglers.py and in `faultline demo` (thermal straggler)",
        layer="device",
    ),
    Spec(
        "long_kernel",
        "one kernel runs for minutes",
        "rank_hang",
        False,
        runs=NOT_HERE,
        why="needs a GPU; on CPU it is the hang row",
        layer="device",
    ),
    Spec(
        "intra_node_link",
        "NVLink degradation between two GPUs",
        "nvlink_errors",
        True,
        runs=NOT_HERE,
        why="no NVLink or InfiniBand here; tests/diagnosis/test_device.py uses fake counters",
        layer="network",
    ),
    Spec(
        "topology_change",
        "recover 2 ranks onto 3 (DP resize: shards, batch, cursor)",
        None,
        None,
        runs=NOT_HERE,
        why="not built yet: the trainer's data cursor is per-world; resharding semantics "
        "must be checked, not assumed",
        layer="control",
    ),
    Spec(
        "serving_worker_exit",
        "a serving worker exits with live KV",
        "process_exit",
        True,
        runs=NOT_HERE,
        why="no serving loop in the drill yet; `faultline demo` plays serving windows",
        layer="serving",
    ),
    Spec(
        "canary_switch",
        "model/adapter/KV-schema canary switch",
        "stale_version",
        False,
        runs=NOT_HERE,
        why="no serving loop in the drill yet; serving probes are tested in "
        "tests/diagnosis/test_probes.py",
        layer="serving",
    ),
)
