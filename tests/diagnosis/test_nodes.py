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


def _silent_old_node(*, gen2_ranks: bool) -> list:
    """node-02 went silent; the group restarted at T0 + 1 s (generation 2), its ranks not
    reported yet unless `gen2_ranks` (then every rank is back, stepping, on node-03 or later)."""
    from tests.diagnosis.factory import process, transition

    at = T0 + timedelta(seconds=1)
    now = at + timedelta(seconds=40)
    recs = [*training(ranks=16), transition(at, "recovering", "running", gen=2)]
    if gen2_ranks:
        recs += [{**process(rk, at, "started", gen=2), "node": "node-03"} for rk in range(16)]
        recs += [{**step(rk, 200, now), "generation": 2} for rk in range(16)]
    hb = {**heartbeats(16, now), "node-02": T0 - timedelta(minutes=5)}
    d = diagnose(snap(recs, gen=2, nodes=hb), now)
    return [f for f in of_kind(d, "agent_silent") if f.subject == "node:node-02"]


def test_a_silent_agent_says_why_its_node_is_not_called_down() -> None:
    """The minor finding's reason is true of the node: its ranks progress; the generation
    has not said where it runs yet (after a restart); or none of the group's ranks run there."""
    hb = {**heartbeats(16, T0), "node-02": T0 - timedelta(minutes=5)}
    (busy,) = of_kind(diagnose(snap(training(ranks=16), nodes=hb), T0 + timedelta(seconds=1)),
                      "agent_silent")  # fmt: skip
    assert busy.summary.endswith("its ranks still progress")
    (waiting,) = _silent_old_node(gen2_ranks=False)
    assert waiting.severity == "minor"
    assert waiting.summary.endswith("this generation's ranks have not said where they run yet")
    (left,) = _silent_old_node(gen2_ranks=True)
    assert left.severity == "minor"
    assert left.summary.endswith("no rank of this group runs there")
