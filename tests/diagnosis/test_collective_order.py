"""Call order across process groups: a rank that enters a collective on the wrong group.

A small SPMD simulator runs every rank's program (per step: its TP, PP and DP groups'
all_reduce, then the world's) over a Megatron-style layout, completing a collective once
every member of that group stands at it, until nothing can move; each rank's window is what
`agents.torch` sends (per-pg `seq`, or one counter per rank), with the `process_groups`
records it sends (torch's numeric pg names, a `desc` per dimension). Faults: a rank that
enters its TP/PP/DP group's all_reduce where the world's comes (the flight recorder's "not
all ranks joining"), a rank that skips its group's call and goes on to the world's (the
mirror: the peers it left behind wait in the group's call), a rank that hangs before its
call. The neighbours: healthy ranks caught mid-step in different groups' calls (a pipeline's
stages), which is no mismatch however the run is cut.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from console.diagnosis import ROOT_CAUSE, SYMPTOM, UNDETERMINED, diagnose
from tests.diagnosis.factory import GROUP, T0, collective, heartbeats, of_kind, process, snap

NOW = T0 + timedelta(seconds=60)
STUCK = NOW - timedelta(seconds=30)  # far past the 4 s floor
ROLES = ("tp", "pp", "dp")


@dataclass(frozen=True)
class Layout:
    world: int
    tp: int = 1
    pp: int = 1

    @property
    def dp(self) -> int:
        return self.world // (self.tp * self.pp)

    def groups(self) -> dict[str, tuple[str, list[int]]]:
        """pg name -> (desc, members), named as torch names them: "1", "2", ... in creation
        order (every rank creates every group)."""
        by_role: list[tuple[str, list[int]]] = []
        tp, dp, pp = self.tp, self.dp, self.pp
        ranks = range(self.world)
        if tp > 1:
            for start in range(0, self.world, tp):
                by_role.append(("tp", list(range(start, start + tp))))
        if pp > 1:
            for k in range(dp * tp):
                by_role.append(("pp", [k + s * dp * tp for s in range(pp)]))
        if dp > 1:
            for stage in range(pp):
                for t in range(tp):
                    by_role.append(
                        ("dp", [r for r in ranks if r // (dp * tp) == stage and r % tp == t])
                    )
        return {str(i + 1): g for i, g in enumerate(by_role)}

    def roles_of(self, rank: int) -> dict[str, str]:
        """role -> this rank's pg of that role (the world is "default")."""
        out = {role: pg for pg, (role, members) in self.groups().items() if rank in members}
        return {**out, "default": "default"}

    def __str__(self) -> str:
        return f"w{self.world}-tp{self.tp}-pp{self.pp}-dp{self.dp}"


def _program(layout: Layout, rank: int, steps: int) -> list[str]:
    """The rank's calls in order, as pg names: each step its groups' all_reduce, then the
    world's."""
    mine = layout.roles_of(rank)
    order = [mine[r] for r in ROLES if r in mine] + ["default"]
    return order * steps


def _run(
    layout: Layout, programs: dict[int, list[str]], rnd: random.Random, budget: int | None = None
) -> dict[int, tuple[list[str], str | None]]:
    """Run the programs: repeatedly complete one collective all of whose members stand at it
    (picked at random: any interleaving a real run may take), at most `budget` times.
    Returns rank -> (calls completed, the call it stands in or None when done)."""
    members = {pg: m for pg, (_, m) in layout.groups().items()}
    members["default"] = list(range(layout.world))
    pc = dict.fromkeys(programs, 0)

    def current(rk: int) -> str | None:
        prog = programs[rk]
        return prog[pc[rk]] if pc[rk] < len(prog) else None

    done = 0
    while budget is None or done < budget:
        ready = sorted(
            {
                pg
                for rk in programs
                if (pg := current(rk)) is not None
                if all(current(m) == pg for m in members[pg])
            }
        )
        if not ready:
            break
        pg = rnd.choice(ready)
        for m in members[pg]:
            pc[m] += 1
        done += 1
    return {rk: (programs[rk][: pc[rk]], current(rk)) for rk in programs}


def _records(
    layout: Layout,
    state: dict[int, tuple[list[str], str | None]],
    *,
    per_rank: bool,
    waited_since: Any = STUCK,
    hung: frozenset[int] = frozenset(),
) -> list[dict[str, Any]]:
    """What the ranks send: a process start, `process_groups` (as agents.torch builds it:
    the world first, then the rank's groups by name), and each rank's newest 48 calls."""
    recs: list[dict[str, Any]] = []
    groups = layout.groups()
    for rk, (calls, standing) in sorted(state.items()):
        recs.append(process(rk, T0 - timedelta(minutes=5), "started"))
        mine = [
            {"pg": pg, "size": len(m), "ranks": m, "desc": desc}
            for pg, (desc, m) in sorted(groups.items())
            if rk in m
        ]
        recs.append(
            {
                "kind": "process_groups",
                "ts": T0,
                "group": GROUP,
                "generation": 1,
                "rank": rk,
                "groups": [{"pg": "default", "size": layout.world}, *mine],
            }
        )
        seqs: dict[str, int] = {}
        entries = []
        issued = calls + ([standing] if standing is not None and rk not in hung else [])
        for i, pg in enumerate(issued):
            seqs[pg] = seqs.get(pg, 0) + 1
            last = i == len(issued) - 1 and standing is not None and rk not in hung
            at = (
                waited_since
                if last
                else waited_since - timedelta(milliseconds=10 * (len(issued) - i))
            )
            entries.append(
                {
                    "seq": i + 1 if per_rank else seqs[pg],
                    "pg": pg,
                    "op": "all_reduce",
                    "numel": 4096,
                    "dtype": "bfloat16",
                    "state": "started" if last else "completed",
                    "started_ts": at,
                }
            )
        recs.append(collective(rk, NOW - timedelta(seconds=1), entries[-48:]))
    return recs


def _diagnose(layout: Layout, recs: list[dict[str, Any]]):
    return diagnose(snap(recs, now=NOW, nodes=heartbeats(layout.world, NOW)), NOW)


def _layouts() -> list[Layout]:
    out = [Layout(2, tp=2)]
    for w in (4, 8, 16):
        out += [Layout(w, tp=2), Layout(w, pp=2), Layout(w, tp=2, pp=2)]
    out += [Layout(8, tp=4), Layout(16, tp=4, pp=2), Layout(16, tp=8)]
    return [lay for lay in out if lay.dp >= 1 and lay.world % (lay.tp * lay.pp) == 0]


def _cases(fault: str) -> list[tuple[Layout, int, str]]:
    """(layout, culprit, role) for every layout, every culprit (every 3rd rank past 8) and
    every group role the culprit has."""
    out = []
    for lay in _layouts():
        for rk in range(lay.world) if lay.world <= 8 else range(0, lay.world, 3):
            out += [(lay, rk, role) for role in ROLES if role in lay.roles_of(rk)]
    return out


def _faulty(layout: Layout, culprit: int, role: str, fault: str, steps: int = 4):
    programs = {rk: _program(layout, rk, steps) for rk in range(layout.world)}
    prog = programs[culprit]
    last = len(prog) - 1  # the last step's world all_reduce
    group_pg = layout.roles_of(culprit)[role]
    if fault == "wrong_group":  # its group's all_reduce where the world's comes
        prog[last] = group_pg
    else:  # "skip": it leaves its group's last call out and goes on to the world's
        del prog[max(i for i, pg in enumerate(prog) if pg == group_pg)]
    return _run(layout, programs, random.Random(culprit))


def _assert_named(d: Any, culprit: int, layout: Layout) -> None:
    mismatches = of_kind(d, "collective_mismatch")
    waits = of_kind(d, "collective_timeout")
    assert [(m.subject, m.role) for m in mismatches] == [(f"rank:{GROUP}/{culprit}", ROOT_CAUSE)], [
        f.summary for f in d.findings
    ]
    (m,) = mismatches
    assert m.evidence["differs_in"] == ["order"]
    assert set(m.evidence["blocked_in"]) == {"rank", "waiting"}
    assert of_kind(d, "rank_hang") == []
    assert waits, "the ranks blocked by the culprit wait"
    assert all((w.role, w.caused_by) == (SYMPTOM, (m.id,)) for w in waits), [
        w.summary for w in waits
    ]
    assert culprit not in {w.evidence["rank"] for w in waits}
    assert d.recovery is not None and d.recovery.auto_restart_safe is False


@pytest.mark.parametrize("per_rank", [False, True], ids=["per-pg-seq", "per-rank-seq"])
@pytest.mark.parametrize(("layout", "culprit", "role"), _cases("wrong_group"), ids=str)
def test_a_rank_in_its_groups_call_where_the_world_waits_is_the_culprit(
    layout: Layout, culprit: int, role: str, per_rank: bool
) -> None:
    state = _faulty(layout, culprit, role, "wrong_group")
    assert state[culprit][1] == layout.roles_of(culprit)[role]
    d = _diagnose(layout, _records(layout, state, per_rank=per_rank))
    if layout.world == 2:
        # Two ranks, each in the other's missing call, and nobody else to say the order:
        # undetermined, and each side's wait says where the other is blocked.
        assert of_kind(d, "collective_mismatch") == []
        waits = of_kind(d, "collective_timeout")
        assert {w.role for w in waits} == {UNDETERMINED} and len(waits) == 2
        assert all("deadlock" in w.evidence["missing_evidence"] for w in waits)
        assert any(f"pg {state[culprit][1]}" in w.evidence["missing_evidence"] for w in waits)
        return
    _assert_named(d, culprit, layout)
    (m,) = of_kind(d, "collective_mismatch")
    assert m.evidence["rank_call"]["pg"] == layout.roles_of(culprit)[role]
    assert m.evidence["majority_call"]["pg"] == "default"


@pytest.mark.parametrize("per_rank", [False, True], ids=["per-pg-seq", "per-rank-seq"])
@pytest.mark.parametrize(("layout", "culprit", "role"), _cases("skip"), ids=str)
def test_a_rank_that_skipped_its_groups_call_is_the_culprit_not_the_peers_it_left(
    layout: Layout, culprit: int, role: str, per_rank: bool
) -> None:
    """The mirror: the peers it left stand in the group's call while the world waits in
    its all_reduce for them. The world's majority alone would name a peer; the order every
    other rank called the two in names the rank that skipped."""
    state = _faulty(layout, culprit, role, "skip")
    d = _diagnose(layout, _records(layout, state, per_rank=per_rank))
    if layout.world == 2:
        assert of_kind(d, "collective_mismatch") == []
        assert {w.role for w in of_kind(d, "collective_timeout")} == {UNDETERMINED}
        return
    _assert_named(d, culprit, layout)


@pytest.mark.parametrize(("layout", "culprit", "role"), _cases("wrong_group")[::3], ids=str)
def test_a_rank_that_hangs_before_its_call_is_a_hang_not_a_mismatch(
    layout: Layout, culprit: int, role: str
) -> None:
    programs = {rk: _program(layout, rk, 4) for rk in range(layout.world)}
    programs[culprit] = programs[culprit][:-1]  # it never reaches the last world all_reduce
    state = _run(layout, programs, random.Random(culprit))
    recs = _records(layout, state, per_rank=False, hung=frozenset({culprit}))
    d = _diagnose(layout, recs)
    assert of_kind(d, "collective_mismatch") == []
    (hang,) = of_kind(d, "rank_hang")
    assert hang.subject == f"rank:{GROUP}/{culprit}"


def test_the_wrong_group_is_undetermined_without_process_group_records() -> None:
    """Without `process_groups` the TP groups of other ranks are not known to be the same
    kind of group as the culprit's: nobody can say the order, nobody is named."""
    layout = Layout(8, tp=2)
    state = _faulty(layout, 3, "tp", "wrong_group")
    recs = [r for r in _records(layout, state, per_rank=False) if r["kind"] != "process_groups"]
    d = _diagnose(layout, recs)
    assert of_kind(d, "collective_mismatch") == []
    assert {w.role for w in of_kind(d, "collective_timeout")} == {UNDETERMINED}


def test_a_fresh_circle_is_not_yet_a_mismatch() -> None:
    """Ranks in different groups' calls for less than the threshold may be an async op
    issued early: no verdict until the circle has lasted."""
    layout = Layout(8, tp=2)
    state = _faulty(layout, 3, "tp", "wrong_group")
    recs = _records(layout, state, per_rank=False, waited_since=NOW - timedelta(seconds=2))
    assert _diagnose(layout, recs).findings == ()


# -- the healthy neighbours: ranks mid-step in different groups' calls -------------------


@settings(max_examples=60, deadline=None)
@given(
    layout=st.sampled_from(_layouts()),
    seed=st.integers(0, 2**16),
    cut=st.integers(0, 60),
    per_rank=st.booleans(),
)
def test_healthy_ranks_caught_in_different_groups_calls_raise_nothing(
    layout: Layout, seed: int, cut: int, per_rank: bool
) -> None:
    """Any point of a healthy run (collectives completed in any order the groups allow)
    with the waits younger than the threshold: no finding at all."""
    programs = {rk: _program(layout, rk, 4) for rk in range(layout.world)}
    state = _run(layout, programs, random.Random(seed), budget=cut)
    recs = _records(layout, state, per_rank=per_rank, waited_since=NOW - timedelta(seconds=1))
    d = _diagnose(layout, recs)
    assert d.findings == (), [f.summary for f in d.findings]


@settings(max_examples=60, deadline=None)
@given(
    layout=st.sampled_from([lay for lay in _layouts() if lay.world >= 4]),
    seed=st.integers(0, 2**16),
    cut=st.integers(0, 60),
    per_rank=st.booleans(),
)
def test_a_stuck_healthy_cut_never_names_an_order_mismatch(
    layout: Layout, seed: int, cut: int, per_rank: bool
) -> None:
    """The same cut left standing past the threshold (something stopped the run there, not
    the order): whatever else is said, no rank is blamed for its call order."""
    programs = {rk: _program(layout, rk, 4) for rk in range(layout.world)}
    state = _run(layout, programs, random.Random(seed), budget=cut)
    d = _diagnose(layout, _records(layout, state, per_rank=per_rank))
    assert of_kind(d, "collective_mismatch") == [], [f.summary for f in d.findings]
