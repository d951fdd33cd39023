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


def test_a_repaired_gpu_validates_only_once_it_reported_after_its_repair():
    """A new boot id says the node rebooted, not that a GPU came back: each repaired GPU
    must have reported after its repair (a GPU off the bus never does)."""
    policy = fh.HealthPolicy(validation_window=timedelta(minutes=10))
    later = NOW + timedelta(minutes=11)
    assert fh.validation_passed(NOW, later, policy, [])  # nothing of a GPU to wait for
    assert not fh.validation_passed(NOW, later, policy, [(NOW, None)])  # never heard from
    assert not fh.validation_passed(NOW, later, policy, [(NOW, NOW)])  # the reboot's batch
    assert not fh.validation_passed(NOW, later, policy, [(NOW, NOW - timedelta(seconds=1))])
    assert fh.validation_passed(NOW, later, policy, [(NOW, NOW + timedelta(seconds=1))])
    both = [(NOW, NOW + timedelta(seconds=1)), (NOW + timedelta(minutes=1), None)]
    assert not fh.validation_passed(NOW, later, policy, both)  # one of two still silent
    short = NOW + timedelta(minutes=9)
    assert not fh.validation_passed(NOW, short, policy, [(NOW, NOW + timedelta(seconds=1))])


def test_a_condition_is_repaired_by_its_clearing_or_a_reboot_never_by_a_gpu_reset():
    assert fh.repaired_by("condition", fh.CONDITION_CLEARED)
    assert fh.repaired_by("condition", "node_reboot")
    assert not fh.repaired_by("condition", "gpu_reset")
    assert not fh.repaired_by("gpu_reset", fh.CONDITION_CLEARED)  # a link up fixes no GPU
    assert not fh.repaired_by("operator", fh.CONDITION_CLEARED)


@pytest.mark.parametrize(
    ("since_s", "fleet", "silent", "reporting", "holds"),
    [
        (5, False, 1, 100, "silent since"),  # not 30 s yet
        (31, False, 1, 100, ""),  # alone and long enough: it may be taken out
        (31, True, 1, 100, "a fleet silence is open"),
        (31, False, 16, 64, "16 of 64 nodes are silent"),  # a mass, however they came
        (31, False, 15, 20, ""),  # below 16 nodes a silence is each node's
        (31, False, 16, 65, ""),  # 16 but under a quarter of the fleet
    ],
)
def test_a_silent_node_is_held_until_30_s_and_while_the_silence_is_the_fleets(
    since_s, fleet, silent, reporting, holds
):
    why = fh.silence_hold(
        NOW - timedelta(seconds=since_s), NOW, fleet_silence=fleet, silent=silent,
        reporting=reporting,
    )  # fmt: skip
    assert (holds in why) if holds else why == ""


def test_a_silent_nodes_wait_reads_the_same_every_second():
    """The incident's reason is written only when it changes: it must not count seconds."""
    since = NOW - timedelta(seconds=3)
    kw = {"fleet_silence": False, "silent": 1, "reporting": 10}
    assert fh.silence_hold(since, NOW, **kw) == fh.silence_hold(
        since, NOW + timedelta(seconds=20), **kw
    )


@pytest.mark.parametrize(
    ("kind", "since_s", "others", "reporting", "holds"),
    [
        ("nic_down", 5, 0, 100, "a node is taken out once it has lasted 30 s"),
        ("nic_down", 31, 0, 100, ""),
        ("nic_down", 31, 15, 40, "16 of 40 nodes lost a port together"),
        ("disk_full", 31, 0, 100, ""),
        ("disk_full", 31, 1, 100, "a shared filesystem"),
        ("disk_full", 5, 0, 100, "disk full since"),
    ],
)
def test_a_condition_waits_30_s_and_for_a_cause_of_its_own(kind, since_s, others, reporting, holds):
    why = fh.condition_hold(
        kind, NOW - timedelta(seconds=since_s), NOW, others=others, reporting=reporting
    )
    assert (holds in why) if holds else why == ""


@pytest.mark.parametrize(
    ("device", "local"),
    [("nvme1n1", True), ("md0", True), ("nas:/export/ckpt", False),
     ("10.0.0.1@o2ib:/lustre", False), (None, False), ("", False)],
)  # fmt: skip
def test_only_a_local_disk_full_is_a_nodes_condition(device, local):
    assert fh.local_disk(device) is local


def test_a_disk_is_full_at_1_percent_free_and_free_again_above_2():
    tib = 2**40
    assert fh.disk_full(tib // 100, tib) and not fh.disk_full(tib // 50, tib)
    assert fh.disk_full(tib // 60, tib, fraction=fh.DISK_CLEAR_FRACTION)  # not clear yet
    assert not fh.disk_full(None, tib) and not fh.disk_full(0, 0)
