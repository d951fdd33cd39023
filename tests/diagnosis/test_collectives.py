from __future__ import annotations

from datetime import timedelta

from console.diagnosis import ROOT_CAUSE, SYMPTOM, UNDETERMINED, diagnose
from tests.diagnosis.factory import (
    T0,
    collective,
    device_event,
    entry,
    heartbeats,
    of_kind,
    process,
    rank_subject,
    snap,
    training,
)

NOW = T0 + timedelta(minutes=5)
WAIT = T0 + timedelta(seconds=1)


def _windows(
    ranks: int,
    *,
    absent: set[int] = frozenset(),
    odd: dict[int, dict] | None = None,
    last_state: str = "started",
) -> list[dict]:
    out = []
    for rk in range(ranks):
        ents = [entry(40 + i, "completed", T0 - timedelta(seconds=5 - i)) for i in range(5)]
        if rk not in absent:
            ents.append(entry(45, last_state, WAIT, **(odd or {}).get(rk, {})))
        out.append(collective(rk, NOW - timedelta(seconds=2), ents))
    return out


def _diag(recs: list[dict], ranks: int = 8):
    return diagnose(snap(recs, now=NOW, nodes=heartbeats(ranks, NOW)), NOW)


def test_it_blames_the_rank_whose_call_differs_from_the_majority() -> None:
    d = _diag([*training(ranks=8), *_windows(8, odd={6: {"dtype": "float32"}})])
    (m,) = of_kind(d, "collective_mismatch")
    assert (m.subject, m.role) == (rank_subject(6), ROOT_CAUSE)
    assert m.evidence["majority_call"]["dtype"] == "bfloat16"
    assert m.evidence["differs_in"] == ["dtype"]


def test_it_links_waits_at_a_mismatched_seq_to_the_mismatch() -> None:
    d = _diag([*training(ranks=8), *_windows(8, odd={6: {"op": "all_gather"}})])
    (m,) = of_kind(d, "collective_mismatch")
    waits = of_kind(d, "collective_timeout")
    assert len(waits) == 7 and all(w.caused_by == (m.id,) for w in waits)


def test_it_blocks_auto_restart_after_a_mismatch() -> None:
    d = _diag([*training(ranks=8), *_windows(8, odd={6: {"numel": 7}})])
    assert d.recovery is not None and d.recovery.auto_restart_safe is False


def test_it_links_waits_to_the_exit_of_the_rank_that_never_entered() -> None:
    recs = [
        *training(ranks=8),
        *_windows(8, absent={2}),
        process(
            2,
            T0 + timedelta(milliseconds=500),
            "exited",
            exit_code=1,
            reason="exception",
            error_type="RuntimeError",
        ),
    ]
    d = _diag(recs)
    (exc,) = of_kind(d, "exception")
    waits = of_kind(d, "collective_timeout")
    assert exc.role == ROOT_CAUSE and len(waits) == 7
    assert {w.caused_by for w in waits} == {(exc.id,)} and {w.role for w in waits} == {SYMPTOM}


def test_it_says_what_is_missing_when_nothing_explains_the_absent_rank() -> None:
    d = _diag([*training(ranks=8), *_windows(8, absent={2})])
    (suspect,) = of_kind(d, "rank_hang")
    waits = of_kind(d, "collective_timeout")
    assert suspect.role == UNDETERMINED and "missing_evidence" in suspect.evidence
    assert {w.role for w in waits} == {UNDETERMINED} and waits[0].caused_by == (suspect.id,)


def test_it_points_at_links_when_every_rank_entered_and_waits() -> None:
    d = _diag([*training(ranks=8), *_windows(8)])
    waits = of_kind(d, "collective_timeout")
    assert len(waits) == 8 and all(w.role == UNDETERMINED for w in waits)
    assert "links" in waits[0].evidence["missing_evidence"]


def test_it_ignores_waits_shorter_than_the_threshold() -> None:
    recs = [*training(ranks=8), *_windows(8, absent={2})]
    # Waiting 2 s for an unexplained rank stays under the 5 s floor: no story yet.
    d = diagnose(snap(recs, nodes=heartbeats(8, T0)), T0 + timedelta(seconds=3))
    assert of_kind(d, "collective_timeout") == []


def test_it_raises_nothing_when_every_collective_completed() -> None:
    recs = [*training(ranks=8), *_windows(8, last_state="completed")]
    d = diagnose(snap(recs, nodes=heartbeats(8, T0)), T0 + timedelta(seconds=3))
    assert d.findings == ()


def test_it_does_not_time_out_barrier_waits_while_a_checkpoint_is_written() -> None:
    recs = [*training(ranks=8), *_windows(8, absent={0})]
    d = diagnose(snap(recs, state="checkpointing", nodes=heartbeats(8, NOW)), NOW)
    assert d.findings == ()


def test_it_still_reports_a_mismatch_while_checkpointing() -> None:
    recs = [*training(ranks=8), *_windows(8, odd={6: {"dtype": "float32"}})]
    d = diagnose(snap(recs, state="checkpointing", nodes=heartbeats(8, NOW)), NOW)
    assert [f.kind for f in d.findings] == ["collective_mismatch"]


def test_it_folds_waits_under_an_explained_cause_at_once() -> None:
    """A rank lost its GPU one second ago: the others' waits are symptoms immediately."""
    recs = [
        *training(ranks=8),
        *_windows(8, absent={2}),
        device_event(2, WAIT, "xid", code=79),
    ]
    d = diagnose(snap(recs, nodes=heartbeats(8, T0)), WAIT + timedelta(seconds=1))
    roots = [f for f in d.findings if f.role == "root_cause"]
    assert [f.kind for f in roots] == ["xid"]
    waits = of_kind(d, "collective_timeout")
    assert len(waits) == 7
    assert all(f.caused_by == (roots[0].id,) for f in waits)


# -- process groups: TP x DP, pipelines, MoE, FSDP, coalesced --------------

TP = {"tp0": [0, 1, 2, 3], "tp1": [4, 5, 6, 7]}
DP = {f"dp{i}": [i, i + 4] for i in range(4)}


def _groups(rank: int, groups: dict[str, list[int]]) -> dict:
    mine = [
        {"pg": pg, "size": len(members), "ranks": members, "desc": pg.rstrip("0123456789")}
        for pg, members in sorted(groups.items())
        if rank in members
    ]
    return {"kind": "process_groups", "ts": T0, "group": "llama-70b", "generation": 1,
            "rank": rank, "groups": [{"pg": "default", "size": 8}, *mine]}  # fmt: skip


def _e(seq: int, pg: str, state: str = "completed", **fields) -> dict:
    at = WAIT if state == "started" else T0 - timedelta(seconds=60 - seq)
    base = entry(seq, state, at, pg=pg)
    base.update(fields)
    return base


def _parallel(
    per_rank: dict[int, list[dict]], groups: dict[str, list[int]], ranks: int = 8, now=NOW
):
    recs = [*training(ranks=ranks)]
    for rk in range(ranks):
        recs.append(_groups(rk, groups))
        recs.append(collective(rk, T0, per_rank.get(rk, [])))
    return diagnose(snap(recs, now=now, nodes=heartbeats(ranks, now)), now)


HEALTHY = T0 + timedelta(seconds=3)  # just after the last step: nothing may be raised


def _tp_dp(odd: dict[int, dict] | None = None, last: str = "completed", skip=frozenset()):
    """Each TP group runs its own op mix (tp0 all_reduce, tp1 all_gather); DP all_reduces."""
    out: dict[int, list[dict]] = {}
    for rk in range(8):
        tp = "tp0" if rk < 4 else "tp1"
        ents = []
        for seq in range(1, 6):
            state = last if seq == 5 else "completed"
            if seq == 5 and rk in skip:
                continue
            if tp == "tp0":
                e = _e(seq, tp, state, op="all_reduce", numel=4096, out_numel=4096)
            else:
                e = _e(seq, tp, state, op="all_gather_into_tensor", numel=1024, out_numel=4096)
            if seq == 5:
                e.update((odd or {}).get(rk, {}))
            ents.append(e)
        ents.append(_e(1, f"dp{rk % 4}", op="all_reduce", numel=1 << 20, out_numel=1 << 20))
        out[rk] = ents
    return out


def test_it_raises_nothing_when_two_tp_groups_call_different_collectives_at_one_seq() -> None:
    d = _parallel(_tp_dp(), {**TP, **DP}, now=HEALTHY)
    assert d.findings == ()


def test_it_names_the_rank_whose_call_differs_within_its_tp_group_only() -> None:
    d = _parallel(_tp_dp(odd={6: {"dtype": "float32"}}, last="started"), {**TP, **DP})
    (m,) = of_kind(d, "collective_mismatch")
    assert (m.subject, m.role) == (rank_subject(6), ROOT_CAUSE)
    assert m.evidence["pg"] == "tp1" and m.evidence["ranks_at_seq"] == 4
    assert m.evidence["differs_in"] == ["dtype"] and m.evidence["majority_ranks"] == 3
    waits = of_kind(d, "collective_timeout")
    # tp0 waits too, but it has no mismatch of its own: only tp1's waits fold under rank 6.
    assert {w.evidence["rank"] for w in waits if w.caused_by == (m.id,)} == {4, 5, 7}


def test_it_blames_a_broken_size_relation_against_the_group_size() -> None:
    # rank 5 gathers into a buffer sized for a group of 2: out != 4 x in.
    d = _parallel(_tp_dp(odd={5: {"out_numel": 2048}}), {**TP, **DP})
    (m,) = of_kind(d, "collective_mismatch")
    assert m.subject == rank_subject(5) and m.evidence["differs_in"] == ["size_relation"]
    assert m.evidence["size_relation"] == "out_numel 2048 != 4 x numel 1024"


def test_it_opens_one_finding_per_desync_not_per_seq() -> None:
    def windows(last_seq: int) -> dict[int, list[dict]]:
        out = {}
        for rk in range(8):
            out[rk] = [
                _e(s, "default", numel=7 if (rk == 3 and s >= 3) else 1 << 20)
                for s in range(1, last_seq + 1)
            ]
        return out

    first = _parallel(windows(5), {})
    later = _parallel(windows(9), {})
    (a,), (b,) = of_kind(first, "collective_mismatch"), of_kind(later, "collective_mismatch")
    assert a.id == b.id and a.subject == rank_subject(3)
    assert (a.evidence["seq"], a.evidence["differing_calls"]) == (3, 3)
    assert (b.evidence["seq"], b.evidence["differing_calls"]) == (3, 7)


def test_it_calls_a_rank_missing_only_from_the_group_it_belongs_to() -> None:
    # rank 5 never entered tp1 seq 5; tp0's ranks have no tp1 entries and are not missing.
    d = _parallel(_tp_dp(last="started", skip={5}), {**TP, **DP})
    (suspect,) = of_kind(d, "rank_hang")
    assert suspect.subject == rank_subject(5) and suspect.role == UNDETERMINED
    tp1 = [w for w in of_kind(d, "collective_timeout") if w.evidence["pg"] == "tp1"]
    assert sorted(w.evidence["rank"] for w in tp1) == [4, 6, 7]
    assert all(w.evidence["missing_ranks"] == [5] for w in tp1)


def test_it_treats_a_rank_stopped_at_scheduled_as_never_entered() -> None:
    d = _parallel(_tp_dp(last="started", odd={6: {"state": "scheduled"}}), {**TP, **DP})
    (suspect,) = of_kind(d, "rank_hang")
    assert suspect.subject == rank_subject(6)


def test_it_explains_a_subgroup_wait_by_the_exit_of_the_member_that_never_entered() -> None:
    per_rank = _tp_dp(last="started", skip={5})
    recs = [*training(ranks=8)]
    for rk in range(8):
        recs += [_groups(rk, {**TP, **DP}), collective(rk, NOW, per_rank[rk])]
    recs.append(process(5, T0, "exited", exit_code=1, reason="oom", error_type="OutOfMemoryError"))
    d = _diag(recs)
    (oom,) = of_kind(d, "oom")
    tp1 = [w for w in of_kind(d, "collective_timeout") if w.evidence["pg"] == "tp1"]
    assert tp1 and all(w.caused_by == (oom.id,) and w.role == SYMPTOM for w in tp1)


def test_it_calls_a_two_rank_disagreement_undetermined() -> None:
    groups = {"pair": [0, 1]}
    per = {0: [_e(1, "pair", numel=8)], 1: [_e(1, "pair", numel=9)]}
    d = _parallel(per, groups)
    (m,) = of_kind(d, "collective_mismatch")
    assert m.role == UNDETERMINED and m.evidence["tie"] is True


# -- pipeline: send/recv pair by peer and p2p order -----------------------------------


def _pipeline(stages: int = 4, micro: int = 4, odd=None, stop: tuple[int, int] | None = None):
    """Stage s sends activations to s+1 (one pg): stop=(rank, k) means that rank's k-th
    p2p call (send or recv) is still in flight, and nothing after it happened."""
    per: dict[int, list[dict]] = {rk: [] for rk in range(stages)}
    for rk in range(stages):
        seq = 0
        for k in range(1, micro + 1):
            for kind, peer in (("recv", rk - 1), ("send", rk + 1)):
                if not 0 <= peer < stages:
                    continue
                seq += 1
                state = "completed"
                if stop is not None and stop[0] == rk:
                    if seq > stop[1]:
                        break
                    if seq == stop[1]:
                        state = "started"
                e = _e(seq, "pp", state, op=kind, numel=4096, peer=peer, p2p_seq=k)
                e.update((odd or {}).get((rk, kind, k), {}))
                per[rk].append(e)
    return per


def test_it_pairs_sends_and_recvs_of_a_healthy_pipeline_without_a_mismatch() -> None:
    groups = {"pp": [0, 1, 2, 3]}
    d = _parallel(_pipeline(), groups, ranks=4, now=HEALTHY)
    assert d.findings == ()


def test_it_names_the_stage_whose_send_changed_size() -> None:
    per = _pipeline(odd={(1, "send", 3): {"numel": 2048}})
    d = _parallel(per, {"pp": [0, 1, 2, 3]}, ranks=4)
    (m,) = of_kind(d, "collective_mismatch")
    assert (m.subject, m.role) == (rank_subject(1), ROOT_CAUSE)
    assert (m.evidence["src"], m.evidence["dst"], m.evidence["p2p_seq"]) == (1, 2, 3)


def test_it_names_the_stage_that_never_sent() -> None:
    per = _pipeline()
    # stage 2 waits in its 3rd recv from stage 1; stage 1 stopped before its 3rd send.
    per[2] = [e for e in per[2] if (e["op"], e["p2p_seq"]) < ("recv", 3) or e["p2p_seq"] < 3]
    per[2].append(_e(99, "pp", "started", op="recv", numel=4096, peer=1, p2p_seq=3))
    per[1] = [e for e in per[1] if not (e["op"] == "send" and e["p2p_seq"] >= 3)]
    per[3] = [e for e in per[3] if e["p2p_seq"] < 3]
    d = _parallel(per, {"pp": [0, 1, 2, 3]}, ranks=4)
    (suspect,) = of_kind(d, "rank_hang")
    assert suspect.subject == rank_subject(1)
    (wait,) = [w for w in of_kind(d, "collective_timeout") if w.evidence["rank"] == 2]
    assert wait.evidence["missing_ranks"] == [1] and wait.caused_by == (suspect.id,)


# -- MoE all_to_all with uneven splits -------------------------------------------------

EP = {"ep": [0, 1, 2, 3]}


def _a2a(odd: dict[int, dict] | None = None) -> dict[int, list[dict]]:
    # What rank i sends to j: (i + 1) * (j + 2) elements; so j receives that from i.
    send = [[(i + 1) * (j + 2) for j in range(4)] for i in range(4)]
    per = {}
    for rk in range(4):
        ins, outs = send[rk], [send[i][rk] for i in range(4)]
        e = _e(1, "ep", op="all_to_all_single", numel=sum(ins), out_numel=sum(outs),
               in_splits=ins, out_splits=outs)  # fmt: skip
        e.update((odd or {}).get(rk, {}))
        per[rk] = [e]
    return per


def test_it_accepts_an_all_to_all_whose_per_rank_sizes_differ() -> None:
    assert _parallel(_a2a(), EP, ranks=4, now=HEALTHY).findings == ()


def test_it_names_the_rank_whose_all_to_all_splits_disagree_with_every_peer() -> None:
    per = _a2a()
    bad = [x + 1 for x in per[2][0]["in_splits"]]
    per[2][0].update(in_splits=bad, numel=sum(bad))
    d = _parallel(per, EP, ranks=4)
    (m,) = of_kind(d, "collective_mismatch")
    assert (m.subject, m.role) == (rank_subject(2), ROOT_CAUSE)
    assert m.evidence["peers_disagreeing"] == 3


def test_it_flags_all_to_all_totals_that_do_not_balance_without_splits() -> None:
    per = _a2a()
    for rk in range(4):
        per[rk][0].pop("in_splits")
        per[rk][0].pop("out_splits")
    per[0][0]["numel"] += 5
    d = _parallel(per, EP, ranks=4)
    (m,) = of_kind(d, "collective_mismatch")
    assert m.role == UNDETERMINED and m.evidence["input_total"] - m.evidence["output_total"] == 5


# -- FSDP all_gather / reduce_scatter, unequal group sizes ----------------------------


def _fsdp(groups: dict[str, list[int]], odd=None) -> dict[int, list[dict]]:
    per = {}
    for rk in range(8):
        pg, members = next((pg, m) for pg, m in groups.items() if rk in m)
        n = len(members)
        ents = [
            _e(1, pg, op="all_gather_into_tensor", numel=1000, out_numel=1000 * n),
            _e(2, pg, op="reduce_scatter_tensor", numel=1000 * n, out_numel=1000),
        ]
        for i, fields in (odd or {}).get(rk, {}).items():
            ents[i].update(fields)
        per[rk] = ents
    return per


def test_it_accepts_fsdp_gathers_and_scatters_in_groups_of_different_sizes() -> None:
    groups = {"shard_a": [0, 1, 2], "shard_b": [3, 4, 5, 6, 7]}
    assert _parallel(_fsdp(groups), groups, now=HEALTHY).findings == ()


def test_it_names_a_reduce_scatter_sized_for_the_other_group() -> None:
    groups = {"shard_a": [0, 1, 2], "shard_b": [3, 4, 5, 6, 7]}
    d = _parallel(_fsdp(groups, odd={4: {1: {"numel": 3000}}}), groups)
    (m,) = of_kind(d, "collective_mismatch")
    assert m.subject == rank_subject(4) and m.evidence["pg_size"] == 5
    assert m.evidence["size_relation"] == "numel 3000 != 5 x out_numel 1000"


# -- coalesced batches match member by member ------------------------------------------


def _coalesced(odd=None, drop: int | None = None) -> dict[int, list[dict]]:
    per = {}
    for rk in range(8):
        ents = [_e(1, "default", numel=n, coalesced=1) for n in (100, 200, 300)]
        for i, fields in (odd or {}).get(rk, {}).items():
            ents[i].update(fields)
        if rk == drop:
            ents.pop()
        per[rk] = ents
    return per


def test_it_accepts_a_coalesced_batch_that_every_rank_made_alike() -> None:
    assert _parallel(_coalesced(), {}, now=HEALTHY).findings == ()


def test_it_names_the_rank_whose_second_coalesced_member_differs() -> None:
    d = _parallel(_coalesced(odd={3: {1: {"dtype": "float16"}}}), {})
    (m,) = of_kind(d, "collective_mismatch")
    assert m.subject == rank_subject(3)
    assert m.evidence["coalesced_members"]["index"] == 1
    assert m.evidence["differs_in"] == ["dtype"]


def test_it_names_the_rank_whose_coalesced_batch_has_fewer_members() -> None:
    d = _parallel(_coalesced(drop=7), {})
    (m,) = of_kind(d, "collective_mismatch")
    assert m.subject == rank_subject(7) and m.evidence["differs_in"] == ["coalesced"]


# -- waits across groups: follow the chain to the rank that blocks it -----------------


def test_it_follows_waits_across_groups_to_the_one_rank_that_blocks_them() -> None:
    per: dict[int, list[dict]] = {}
    for rk in range(8):
        tp, dp = ("tp0" if rk < 4 else "tp1"), f"dp{rk % 4}"
        if rk < 4:  # tp0 finished its calls and waits for its DP peer in tp1
            per[rk] = [*(_e(s, tp) for s in range(1, 6)), _e(1, dp), _e(2, dp, "started")]
        elif rk == 5:  # stuck in compute: never entered tp1 seq 5
            per[rk] = [*(_e(s, tp) for s in range(1, 5)), _e(1, dp)]
        else:
            per[rk] = [*(_e(s, tp) for s in range(1, 5)), _e(5, tp, "started"), _e(1, dp)]
    d = _parallel(per, {**TP, **DP})
    (suspect,) = of_kind(d, "rank_hang")
    assert suspect.subject == rank_subject(5)
    waits = of_kind(d, "collective_timeout")
    assert sorted(w.evidence["rank"] for w in waits) == [0, 1, 2, 3, 4, 6, 7]
    assert all(w.caused_by == (suspect.id,) for w in waits)
    (w0,) = [w for w in waits if w.evidence["rank"] == 0]
    assert (w0.evidence["missing_ranks"], w0.evidence["blocking_ranks"]) == ([4], [5])


def test_it_calls_two_ranks_blocked_on_each_other_an_ordering_deadlock() -> None:
    per = {
        0: [_e(1, "default", "started", op="send", peer=1, p2p_seq=1)],
        1: [_e(1, "default", "started", op="send", peer=0, p2p_seq=1)],
    }
    d = _parallel(per, {}, ranks=2)
    assert of_kind(d, "rank_hang") == []
    waits = of_kind(d, "collective_timeout")
    assert len(waits) == 2 and all(w.role == UNDETERMINED for w in waits)
    assert "deadlock" in waits[0].evidence["missing_evidence"]


def test_it_takes_the_membership_most_ranks_reported_and_the_world_when_ranks_are_absent():
    recs = [*training(ranks=4)]
    for rk in range(4):
        tp = {"pg": "tp", "size": 2, "ranks": [0, 1] if rk != 3 else [0, 3]}
        recs.append({**_groups(rk, {}), "groups": [{"pg": "default", "size": 4}, tp]})
    s = snap(recs, now=NOW)
    by_pg = {g.pg: g for g in s.process_groups}
    assert by_pg["default"].ranks == (0, 1, 2, 3)
    assert by_pg["tp"].ranks == (0, 1) and by_pg["tp"].reported_by == (0, 1, 2, 3)


def _late_member(wait_s: float, late_s: float) -> list[tuple[str, str]]:
    """Ranks 0-7 (node 1, up to date) have waited `wait_s` in all_reduce seq 45; ranks 8-15
    (node 2) had not entered it in the newest window their node delivered, `late_s` ago:
    an agent sends every few seconds (the shipped send_interval is 5 s)."""
    wait = T0 + timedelta(seconds=1)
    now = wait + timedelta(seconds=wait_s)
    delivered = now - timedelta(seconds=late_s)
    recs = [*training(ranks=16)]
    for rk in range(16):
        ents = [entry(40 + i, "completed", T0 - timedelta(seconds=5 - i)) for i in range(5)]
        if rk < 8:
            ents.append(entry(45, "started", wait))
        recs.append(collective(rk, now - timedelta(seconds=0.5) if rk < 8 else delivered, ents))
    nodes = heartbeats(16, now - timedelta(seconds=0.5))
    nodes[sorted(nodes)[1]] = delivered
    d = diagnose(snap(recs, now=now, nodes=nodes), now)
    return sorted({(f.kind, f.role) for f in d.findings})


def test_a_member_whose_node_has_not_delivered_yet_is_not_called_missing() -> None:
    """6 s of waiting by the clock, but the members' node delivered 4.5 s ago: as far as
    anyone knows they were 1.5 s late, under the 5 s floor. No suspect, no timeout."""
    assert _late_member(wait_s=6, late_s=4.5) == []


def test_a_member_absent_from_what_its_node_delivered_is_still_found() -> None:
    # The same wait with the members' node up to date: they never entered.
    assert ("rank_hang", UNDETERMINED) in _late_member(wait_s=6, late_s=0.5)
    # Late, but absent for longer than the threshold in what was delivered: named too.
    assert ("rank_hang", UNDETERMINED) in _late_member(wait_s=11, late_s=4.5)
