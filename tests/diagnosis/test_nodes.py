from __future__ import annotations

from datetime import timedelta

from console.diagnosis import ROOT_CAUSE, SYMPTOM, diagnose
from tests.diagnosis.factory import T0, heartbeats, of_kind, snap, step, training


def test_it_calls_a_node_down_when_heartbeats_and_its_ranks_stop() -> None:
    now = T0 + timedelta(seconds=50)
    recs = [r for r in training(ranks=16) if not (r["kind"] == "step" and r["rank"] < 8)]
    recs += [step(rk, 119, T0 - timedelta(seconds=60)) for rk in range(8)]
    recs += [step(rk, 120, now) for rk in range(8, 16)]
    hb = {**heartbeats(16, now), "node-01": T0 - timedelta(seconds=60)}
    d = diagnose(snap(recs, nodes=hb), now)
    (down,) = of_kind(d, "node_down")
    assert (down.subject, down.role, down.evidence["stopped_ranks"]) == (
        "node:node-01",
        ROOT_CAUSE,
        list(range(8)),
    )


def test_it_links_rank_hangs_on_a_dead_node_to_it() -> None:
    now = T0 + timedelta(minutes=3)
    hb = {**heartbeats(16, now), "node-01": T0}
    d = diagnose(snap(training(ranks=16), nodes=hb), now)
    (stall,) = of_kind(d, "group_stall")
    (down,) = of_kind(d, "node_down")
    assert (stall.role, stall.caused_by) == (SYMPTOM, (down.id,))


def test_it_calls_a_silent_agent_on_a_working_node_minor() -> None:
    hb = {**heartbeats(16, T0), "node-02": T0 - timedelta(minutes=5)}
    d = diagnose(snap(training(ranks=16), nodes=hb), T0 + timedelta(seconds=1))
    assert [(f.kind, f.severity) for f in d.findings] == [("agent_silent", "minor")]


def test_covered_ranks_are_the_ranks_covered_says_are_covered() -> None:
    """`Context.covered_ranks` (one look per subject with findings; the collectives rule's
    16k waiters) is `covered` asked of every rank: a dead node's ranks, an Xid'd GPU's
    rank, a rank's own finding, and not an informational Xid's rank."""
    from console.diagnosis import engine
    from console.diagnosis.config import DiagnosisConfig
    from console.diagnosis.rules.base import Context
    from tests.diagnosis.factory import device_event, process

    now = T0 + timedelta(seconds=50)
    recs = [r for r in training(ranks=24) if not (r["kind"] == "step" and r["rank"] < 8)]
    recs += [step(rk, 119, T0 - timedelta(seconds=60)) for rk in range(8)]
    recs += [step(rk, 120, now) for rk in range(8, 24)]
    recs += [device_event(9, now, "xid", 79), device_event(12, now, "xid", 63)]
    recs += [process(17, now, "exited", exit_code=1, reason="exception")]
    hb = {**heartbeats(24, now), "node-01": T0 - timedelta(seconds=60)}
    ctx = Context(snap(recs, nodes=hb), now, DiagnosisConfig())
    for name, rule in engine.RULES:
        rule(ctx)
        assert ctx.covered_ranks() == {rk for rk in ctx.ranks if ctx.covered(rk)}, name
    assert {*range(8), 9, 17} <= ctx.covered_ranks() and 12 not in ctx.covered_ranks()
