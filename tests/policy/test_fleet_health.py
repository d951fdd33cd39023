"""The pure fleet-health table: what each fault needs, what repairs it, the lifecycle moves,
the validation window, repeat offenders, and the return gates (no Django, no clock)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from console.policy import fleet_health as fh
from console.policy.gates import return_holds
from console.policy.inputs import ActionRequest
from console.policy.lifecycle import ActionKind

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)


@pytest.mark.parametrize(
    ("event", "code", "recovery", "needs"),
    [
        ("xid", 13, None, "none"),  # application: restart the job, the GPU stays in
        ("xid", 94, None, "none"),
        ("xid", 45, None, "none"),  # consequence of another error
        ("xid", 63, None, "none"),  # informational
        ("xid", 48, None, "gpu_reset"),  # double-bit ECC
        ("xid", 79, None, "node_reboot"),  # fell off the bus
        ("xid", 154, "node_reboot", "node_reboot"),  # the driver's recovery action rules
        ("xid", 13, "gpu_reset", "gpu_reset"),
        ("ecc_dbe", None, None, "gpu_reset"),
        ("gpu_lost", None, None, "node_reboot"),
        ("throttle", None, None, "none"),
    ],
)
def test_it_reads_what_each_fault_needs_from_the_table_and_the_xid_catalog(
    event, code, recovery, needs
):
    assert fh.repair_needed(event, code, recovery) == needs


def test_it_accepts_a_reboot_for_every_automatic_need_and_a_reset_only_for_a_reset():
    assert fh.repaired_by("gpu_reset", "node_reboot") and fh.repaired_by(
        "node_reboot", "node_reboot"
    )
    assert fh.repaired_by("gpu_reset", "gpu_reset")
    assert not fh.repaired_by("node_reboot", "gpu_reset")
    assert not fh.repaired_by("operator", "node_reboot")


def test_it_allows_only_the_lifecycle_moves_in_its_table():
    assert fh.check_move("healthy", "faulted") == "faulted"
    assert fh.check_move("validating", "faulted") == "faulted"  # a fault in the window
    with pytest.raises(fh.HealthTransitionError, match='from "healthy" it may go to'):
        fh.check_move("healthy", "validating")  # no repair without a fault


def test_it_passes_validation_only_after_the_whole_window():
    policy = fh.HealthPolicy(validation_window=timedelta(minutes=10))
    assert not fh.validation_passed(NOW, NOW + timedelta(minutes=9, seconds=59), policy)
    assert fh.validation_passed(NOW, NOW + timedelta(minutes=10), policy)


def test_it_flags_n_faults_inside_the_window_and_forgets_older_ones():
    policy = fh.HealthPolicy(repeat_faults=3, repeat_window=timedelta(days=7))
    week = [NOW - timedelta(days=d) for d in (0, 2, 6)]
    assert fh.repeat_offender(week, NOW, policy)
    assert not fh.repeat_offender(
        [NOW, NOW - timedelta(days=2), NOW - timedelta(days=8)], NOW, policy
    )


def _request(kind: ActionKind, **kw) -> ActionRequest:
    return ActionRequest(id="1", kind=kind, target="node:n-1", proposed_at=NOW,
                         expires_at=NOW + timedelta(hours=1), **kw)  # fmt: skip


def test_it_holds_a_return_of_a_repeat_offender_or_of_someone_elses_node():
    assert return_holds(_request(ActionKind.UNCORDON_NODE, taken_out_by="faultline")) == []
    assert return_holds(_request(ActionKind.UNCORDON_NODE)) == []
    (held,) = return_holds(_request(ActionKind.UNCORDON_NODE, replace_flagged=True))
    assert "flagged for replacement" in held
    (held,) = return_holds(_request(ActionKind.RELEASE_GPU, taken_out_by="scheduler"))
    assert "taken out by the scheduler" in held
    # Taking capacity out is not a return: these gates do not apply.
    assert return_holds(_request(ActionKind.CORDON_NODE, replace_flagged=True)) == []


@pytest.mark.parametrize(
    ("silent", "reporting", "together"),
    [
        (15, 20, False),  # a small fleet: each node its own incident, however many
        (16, 20, True),
        (16, 64, True),  # exactly a quarter
        (16, 65, False),  # a rack in a big fleet: 16 node faults, each its own
        (512, 2048, True),
        (511, 2048, False),
        (1345, 2048, True),  # the 16k bench's paused liveness
        (16, 0, True),  # nothing counted as reporting: never divide by zero
    ],
)
def test_many_nodes_silent_together_are_the_fleets_event_above_a_count_and_a_share(
    silent: int, reporting: int, together: bool
) -> None:
    assert fh.mass_silence(silent, reporting) is together
