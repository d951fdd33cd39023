from __future__ import annotations

from datetime import timedelta

import pytest

from agents import xid as catalog
from console.diagnosis import ROOT_CAUSE, SYMPTOM, UNDETERMINED, DiagnosisConfig, diagnose
from tests.diagnosis.factory import (
    T0,
    device_event,
    gpu_of,
    heartbeats,
    node_of,
    of_kind,
    process,
    rank_subject,
    sample,
    snap,
    step,
    training,
    transition,
)

NOW = T0 + timedelta(seconds=3)  # inside the 4 s hang floor: healthy ranks are not hung


def _diag(extra: list[dict], config: DiagnosisConfig | None = None):
    return diagnose(snap([*training(ranks=16), *extra], nodes=heartbeats(16, NOW)), NOW, config)


def _xid(rank: int, code: int, recovery_action: str | None = None, at=T0) -> dict:
    rec = device_event(rank, at, "xid", code)
    if recovery_action is not None:
        rec["recovery_action"] = recovery_action
    return rec


def test_it_names_node_gpu_index_and_rank_for_xid_79() -> None:
    (xid,) = of_kind(_diag([device_event(13, T0, "xid", 79)]), "xid")
    assert xid.summary == "Xid 79 on node-02 GPU 5 (rank 13): GPU has fallen off the bus"
    assert (xid.subject, xid.role, xid.severity) == (f"gpu:{gpu_of(13)}", ROOT_CAUSE, "critical")
    assert (xid.evidence["xid_class"], xid.evidence["immediate"]) == ("hardware", "RESTART_BM")
    assert xid.recovery is not None and "without node-02" in xid.recovery.reason
    assert "reboot the node" in xid.recovery.reason


def test_it_advises_a_gpu_reset_for_codes_whose_bucket_says_so() -> None:
    for code in (46, 109, 110, 136, 143, 155, 156):
        (xid,) = of_kind(_diag([_xid(3, code)]), "xid")
        assert (xid.role, xid.severity, xid.evidence["immediate"]) == (
            ROOT_CAUSE,
            "critical",
            "RESET_GPU",
        ), code
        assert "reset it (nvidia-smi -r)" in xid.recovery.reason, code
        assert "without node-01" in xid.recovery.reason, code


def test_it_keeps_an_application_xid_on_the_rank_and_the_node_in_service() -> None:
    for code in (13, 31, 43, 94):
        (xid,) = of_kind(_diag([_xid(3, code)]), "xid")
        assert (xid.subject, xid.role, xid.evidence["xid_class"]) == (
            rank_subject(3),
            ROOT_CAUSE,
            "application",
        ), code
        assert xid.evidence["takes_gpu_out"] is False
        assert "without" not in xid.recovery.reason, code
        assert "restart the application" in xid.recovery.reason, code


def test_it_folds_an_application_xid_under_the_ranks_exception() -> None:
    exc = process(3, T0 + timedelta(seconds=1), "exited", exit_code=1, reason="exception",
                  error_type="RuntimeError")  # fmt: skip
    d = _diag([_xid(3, 13), exc])
    (root,) = d.root_causes
    (xid,) = of_kind(d, "xid")
    assert (root.kind, root.subject) == ("exception", rank_subject(3))
    assert root.evidence["xids"][0]["code"] == 13 and "after Xid 13" in root.summary
    assert (xid.role, xid.caused_by) == (SYMPTOM, (root.id,))
    assert "without" not in root.recovery.reason


def test_it_files_xid_45_after_a_hardware_fault_as_its_symptom() -> None:
    d = _diag([_xid(3, 48), _xid(3, 45, at=T0 + timedelta(milliseconds=5))])
    roots = [f for f in of_kind(d, "xid") if f.role == ROOT_CAUSE]
    (symptom,) = [f for f in of_kind(d, "xid") if f.role == SYMPTOM]
    assert [r.evidence["code"] for r in roots] == [48]
    assert (symptom.evidence["code"], symptom.caused_by) == (45, (roots[0].id,))


def test_it_files_xid_45_after_a_kill_under_the_ranks_exit() -> None:
    kill = process(3, T0, "exited", signal=9, reason="killed")
    d = _diag([kill, _xid(3, 45, at=T0 + timedelta(milliseconds=50))])
    (root,) = d.root_causes
    assert (root.kind, root.subject) == ("process_exit", rank_subject(3))
    (xid,) = of_kind(d, "xid")
    assert (xid.role, xid.caused_by) == (SYMPTOM, (root.id,))


def test_it_calls_an_unknown_or_unused_code_undetermined_and_keeps_the_node() -> None:
    for code in (31337, 2):
        (xid,) = of_kind(_diag([_xid(3, code)]), "xid")
        assert (xid.role, xid.subject) == (UNDETERMINED, f"gpu:{gpu_of(3)}"), code
        assert xid.recovery is not None and xid.recovery.auto_restart_safe is False
        assert "without" not in xid.recovery.reason and "human" in xid.recovery.reason


def test_it_names_the_drivers_recovery_action_in_the_advice() -> None:
    d = _diag([_xid(3, 62), _xid(3, 154, "node_reboot", at=T0 + timedelta(milliseconds=1))])
    (xid,) = [f for f in of_kind(d, "xid") if f.role == ROOT_CAUSE]
    assert (xid.evidence["code"], xid.evidence["recovery_action"]) == (62, "node_reboot")
    assert "the driver requires a node reboot" in xid.recovery.reason


def test_it_makes_any_xid_a_hardware_fault_when_the_driver_asks_for_a_reset() -> None:
    (xid,) = of_kind(_diag([_xid(3, 154, "gpu_reset")]), "xid")
    assert (xid.role, xid.evidence["xid_class"], xid.severity) == (
        ROOT_CAUSE,
        "hardware",
        "critical",
    )
    assert "the driver requires a GPU reset" in xid.recovery.reason
    (info,) = of_kind(_diag([_xid(3, 154, "none")]), "xid")
    assert (info.severity, info.evidence["xid_class"]) == ("minor", "informational")


def test_it_follows_an_operators_override_of_class_and_action() -> None:
    cfg = DiagnosisConfig(
        xids=catalog.CATALOG.with_overrides({13: {"class": "hardware", "action": "RESET_GPU"}})
    )
    (xid,) = of_kind(_diag([_xid(3, 13)], cfg), "xid")
    assert (xid.subject, xid.evidence["overridden"]) == (f"gpu:{gpu_of(3)}", True)
    assert "without node-01" in xid.recovery.reason


def test_it_keeps_the_worst_of_several_xids_on_one_gpu() -> None:
    d = _diag(
        [device_event(3, T0, "xid", 95), device_event(3, T0 + timedelta(seconds=1), "xid", 79)]
    )
    (xid,) = of_kind(d, "xid")
    assert (xid.evidence["code"], xid.evidence["codes"]) == (95, [79, 95])


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


def test_clean_gpus_judged_once_give_the_findings_of_judging_every_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A live pass skips a GPU that had nothing to say and is the same DeviceState object
    (build_snapshot's devices memo keeps an unchanged GPU's); a GPU whose sample turns bad,
    an Xid, or a lower NVLink limit in the config are judged again: every pass equals the
    pass without a memo. A memo that ignores the limit fails that check."""
    from console.diagnosis import build_snapshot
    from console.diagnosis.rules import device

    base = training(ranks=16)
    nvlink5 = sample(5, T0, nvlink_errors=5)  # under the default limit of 10
    base = [nvlink5 if r["kind"] == "device_sample" and r["gpu"] == gpu_of(5) else r
            for r in base]  # fmt: skip
    hot = sample(3, T0, throttle_reasons=["hw_thermal_slowdown"])
    passes = [
        (base, None),
        (base, None),
        ([*base, hot], None),  # a new sample object for GPU 3
        (base, DiagnosisConfig(nvlink_errors_limit=2)),  # GPU 5 unchanged, limit lowered
        ([*base, _xid(7, 79)], DiagnosisConfig(nvlink_errors_limit=2)),
        (base, None),
    ]

    def run() -> list[set[tuple[str, str]]]:
        devices: dict = {}
        memo: dict = {}
        seen = []
        for records, cfg in passes:
            kw = {"group": "g", "generation": 1, "state": "running", "records": records,
                  "nodes": heartbeats(16, NOW), "contract_findings": [], "now": NOW}  # fmt: skip
            live = diagnose(build_snapshot(**kw, devices_memo=devices), NOW, cfg, memo=memo)
            assert live == diagnose(build_snapshot(**kw), NOW, cfg)
            seen.append({(f.kind, f.subject) for f in live.findings})
        return seen

    seen = run()
    assert ("thermal_throttle", f"gpu:{gpu_of(3)}") in seen[2]
    assert ("nvlink_errors", f"gpu:{gpu_of(5)}") in seen[3] - seen[2]
    assert ("xid", f"gpu:{gpu_of(7)}") in seen[4] and seen[5] == seen[0]
    real = device.Context.slot

    def slot(self, name):  # the limit forgotten: a clean GPU stays clean whatever the config
        got = real(self, name)
        if name == "device_clean" and got is not None and got.get("clean"):
            got["limit"] = self.cfg.nvlink_errors_limit
        return got

    monkeypatch.setattr(device.Context, "slot", slot)
    with pytest.raises(AssertionError):
        run()


# -- NVLink5: the decode decides; two witnesses of one Xid are judged as one ---------------


@pytest.mark.parametrize(
    ("action", "cls", "role", "severity"),
    [
        ("gpu_reset", "hardware", ROOT_CAUSE, "critical"),
        ("none", "informational", ROOT_CAUSE, "minor"),
        (None, "undetermined", UNDETERMINED, "major"),
    ],
)
def test_it_judges_an_nvlink5_xid_by_its_decode(action, cls, role, severity) -> None:
    (xid,) = of_kind(_diag([_xid(3, 149, action)]), "xid")
    assert (xid.evidence["xid_class"], xid.role, xid.severity) == (cls, role, severity)
    assert xid.evidence["takes_gpu_out"] is (cls == "hardware")


@pytest.mark.parametrize("action", ["none", "gpu_reset"])
@pytest.mark.parametrize("nvml_first", [True, False])
def test_it_judges_an_xid_seen_with_and_without_a_recovery_action_as_one(action, nvml_first):
    nvml = _xid(3, 149, None, at=T0 + timedelta(seconds=0 if nvml_first else 0.3))
    kernel = _xid(3, 149, action, at=T0 + timedelta(seconds=0.3 if nvml_first else 0))
    findings = of_kind(_diag([nvml, kernel]), "xid")
    classes = {f.evidence["xid_class"] for f in findings if f.role != SYMPTOM}
    assert classes == {"hardware" if action == "gpu_reset" else "informational"}
    assert not [f for f in findings if f.role == UNDETERMINED]


def test_it_keeps_an_xid_seen_outside_the_dedup_window_apart() -> None:
    late = T0 + timedelta(seconds=catalog.DEDUP_WINDOW_S + 1)
    findings = of_kind(_diag([_xid(3, 149, "none"), _xid(3, 149, None, at=late)]), "xid")
    assert {f.evidence["xid_class"] for f in findings} == {"informational", "undetermined"}


def _restarted(extra: list[dict], *, gen2_ranks: bool = False, at=T0 + timedelta(seconds=1)):
    """Generation 1 ran on ranks 0-15; generation 2 began at `at`, its ranks not reported
    yet unless `gen2_ranks` (then rank 3 is back on its old GPU)."""
    recs = [*training(ranks=16), transition(at, "recovering", "running", gen=2), *extra]
    if gen2_ranks:
        recs.append(process(3, at, "started", gen=2))
    now = at + timedelta(seconds=2)
    return diagnose(snap(recs, gen=2, nodes=heartbeats(16, now)), now)


@pytest.mark.parametrize("code", [79, 48, 13])
def test_a_fault_from_the_generation_before_is_not_the_next_ones_before_its_ranks_report(
    code,
) -> None:
    """The group restarted (maybe onto a spare): the GPU that stopped generation 1 is no
    finding of generation 2 while no generation-2 rank names a GPU."""
    d = _restarted([_xid(3, code, at=T0 - timedelta(seconds=2))])
    assert of_kind(d, "xid") == []


def test_a_fault_after_the_restart_is_judged_before_the_ranks_report() -> None:
    """Only what came before the generation is set aside: a GPU of the group's nodes that
    faults after it began is judged (one extra page rather than a missed Xid)."""
    d = _restarted([_xid(3, 79, at=T0 + timedelta(seconds=2))])
    assert [(f.subject, f.role) for f in of_kind(d, "xid")] == [(f"gpu:{gpu_of(3)}", ROOT_CAUSE)]


def test_a_rank_restarted_onto_the_faulted_gpu_is_judged_with_its_whole_history() -> None:
    """Once a generation-2 rank names the GPU, its fault from before counts: restarting
    onto a GPU that fell off the bus is that generation's root cause."""
    d = _restarted([_xid(3, 79, at=T0 - timedelta(seconds=2))], gen2_ranks=True)
    assert [(f.subject, f.role) for f in of_kind(d, "xid")] == [(f"gpu:{gpu_of(3)}", ROOT_CAUSE)]


@pytest.mark.parametrize(
    ("fields", "kind"),
    [({"ecc_dbe": 2}, "ecc_dbe"), ({"nvlink_errors": 500}, "nvlink_errors")],
)
def test_a_gpus_fault_counters_wait_for_a_rank_to_name_it_after_a_restart(fields, kind) -> None:
    """A sample's counters do not say when the fault began: after a restart they are no
    finding of the new generation until one of its ranks names the GPU."""
    bad = sample(3, T0 + timedelta(seconds=2), **fields)
    assert of_kind(_restarted([bad]), kind) == []
    assert [f.subject for f in of_kind(_restarted([bad], gen2_ranks=True), kind)] == [
        f"gpu:{gpu_of(3)}"
    ]


def _node_only(at) -> dict:
    """Generation 2's rank 20 (new: no GPU of its own from before) names node-01, no GPU."""
    return {**process(20, at, "started", gen=2), "gpu": None, "node": "node-01"}


def test_a_rank_that_names_only_its_node_ends_the_window() -> None:
    """A generation-2 rank that says which node it runs on but not which GPU: the group's
    nodes are its own again, and their GPUs are judged with their whole history."""
    at = T0 + timedelta(seconds=1)
    recs = [*training(ranks=16), transition(at, "recovering", "running", gen=2),
            _xid(3, 79, at=T0 - timedelta(seconds=2)),
            _node_only(at)]  # fmt: skip
    now = at + timedelta(seconds=2)
    d = diagnose(snap(recs, gen=2, nodes=heartbeats(16, now)), now)
    assert [f.subject for f in of_kind(d, "xid")] == [f"gpu:{gpu_of(3)}"]


def test_a_gpu_judged_clean_inside_the_window_is_judged_again_after_it() -> None:
    """The clean-GPU memo: a pass inside the window (the Xid set aside), then the very same
    GPUs once a rank names its node: the Xid counts, as a pass without a memo says."""
    from console.diagnosis import build_snapshot
    from tests.diagnosis.factory import GROUP

    at = T0 + timedelta(seconds=1)
    before = [*training(ranks=16), transition(at, "recovering", "running", gen=2),
              _xid(3, 79, at=T0 - timedelta(seconds=2))]  # fmt: skip
    named = [*before, _node_only(at)]
    now = at + timedelta(seconds=2)
    devices: dict = {}
    memo: dict = {}
    seen = []
    for records in (before, before, named):
        kw = {"group": GROUP, "generation": 2, "state": "running", "records": records,
              "nodes": heartbeats(16, now), "contract_findings": [], "now": now}  # fmt: skip
        live = diagnose(build_snapshot(**kw, devices_memo=devices), now, memo=memo)
        assert live == diagnose(build_snapshot(**kw), now)
        seen.append([f.subject for f in live.findings if f.kind == "xid"])
    assert seen == [[], [], [f"gpu:{gpu_of(3)}"]]


def test_a_first_generation_with_no_rank_named_judges_every_event() -> None:
    """No generation before it: nothing to set aside, whenever the Xid came."""
    recs = [r for r in training(ranks=16) if r["kind"] not in ("step", "process")]
    recs.append(_xid(3, 79, at=T0 - timedelta(seconds=40)))
    d = diagnose(snap(recs, nodes=heartbeats(16, NOW)), NOW)
    assert [f.subject for f in of_kind(d, "xid")] == [f"gpu:{gpu_of(3)}"]


def _rank3_placed(node: str, says: str, xid_at):
    """Generation 1 ran on ranks 0-15 and rank 3's GPU faulted (Xid 79 at `xid_at`);
    generation 2 began at T0 + 1 s, every rank back on its GPU except rank 3, whose
    records (its start and a step, or only a step: `says`) name `node` and no GPU. Rank 3's
    state in generation 2 and the diagnosis."""
    at = T0 + timedelta(seconds=1)
    now = at + timedelta(seconds=5)
    recs = [*training(ranks=16), transition(at, "recovering", "running", gen=2),
            _xid(3, 79, at=xid_at)]  # fmt: skip
    recs += [process(rk, at, "started", gen=2) for rk in range(16) if rk != 3]
    recs += [step(rk, 1, at + timedelta(seconds=2), gen=2) for rk in range(16) if rk != 3]
    if says == "process":
        recs += [{**process(3, at, "started", gen=2), "gpu": None, "node": node}]
        recs += [step(3, 1, at + timedelta(seconds=2), gen=2)]
    else:
        recs += [{**step(3, 1, at + timedelta(seconds=2), gen=2), "node": node}]
    s = snap(recs, gen=2, nodes={**heartbeats(16, now), node: now})
    (rank3,) = [r for r in s.ranks if r.rank == 3]
    return rank3, diagnose(s, now)


@pytest.mark.parametrize("says", ["process", "step"])
def test_a_rank_that_moved_is_not_tied_to_the_gpu_it_left(says) -> None:
    """Generation 2 runs where generation 1 did, except rank 3, which moved off the GPU
    that stopped generation 1 and says only its new node: it is not that GPU's rank, and
    the dead GPU (which no rank of generation 2 names) is no finding of generation 2."""
    rank3, d = _rank3_placed("node-05", says, xid_at=T0 - timedelta(seconds=2))
    assert (rank3.node, rank3.gpu) == ("node-05", None)
    assert of_kind(d, "xid") == []


@pytest.mark.parametrize("says", ["process", "step"])
def test_a_rank_restarted_in_place_keeps_its_gpu_when_its_start_names_none(says) -> None:
    """Generation 2 restarted in place (torchrun); rank 3's records name its node, the
    same as before, but no GPU (its start record lost, or stored ahead of the transition):
    it still runs on its GPU, and a fault of that GPU after the restart is its."""
    rank3, d = _rank3_placed(node_of(3), says, xid_at=T0 + timedelta(seconds=4))
    assert (rank3.node, rank3.gpu) == (node_of(3), gpu_of(3))
    assert [(f.subject, f.role) for f in of_kind(d, "xid")] == [(f"gpu:{gpu_of(3)}", ROOT_CAUSE)]
