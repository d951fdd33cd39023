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
    # One fault, one story: the row fails if any other root cause or undetermined
    # incident opens for it (a group_stall beside the rank_hang, a healthy GPU named).
    alone: bool = False


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
    Spec("hang", "SIGSTOP rank 1", "rank_hang", False, quick=False, alone=True),
    # The step after a checkpoint carries its phase, which excused silence for 30 min;
    # now the grace is relative to the checkpoint's measured duration (10 s floor here).
    Spec(
        "hang_after_checkpoint",
        "rank 1 stops right after the step carrying the step-10 checkpoint",
        "rank_hang",
        False,
        inside="hang_after_ckpt",
        fault_step=11,
        alone=True,
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
    # Zero glue (faultline.drill.elastic): a plain script under `python -m agents.torchrun`,
    # the launcher's and the workers' own reports only; torchrun restarts the job. The
    # script saves no checkpoint, so Faultline advises no automatic restart (nothing proves
    # what the restart resumes from): torchrun restarts it regardless.
    Spec(
        "torchrun_restart",
        "rank 1 raises under python -m agents.torchrun --max-restarts 1; torchrun restarts",
        "exception",
        False,
        quick=False,
        layer="process",
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
        alone=True,
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
        "the whole Faultline service SIGSTOPped 3 x 6 s mid-run (interleaved with 5 s up)",
        None,
        None,
        restore=False,
        layer="observer",
    ),
    # -- network (real namespaces, tc and nftables) -------------------------------------------
    Spec(
        "slow_link",
        "tc tbf on node 1's link, sized to carry a step's bytes in 3 healthy steps (3 namespaces)",
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
    # The cut node's agent sees its link go down; the waits on both sides link to it. Only
    # the majority side may write; no automatic restart while a side may still be alive.
    Spec(
        "partition",
        "node 2's link down (3 namespaces): {0, 1} vs {2}",
        "network_partition",
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
    # GPU-only faults, on a real job with the hardware signal from fake NVML (labelled so).
    Spec(
        "clock_throttle",
        "SM clocks throttled (thermal) on rank 1's (fake) GPU, its compute slows (3 ranks)",
        "thermal_throttle",
        True,
        quick=False,
        world=3,
        runs=FAKE,
        why="no GPU here: fake NVML reports the thermal slowdown on rank 1's GPU; the slowdown "
        "is real: the drill duty-cycles rank 1's process (SIGSTOP/SIGCONT, half of every "
        "100 ms), so its real compute takes twice as long (faultline.drill.fake_device)",
        layer="device",
        alone=True,
    ),
    Spec(
        "long_kernel",
        "rank 1 blocks for minutes in its compute phase (a kernel that never ends)",
        "rank_hang",
        False,
        inside="long_kernel",
        quick=False,
        runs=FAKE,
        why="no GPU here: a CPU wait in rank 1's compute phase stands in for the kernel "
        "(the rank lives and is not stopped, unlike the hang row)",
        layer="device",
        alone=True,
    ),
    Spec(
        "intra_node_link",
        "NVLink errors climb on rank 1's (fake) GPU",
        "nvlink_errors",
        True,
        quick=False,
        runs=FAKE,
        why="no NVLink or InfiniBand here: fake NVML's NVLink error counters on rank 1's GPU "
        "(faultline.drill.fake_device); the link's traffic is not degraded",
        layer="network",
        alone=True,
    ),
    # -- topology (faultline.drill.topology) ----------------------------------------------
    Spec(
        "topology_change",
        "rank 1's node lost; recover 2 ranks onto 1 (DP resize: shards, batch, cursor)",
        "process_exit",
        True,
        quick=False,
        layer="control",
    ),
    Spec(
        "topology_change_tp",
        "rank 1's node lost; recover a TP 2 job onto 1 rank (TP 2 -> 1: each weight's two "
        "halves merged from DCP shards)",
        "process_exit",
        True,
        quick=False,
        layer="control",
    ),
    Spec(
        "topology_change_pp",
        "rank 1's node lost; recover a 2-stage pipeline onto 1 rank (PP 2 -> 1: each "
        "stage's layers joined from its rank's DCP shard)",
        "process_exit",
        True,
        quick=False,
        layer="control",
    ),
    Spec(
        "topology_change_ep",
        "rank 1's node lost; recover a 2-expert MoE onto 1 rank (EP 2 -> 1: each rank's "
        "expert and the shared gate loaded together)",
        "process_exit",
        True,
        quick=False,
        layer="control",
    ),
    Spec(
        "topology_change_ep4",
        "rank 1's node lost; recover a 4-expert MoE on 4 ranks onto 2 (EP 4 -> 2: each new "
        "rank joins two old ranks' experts with the gate)",
        "process_exit",
        True,
        quick=False,
        layer="control",
    ),
    Spec(
        "topology_change_pp4",
        "rank 1's node lost; recover a 4-stage pipeline on 4 ranks onto 2 (PP 4 -> 2: each "
        "new stage joins two old ranks' layers)",
        "process_exit",
        True,
        quick=False,
        layer="control",
    ),
    # -- serving (faultline.drill.serving_drill: real workers of serving_loop) ------------
    Spec(
        "serving_worker_exit",
        "a serving worker (of 2) SIGKILLed while holding live KV",
        "worker_lost",
        False,
        quick=False,
        layer="serving",
    ),
    Spec(
        "canary_switch",
        "of 4 workers one turns healthy canary (toy-v2/kv-2), one mismatched (toy-v1 + kv-2)",
        "stale_version",
        False,
        layer="serving",
    ),
)
