from __future__ import annotations

from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from console.diagnosis import ROOT_CAUSE, SYMPTOM, UNDETERMINED, diagnose
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


# -- the order of a death and its peers' errors (the verdict must not depend on it) -------

TOLERANCE_S = 3.0  # DiagnosisConfig.ordering_tolerance_s
PEER_ERRORS = {
    "exception": {"exit_code": 1, "reason": "exception", "error_type": "RuntimeError"},
    "dist": {"exit_code": 1, "reason": "exception", "error_type": "DistBackendError"},
    "exit_code": {"exit_code": 1, "reason": "exit_code"},
    "abort": {"exit_code": 134, "signal": 6, "reason": "killed"},
    "teardown": {"exit_code": 143, "signal": 15, "reason": "killed"},
}


@settings(max_examples=150, deadline=None)
@given(
    dead=st.integers(0, 7),
    sig=st.sampled_from([9, 11, 7]),
    peers=st.dictionaries(
        st.integers(0, 7),
        st.tuples(st.sampled_from(sorted(PEER_ERRORS)), st.floats(-TOLERANCE_S + 0.01, 30.0)),
        min_size=1,
        max_size=7,
    ),
    data=st.data(),
)
def test_a_death_is_the_root_cause_whichever_of_its_peers_errors_is_stamped_first(
    dead: int, sig: int, peers: dict[int, tuple[str, float]], data: st.DataObject
) -> None:
    """A rank killed (SIGKILL: a lost node) or crashed (SIGSEGV, SIGBUS), and its peers'
    errors stamped before it (within the tolerance: the launcher reaps the dead process
    after its sockets closed) or after it, handed over in any order: one root cause, the
    death, with every peer's exit folded under it."""
    death = process(dead, T0, "exited", exit_code=128 + sig, signal=sig, reason="killed")
    errors = [
        process(rk, T0 + timedelta(seconds=offset), "exited", **PEER_ERRORS[kind])
        for rk, (kind, offset) in peers.items()
        if rk != dead
    ]
    recs = [death, *errors]
    order = data.draw(st.permutations(range(len(recs))), label="arrival order")
    d = _diag([recs[i] for i in order])
    roots = [f for f in d.findings if f.role == ROOT_CAUSE]
    assert [(f.kind, f.subject) for f in roots] == [("process_exit", f"rank:llama-70b/{dead}")]
    exits = [
        f for f in d.findings if f.kind in ("exception", "process_exit") and f.role != ROOT_CAUSE
    ]
    assert len(exits) == len(errors)
    assert all((f.role, f.caused_by) == (SYMPTOM, (roots[0].id,)) for f in exits)


def test_an_error_more_than_the_tolerance_before_a_kill_is_the_initiator() -> None:
    """Past the tolerance the kill cannot be what the error saw: the error leads and the
    kill is its teardown (a launcher escalating to SIGKILL)."""
    d = _diag(
        [
            process(0, T0, "exited", exit_code=1, reason="exception", error_type="ValueError"),
            process(1, T0 + timedelta(seconds=TOLERANCE_S + 0.5), "exited", signal=9,
                    reason="killed"),
        ]
    )  # fmt: skip
    (root,) = d.root_causes
    assert (root.kind, root.subject) == ("exception", "rank:llama-70b/0")


def test_a_teardown_signal_right_after_an_error_does_not_lead() -> None:
    """SIGTERM is how a launcher tears the job down after a rank raised: the error leads."""
    d = _diag(
        [
            process(0, T0, "exited", exit_code=1, reason="exception", error_type="ValueError"),
            process(1, T0 + timedelta(seconds=0.5), "exited", signal=15, reason="killed"),
        ]
    )
    (root,) = d.root_causes
    assert (root.kind, root.subject) == ("exception", "rank:llama-70b/0")


def test_an_oom_first_keeps_leading_a_kill_that_follows() -> None:
    d = _diag(
        [
            process(0, T0, "exited", exit_code=1, reason="oom"),
            process(1, T0 + timedelta(seconds=1), "exited", signal=9, reason="killed"),
        ]
    )
    (root,) = d.root_causes
    assert (root.kind, root.subject) == ("oom", "rank:llama-70b/0")


def test_a_peers_error_stamped_before_the_exit_of_a_rank_whose_gpu_failed_is_the_gpus() -> None:
    """The survivor's error is stamped first, the rank on the failed GPU exits after it:
    both exits are the Xid's symptoms, nothing else is a root cause."""
    d = _diag(
        [
            device_event(1, T0, "xid", 79),
            process(0, T0 + timedelta(seconds=0.2), "exited", exit_code=1, reason="exception"),
            process(1, T0 + timedelta(seconds=1.5), "exited", exit_code=1, reason="exception"),
        ]
    )
    (xid,) = d.root_causes
    assert xid.kind == "xid"
    by_id = {f.id: f for f in d.findings}

    def root(f):
        while f.caused_by:
            f = by_id[f.caused_by[0]]
        return f

    assert [(f.role, root(f).id) for f in of_kind(d, "exception")] == [(SYMPTOM, xid.id)] * 2


# -- an error whose cause may not have been heard yet ---------------------------------------


def _two_nodes(extra: list[dict], *, now, beats: dict[str, object]):
    """16 ranks on node-01 (0-7) and node-02 (8-15); `beats` overrides node heartbeats."""
    recs = [*training(ranks=16, end=T0 - timedelta(seconds=1)), *extra]
    nodes = {**heartbeats(16, now), **beats}
    return diagnose(snap(recs, now=now, nodes=nodes), now)


def _survivor_error(at=T0):
    return process(0, at, "exited", exit_code=1, reason="exception", error_type="RuntimeError")


def test_an_error_waits_undetermined_for_a_node_not_heard_from_since() -> None:
    """node-02 last delivered before the error (its agent between sends, or its spool held
    by an outage): a death there may yet be reported. Undetermined, saying which node."""
    now = T0 + timedelta(seconds=6)
    d = _two_nodes([_survivor_error()], now=now, beats={"node-02": T0 - timedelta(seconds=1)})
    (exc,) = of_kind(d, "exception")
    assert exc.role == UNDETERMINED and exc.evidence["unheard_nodes"] == ["node-02"]
    assert "node-02" in exc.evidence["missing_evidence"]
    # The spool replays: rank 9's kill, stamped after the error within the tolerance.
    kill = process(9, T0 + timedelta(seconds=2), "exited", signal=9, reason="killed")
    d = _two_nodes([_survivor_error(), kill], now=now + timedelta(seconds=1), beats={})
    (root,) = d.root_causes
    assert (root.kind, root.subject) == ("process_exit", "rank:llama-70b/9")
    assert of_kind(d, "exception")[0].role == SYMPTOM


def test_an_error_is_its_own_root_cause_once_every_node_reported_past_the_tolerance() -> None:
    now = T0 + timedelta(seconds=9)
    late = T0 + timedelta(seconds=TOLERANCE_S + 0.5)  # lagging, but past the window
    d = _two_nodes([_survivor_error()], now=now, beats={"node-02": late})
    (exc,) = of_kind(d, "exception")
    assert exc.role == ROOT_CAUSE


def test_a_lagging_node_whose_ranks_all_exited_holds_nothing() -> None:
    now = T0 + timedelta(seconds=6)
    gone = [process(rk, T0 - timedelta(seconds=0.5), "exited", exit_code=0, reason="clean")
            for rk in range(8, 16)]  # fmt: skip
    d = _two_nodes(
        [*gone, _survivor_error()], now=now, beats={"node-02": T0 - timedelta(seconds=1)}
    )
    assert all(f.role != UNDETERMINED for f in of_kind(d, "exception"))


def test_an_error_after_its_peers_node_was_lost_is_the_node_losss_symptom() -> None:
    """The node died with its ranks and its launcher: no exit is ever reported for them.
    Once it is down, the survivor's error that followed is its symptom."""
    now = T0 + timedelta(seconds=60)
    d = _two_nodes([_survivor_error(T0 + timedelta(seconds=0.05))], now=now,
                   beats={"node-02": T0})  # fmt: skip
    (root,) = d.root_causes
    assert (root.kind, root.subject) == ("node_down", "node:node-02")
    (exc,) = of_kind(d, "exception")
    assert (exc.role, exc.caused_by) == (SYMPTOM, (root.id,))
