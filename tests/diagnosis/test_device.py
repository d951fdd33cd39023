from __future__ import annotations

from datetime import timedelta

from console.diagnosis import ROOT_CAUSE, XIDS, classify_xid, diagnose
from tests.diagnosis.factory import (
    T0,
    device_event,
    gpu_of,
    heartbeats,
    of_kind,
    sample,
    snap,
    training,
)

NOW = T0 + timedelta(seconds=3)  # inside the 4 s hang floor: healthy ranks are not hung


def _diag(extra: list[dict]):
    return diagnose(snap([*training(ranks=16), *extra], nodes=heartbeats(16, NOW)), NOW)


def test_it_knows_every_xid_the_fleet_meets_most() -> None:
    assert {48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140, 154} <= set(XIDS)


def test_it_classifies_an_unknown_xid_as_major_with_an_action() -> None:
    info = classify_xid(31337)
    assert info.severity == "major" and "catalogue" in info.action


def test_it_names_node_gpu_index_and_rank_for_xid_79() -> None:
    (xid,) = of_kind(_diag([device_event(13, T0, "xid", 79)]), "xid")
    assert xid.summary == "Xid 79 on node-02 GPU 5 (rank 13): GPU fell off the bus"
    assert (xid.subject, xid.role, xid.severity) == (f"gpu:{gpu_of(13)}", ROOT_CAUSE, "critical")


def test_it_keeps_the_worst_of_several_xids_on_one_gpu() -> None:
    d = _diag(
        [device_event(3, T0, "xid", 94), device_event(3, T0 + timedelta(seconds=1), "xid", 79)]
    )
    (xid,) = of_kind(d, "xid")
    assert (xid.evidence["code"], xid.evidence["codes"]) == (79, [79, 94])


def test_it_reports_a_lost_gpu() -> None:
    (lost,) = of_kind(_diag([device_event(3, T0, "gpu_lost")]), "gpu_lost")
    assert lost.evidence["ranks"] == [3]


def test_it_reports_a_double_bit_ecc_count_from_samples() -> None:
    d = _diag([sample(3, NOW, ecc_dbe=2)])
    assert [f.subject for f in of_kind(d, "ecc_dbe")] == [f"gpu:{gpu_of(3)}"]


def test_it_reports_a_pending_row_remap() -> None:
    d = _diag([sample(3, NOW, retired_or_remapped_pending=True)])
    assert [f.severity for f in of_kind(d, "row_remap_pending")] == ["minor"]


def test_it_reports_hardware_thermal_slowdown() -> None:
    d = _diag([sample(3, NOW, throttle_reasons=["hw_thermal_slowdown"], temp_c=92.0)])
    assert len(of_kind(d, "thermal_throttle")) == 1


def test_it_ignores_a_software_power_cap_on_a_busy_gpu() -> None:
    assert _diag([sample(3, NOW, throttle_reasons=["sw_power_cap"])]).findings == ()


def test_it_reports_nvlink_errors_over_the_limit() -> None:
    d = _diag([sample(3, NOW, nvlink_errors=500)])
    assert of_kind(d, "nvlink_errors")[0].evidence["nvlink_errors"] == 500


def test_it_tolerates_nvlink_errors_under_the_limit() -> None:
    assert _diag([sample(3, NOW, nvlink_errors=2)]).findings == ()


def test_it_reports_a_bookkeeping_xid_as_minor_without_a_restart() -> None:
    (xid,) = of_kind(_diag([device_event(3, T0, "xid", 63)]), "xid")
    assert xid.severity == "minor"
    assert xid.recovery is not None and xid.recovery.reason.startswith("no restart needed")


def test_it_does_not_let_a_bookkeeping_xid_explain_a_hang() -> None:
    # Rank 3 started 105 s ago and never stepped; the others stepped 3 s ago.
    recs = [
        r for r in training(ranks=16, steps=100) if not (r["kind"] == "step" and r["rank"] == 3)
    ]
    recs.append(device_event(3, T0, "xid", 63))
    d = diagnose(snap(recs, nodes=heartbeats(16, NOW)), NOW)
    assert [f.kind for f in d.findings if f.subject.startswith("rank:")] == ["rank_hang"]


def test_it_leaves_another_jobs_gpu_on_a_shared_node_to_that_job() -> None:
    """Ranks 0-3 use GPUs 0-3 of node-01; an Xid on GPU 7 of that node is not ours."""
    recs = [*training(ranks=4), device_event(7, T0, "xid", 79)]
    d = diagnose(snap(recs, nodes=heartbeats(4, NOW)), NOW)
    assert of_kind(d, "xid") == []
    ours = diagnose(snap([*training(ranks=4), device_event(2, T0, "xid", 79)],
                         nodes=heartbeats(4, NOW)), NOW)  # fmt: skip
    assert [f.subject for f in of_kind(ours, "xid")] == ["gpu:GPU-0001-2"]
