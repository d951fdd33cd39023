"""The topology-change row: recovery onto a different world size, checked not assumed.

Owns the `topology_change` drill: generation 1 is a 2-rank data-parallel job of
faultline.drill.resize_trainer (global batch 64, global data cursor in the checkpoint
manifest); rank 1's node is lost (SIGKILL, reported by the launcher as torchrun would);
Faultline must name it (`process_exit`, restart advised); the drill quiesces and restores
generation 2 onto ONE rank (the node is gone: DP 2 -> 1) from the checkpoint the console
calls newest valid, announcing world size 1 in the `running` transition. Then it runs on
past the step generation 1 reached while Faultline watches the new generation, and checks
(faultline.drill.invariants.resized): the shards the two old ranks wrote load into the one
new rank with the weights that were saved, the cursor came from the manifest (and the DCP
state agrees), every global sample is consumed once per generation with only the steps
since the checkpoint replayed (the declared consistency), each step still consumes the
global batch, the replayed steps' global losses equal generation 1's (same samples, same
weights: the resize changed nothing the model sees), and no finding is raised for the
ranks that no longer exist. Must not judge faults itself.

`topology_change_tp` is the same row for a tensor-parallel job: generation 1 is TP 2 (each
rank holds half of every split weight, saved as DTensor shards), generation 2 one rank
with TP 1, so the restore must merge two ranks' halves of each weight (DCP reshards them),
not pick one rank's copy; the same invariants hold (the TP ranks of a replica share its
slice of the global batch), and the console must record the new shape (`tp` 1).

`topology_change_pp` is a two-stage pipeline (PP 2 -> 1: each stage's layers, saved by
the rank that holds them, join on one rank), `topology_change_ep` a two-expert MoE whose
experts live on different ranks (EP 2 -> 1: both experts and the replicated gate load onto
one rank); both run through the same checks, with the stages sharing a slice as TP ranks
do and every expert required to have taken tokens (an EP row whose gate routed everything
to one expert would test nothing). `topology_change_ep4` restores a split onto another
split of the same kind: four experts on four ranks (EP 4), then on two ranks with two
experts each (EP 2), so each new rank joins two old ranks' experts with the gate, and
`topology_change_pp4` a four-stage pipeline of a 4-layer model (PP 4, one layer per rank)
onto two stages (PP 2), each new stage joining two old ranks' layers.
"""

from __future__ import annotations

import signal
import time
from typing import Any, NamedTuple

from faultline.drill import invariants
from faultline.drill.util import all_alive, world_shape
from faultline.drill.util import step_of as _step_of
from faultline.drill.util import wait as _wait

Drill = Any  # faultline.drill.runner.Drill (runner imports this module: no cycle)

MODULE = "faultline.drill.resize_trainer"
DETECT_TIMEOUT_S = 25.0
WATCH_NEW_GENERATION_S = 12.0  # the new world runs this long past catch-up under watch
CONVERGE_S = 10.0


class Resize(NamedTuple):
    """One row's worlds: the trainer's flags, world size and TP/PP/EP degrees of
    generation 1 (old) and of the generation restored onto the smaller world (new)."""

    old_flags: list[str]
    new_flags: list[str]
    old_shape: dict[str, int]
    old_world: int = 2
    new_world: int = 1
    new_shape: dict[str, int] | None = None


SHAPES: dict[str, Resize] = {
    "topology_change": Resize([], [], {}),
    "topology_change_tp": Resize(["--tp", "2"], [], {"tp": 2}),
    "topology_change_pp": Resize(["--pp", "2"], [], {"pp": 2}),
    "topology_change_ep": Resize(["--experts", "2", "--ep", "2"], ["--experts", "2"], {"ep": 2}),
    # A split restored onto another split of the same kind: four experts on four ranks,
    # then two on each of two (each new rank loads two old ranks' experts and the gate).
    "topology_change_ep4": Resize(
        ["--experts", "4", "--ep", "4"],
        ["--experts", "4", "--ep", "2"],
        {"ep": 4},
        old_world=4,
        new_world=2,
        new_shape={"ep": 2},
    ),
    # A four-stage pipeline of a 4-layer model onto two stages: each new stage loads the
    # layers two old ranks held and passes activations to one peer instead of three.
    "topology_change_pp4": Resize(
        ["--layers", "4", "--pp", "4"],
        ["--layers", "4", "--pp", "2"],
        {"pp": 4},
        old_world=4,
        new_world=2,
        new_shape={"pp": 2},
    ),
}


def _flag(flags: list[str], name: str) -> int:
    return int(flags[flags.index(name) + 1]) if name in flags else 0


def findings_after(drill: Drill, launched: float, before: set[int]) -> list[str]:
    """Incidents the new world opened (`kind@subject`): those opened since its launch that
    were not open before it (the fault's own incident may be a moment younger than the
    launch's clock slack)."""
    fresh = drill.new_incidents(launched)
    return [f"{i['kind']}@{i['subject']}" for i in fresh if i["id"] not in before]


def topology_change(drill: Drill) -> None:
    r, spec = drill.result, drill.spec
    row = SHAPES[spec.name]
    old_world, new_world = row.old_world, row.new_world
    old = world_shape(old_world, row.old_shape)
    job = drill.launch(
        1,
        ["--ckpt-every", "5", *row.old_flags],
        world=old_world,
        module=MODULE,
        shape=row.old_shape,
    )
    if not _wait(lambda: job.step() >= 8 or not all_alive(job), 90) or job.step() < 8:
        raise RuntimeError(f"generation 1 never reached step 8: {job.why()}")
    if not _wait(lambda: drill.agent_phase(5) == "verified", 30, 0.2):
        raise RuntimeError("the agent never verified the step-5 checkpoint")
    # Kill between checkpoints (1-2 steps past one), so the restore replays steps whose
    # losses can be compared: a kill right at a checkpoint step leaves nothing to replay.
    _wait(lambda: job.step() % 5 in (1, 2) or not all_alive(job), 20, 0.02)
    job.procs[1].send_signal(signal.SIGKILL)  # the node is lost with its rank
    t0 = time.time()
    found: list[dict[str, Any]] = []
    detected = None
    deadline = time.monotonic() + DETECT_TIMEOUT_S
    while time.monotonic() < deadline:
        found = drill.new_incidents(t0) or found
        if any(i["kind"] == spec.expected_root_cause for i in found):
            detected = time.time()
            break
        time.sleep(0.1)
    r.other_root_causes = sorted({i["kind"] for i in found} - {spec.expected_root_cause})
    if detected is None:
        r.found_root_cause = found[0]["kind"] if found else None
        raise RuntimeError(f"{spec.expected_root_cause} not named within {DETECT_TIMEOUT_S:.0f}s")
    head = next(i for i in found if i["kind"] == spec.expected_root_cause)
    r.found_root_cause = spec.expected_root_cause
    r.detection_s = round(detected - t0, 2)
    r.auto_restart_safe = (head.get("recovery") or {}).get("auto_restart_safe")
    r.faultline_lost_steps = (head.get("recovery") or {}).get("lost_steps")
    r.advice_correct = r.auto_restart_safe == spec.expected_auto_restart_safe
    r.measured["console_topology_before"] = (drill.group_info() or {}).get("topology")
    drill.marks.update(first_evidence=t0, detected=detected)  # quiesce_s is measured from it
    drill.quiesce(job, detected)
    # -- restore onto the new world ------------------------------------------------------
    last = job.step()
    expected = invariants.newest_valid_step(drill)
    began = time.monotonic()
    info = drill.group_info() or {}
    while _step_of(info.get("newest_valid_checkpoint")) != expected:
        if time.monotonic() - began > CONVERGE_S:
            break
        time.sleep(0.5)
        info = drill.group_info() or {}
        expected = invariants.newest_valid_step(drill)
    ckpt = info.get("newest_valid_checkpoint")
    resume = _step_of(ckpt)
    r.checkpoint = ckpt
    r.lost_steps = last - resume
    r.lost_tokens = r.lost_steps * 64 * 64  # global batch x width
    new_shape = world_shape(new_world, row.new_shape)
    r.measured.update(
        last_step=last,
        resume_step=resume,
        expected_resume=expected,
        old_world=old_world,
        new_world=new_world,
        global_batch=64,
        old_tp=old["tp"],
        old_pp=old["pp"],
        old_ep=old["ep"],
        new_tp=new_shape["tp"],
        new_pp=new_shape["pp"],
        new_ep=new_shape["ep"],
        experts=_flag(row.old_flags, "--experts"),
    )
    drill._transition("recovering", 1, from_state="quiescing")
    drill.restart_count += 1
    extra = ["--ckpt-every", "5", *row.new_flags]
    extra += ["--resume", str(drill.ckpt_root / ckpt)] if ckpt else []
    # The fault's own incidents may have opened under a second before the launch (a fast
    # detection and restore): new_incidents' clock slack would credit them to the resize.
    before = {i["id"] for i in drill.incidents()}
    launched = time.time()
    new = drill.launch(2, extra, world=new_world, module=MODULE, shape=row.new_shape)
    if not _wait(lambda: new.step() > resume, 90):
        raise RuntimeError(f"generation 2 (world {new_world}) never stepped: {new.why()}")
    r.restore_s = round(time.time() - launched, 2)
    _wait(lambda: new.step() >= last or not new.alive(), 60)
    r.repeated_steps = max(0, min(new.step(), last) - resume)
    # Faultline watches the smaller generation run: no finding for the ranks that left.
    time.sleep(WATCH_NEW_GENERATION_S)
    false = findings_after(drill, launched, before)
    info = drill.group_info() or {}
    shape = info.get("topology") or {}
    if shape != new_shape:
        false.append(f"console topology {shape} is not the new world's {new_shape}")
    r.measured.update(
        findings_after_resize=false,
        console_world_size=info.get("world_size"),
        console_generation=info.get("generation"),
        console_topology=info.get("topology"),
    )
    r.invariants = invariants.resized(drill, job, new, false_findings=false)
