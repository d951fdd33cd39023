from __future__ import annotations

from datetime import timedelta

from console.diagnosis import ROOT_CAUSE, SYMPTOM, diagnose
from tests.diagnosis.factory import (
    T0,
    device_event,
    heartbeats,
    of_kind,
    process,
    snap,
    step,
    training,
)

NOW = T0 + timedelta(seconds=5)


def _diag(extra: list[dict], *, state: str = "running", gen: int = 1, base=None):
    recs = [*(base if base is not None else training(ranks=8)), *extra]
    return diagnose(snap(recs, state=state, gen=gen, nodes=heartbeats(8, NOW)), NOW)


def test_it_reports_an_oom_exit_as_a_root_cause() -> None:
    d = _diag([process(4, T0, "exited", exit_code=1, reason="oom")])
    (oom,) = of_kind(d, "oom")
    assert (oom.role, oom.evidence["last_step"]) == (ROOT_CAUSE, 119)


def test_it_reports_an_exception_with_its_type() -> None:
    d = _diag([process(4, T0, "exited", exit_code=1, reason="exception", error_type="KeyError")])
    (exc,) = of_kind(d, "exception")
    assert "KeyError" in exc.summary


def test_it_reports_a_kill_as_process_exit() -> None:
    d = _diag([process(4, T0, "exited", exit_code=None, signal=9, reason="killed")])
    assert [f.kind for f in d.root_causes] == ["process_exit"]


def test_it_ignores_clean_exits_of_a_finished_group() -> None:
    exits = [process(rk, T0, "exited", exit_code=0, reason="clean") for rk in range(8)]
    assert _diag(exits, state="completed").findings == ()


def test_it_files_a_crash_on_a_failed_gpu_as_that_gpus_symptom() -> None:
    d = _diag(
        [
            device_event(4, T0, "xid", 79),
            process(4, T0 + timedelta(seconds=1), "exited", exit_code=1, reason="exception"),
        ]
    )
    (xid,) = of_kind(d, "xid")
    (exc,) = of_kind(d, "exception")
    assert (exc.role, exc.caused_by) == (SYMPTOM, (xid.id,))


def test_it_blocks_restart_after_the_same_step_ooms_in_two_generations() -> None:
    gen1 = [
        step(4, 200, T0 - timedelta(seconds=60), gen=1),
        process(4, T0 - timedelta(seconds=59), "exited", gen=1, reason="oom"),
    ]
    gen2 = [
        *training(ranks=8, gen=2, first_step=181),
        process(4, NOW - timedelta(seconds=1), "exited", gen=2, reason="oom"),
    ]
    d = _diag(gen1 + gen2, gen=2, base=[])
    (oom,) = of_kind(d, "oom")
    assert oom.evidence["deterministic"] == {"step": 200, "generations": [1, 2]}
    assert oom.recovery is not None and oom.recovery.auto_restart_safe is False


def test_it_allows_restart_after_a_one_off_oom() -> None:
    d = _diag([process(4, T0, "exited", exit_code=1, reason="oom")])
    (oom,) = of_kind(d, "oom")
    assert oom.recovery is not None and oom.recovery.auto_restart_safe is True
    assert oom.recovery.checkpoint == "ckpt-100"


def test_it_files_the_launchers_teardown_under_the_first_exit() -> None:
    first = process(4, T0, "exited", exit_code=1, reason="exception", error_type="ValueError")
    later = [
        process(rk, T0 + timedelta(seconds=2), "exited", signal=15, reason="killed")
        for rk in range(8)
        if rk != 4
    ]
    d = _diag([first, *later])
    (root,) = d.root_causes
    assert root.subject.endswith("/4")
    assert sorted(f.caused_by for f in d.findings if f.role == SYMPTOM) == [(root.id,)] * 7


def test_it_keeps_a_later_oom_its_own_root_cause() -> None:
    d = _diag(
        [
            process(4, T0, "exited", exit_code=1, reason="exception"),
            process(5, T0 + timedelta(seconds=3), "exited", exit_code=1, reason="oom"),
        ]
    )
    assert sorted(f.kind for f in d.root_causes) == ["exception", "oom"]


def test_it_folds_a_peers_communication_error_milliseconds_later_under_the_kill() -> None:
    """gloo raises in the survivor within milliseconds: one page, the killed rank."""
    d = _diag(
        [
            process(1, T0, "exited", signal=9, reason="killed"),
            process(0, T0 + timedelta(milliseconds=40), "exited", exit_code=1,
                    reason="exception", error_type="DistBackendError"),
        ]
    )  # fmt: skip
    roots = [f for f in d.findings if f.role == ROOT_CAUSE]
    assert [(f.kind, f.subject) for f in roots] == [("process_exit", "rank:llama-70b/1")]
    (peer,) = of_kind(d, "exception")
    assert peer.role == SYMPTOM and peer.caused_by == (roots[0].id,)
