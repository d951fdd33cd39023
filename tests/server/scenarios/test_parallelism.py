"""Real parallelism shapes through the real ingest path.

Each scenario: healthy training on 8 ranks (2 nodes x 4 GPUs; 4 for the pipeline), every
rank's `process_groups` record, then its collective window posted by its node's agent.
The healthy shapes (TP x DP with subgroups, a pipeline's send/recv, MoE all_to_all with
uneven splits, FSDP all_gather/reduce_scatter, coalesced calls, groups of unequal sizes)
must raise nothing; in each shape the faults must be named on the right rank: wrong
size, dtype or op in one group, a rank that never entered, a rank stopped at `scheduled`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from console.models import Incident
from tests.conftest import iso
from tests.server.scenarios.timeline import Timeline, only, symptoms

pytestmark = pytest.mark.django_db

HEALTHY_S = 30
WAIT_AT = HEALTHY_S + 1
TP = {"tp0": [0, 1, 2, 3], "tp1": [4, 5, 6, 7]}
DP = {f"dp{i}": [i, i + 4] for i in range(4)}
Entries = Callable[[int], list[dict[str, Any]]]


def _job(post: Any, ranks: int = 8) -> Timeline:
    t = Timeline(post=post, ranks=ranks)
    t.boot(at=0)
    t.good_checkpoint("ckpt-10", at=10.5, step=10)
    t.steps(first=0, count=HEALTHY_S, at=1)
    t.heartbeats(until=HEALTHY_S + 60)
    return t


def _post(t: Timeline, groups: dict[str, list[int]], entries: Entries, at: float) -> None:
    """Every rank's process groups (at boot) and collective window (at `at`)."""
    for rank in range(t.ranks):
        mine = [{"pg": pg, "size": len(m), "ranks": m, "desc": pg.rstrip("0123456789")}
                for pg, m in sorted(groups.items()) if rank in m]  # fmt: skip
        t.add(t.node(rank), t.at(0.5), {
            "kind": "process_groups", "group": t.group, "generation": t.generation,
            "rank": rank, "groups": [{"pg": "default", "size": t.ranks}, *mine]})  # fmt: skip
        t.add(t.node(rank), t.at(at), {
            "kind": "collective", "group": t.group, "generation": t.generation,
            "rank": rank, "entries": entries(rank)})  # fmt: skip


def _call(
    t: Timeline, seq: int, pg: str, op: str = "all_reduce", state: str = "completed", **fields: Any
) -> dict[str, Any]:
    at = WAIT_AT if state != "completed" else HEALTHY_S - 10 + seq * 0.1
    return {"seq": seq, "pg": pg, "op": op, "state": state, "started_ts": iso(t.at(at)),
            "numel": 4096, "dtype": "bfloat16", **fields}  # fmt: skip


def _mismatch(incidents: list[Incident], rank: int) -> Incident:
    incident = only(incidents)
    assert (incident.kind, incident.subject, incident.role) == (
        "collective_mismatch", f"rank:job/{rank}", "root_cause")  # fmt: skip
    assert incident.recovery["auto_restart_safe"] is False
    return incident


# -- TP x DP with subgroups -------------------------------------------------------------


def _tp_dp(t: Timeline, *, odd: dict[int, dict] | None = None, last: str = "completed",
           skip: set[int] = frozenset()) -> Entries:  # fmt: skip
    def entries(rank: int) -> list[dict[str, Any]]:
        tp = "tp0" if rank < 4 else "tp1"
        out = []
        for seq in range(1, 6):
            if seq == 5 and rank in skip:
                continue
            state = last if seq == 5 and tp == "tp1" else "completed"  # tp0 got through
            if tp == "tp0":  # row-parallel: all_reduce the partial sums
                e = _call(t, seq, tp, "all_reduce", state, out_numel=4096)
            else:  # sequence-parallel: gather the shards
                e = _call(t, seq, tp, "all_gather_into_tensor", state, numel=1024,
                          out_numel=4096)  # fmt: skip
            if seq == 5:
                e.update((odd or {}).get(rank, {}))
            out.append(e)
        dp = f"dp{rank % 4}"
        out.append(_call(t, 1, dp, "all_reduce", numel=1 << 20, dtype="float32"))
        return out

    return entries


def test_a_healthy_tp_dp_job_whose_tp_groups_call_different_collectives_raises_nothing(
    post_batch,
):
    t = _job(post_batch)
    _post(t, {**TP, **DP}, _tp_dp(t), at=HEALTHY_S)
    assert t.diagnose(at=HEALTHY_S + 0.5) == []


@pytest.mark.parametrize(
    ("odd", "differs"),
    [
        ({"dtype": "float32"}, "dtype"),
        ({"numel": 512, "out_numel": 2048}, "numel"),
        ({"op": "reduce_scatter_tensor", "numel": 4096, "out_numel": 1024}, "op"),
    ],
)
def test_a_wrong_size_dtype_or_op_in_one_tp_group_is_named_on_its_rank(post_batch, odd, differs):
    t = _job(post_batch)
    _post(t, {**TP, **DP}, _tp_dp(t, odd={6: odd}, last="started"), at=WAIT_AT)
    incident = _mismatch(t.diagnose(at=HEALTHY_S + 20), 6)
    evidence = incident.root_cause["evidence"]
    assert differs in evidence["differs_in"] and evidence["pg"] == "tp1"
    tp1 = [a for a in incident.alerts.all() if a.kind == "collective_timeout"]
    assert sorted(a.evidence["rank"] for a in tp1) == [4, 5, 7]


def test_a_rank_that_never_entered_its_tp_collective_is_the_suspect(post_batch):
    t = _job(post_batch)
    t.steps(first=HEALTHY_S, count=10, at=HEALTHY_S + 1, ranks=[r for r in range(8) if r != 5])
    tp_dp = _tp_dp(t, last="started", skip={5})

    def entries(rank: int) -> list[dict[str, Any]]:
        # tp0 got through its own call and now waits in DP for its peer in tp1.
        extra = [_call(t, 2, f"dp{rank}", state="started", numel=1 << 20)] if rank < 4 else []
        return [*tp_dp(rank), *extra]

    _post(t, {**TP, **DP}, entries, at=HEALTHY_S + 11)
    incident = only(t.diagnose(at=HEALTHY_S + 25))
    assert incident.subject == "rank:job/5"
    assert (incident.kind, incident.role) == ("rank_hang", "undetermined")
    waits = [a for a in incident.alerts.all() if a.kind == "collective_timeout"]
    # tp1 waits for rank 5 directly; tp0 waits in DP for tp1 ranks that wait for rank 5.
    assert sorted(a.evidence["rank"] for a in waits) == [0, 1, 2, 3, 4, 6, 7]


def test_a_rank_stopped_at_scheduled_is_explained_by_its_exit(post_batch):
    t = _job(post_batch)
    t.add(t.node(6), t.at(HEALTHY_S + 0.5), {
        "kind": "process", "group": t.group, "generation": 1, "rank": 6, "event": "exited",
        "exit_code": 1, "reason": "oom", "error_type": "OutOfMemoryError"})  # fmt: skip
    _post(t, {**TP, **DP}, _tp_dp(t, last="started", odd={6: {"state": "scheduled"}}),
          at=WAIT_AT)  # fmt: skip
    oom = only(t.diagnose(at=HEALTHY_S + 3))
    assert (oom.kind, oom.subject) == ("oom", "rank:job/6")
    assert sorted(a.evidence["rank"] for a in oom.alerts.all()
                  if a.kind == "collective_timeout") == [4, 5, 7]  # fmt: skip


def test_a_persistent_desync_is_one_incident_not_one_per_seq(post_batch):
    t = _job(post_batch)

    def entries_until(last_seq: int) -> Entries:
        def entries(rank: int) -> list[dict[str, Any]]:
            return [_call(t, s, "default", dtype="float32" if (rank == 3 and s >= 3)
                          else "bfloat16") for s in range(1, last_seq + 1)]  # fmt: skip

        return entries

    _post(t, {}, entries_until(4), at=HEALTHY_S)
    first = _mismatch(t.diagnose(at=HEALTHY_S + 0.5), 3)
    _post(t, {}, entries_until(9), at=HEALTHY_S + 1)
    again = _mismatch(t.diagnose(at=HEALTHY_S + 1.5), 3)
    assert again.pk == first.pk
    assert again.root_cause["evidence"]["differing_calls"] == 7


# -- pipeline --------------------------------------------------------------------------


def _pipeline(t: Timeline, *, odd=None, stop: int | None = None) -> Entries:
    """Stage r receives from r-1 and sends to r+1, 4 micro-batches; `stop` never sends #3."""

    def entries(rank: int) -> list[dict[str, Any]]:
        out, seq = [], 0
        for k in range(1, 5):
            for op, peer in (("recv", rank - 1), ("send", rank + 1)):
                if not 0 <= peer < t.ranks:
                    continue
                seq += 1
                if rank == stop and k >= 3:
                    return out  # stuck in compute before its 3rd send
                waiting = stop is not None and op == "recv" and peer == stop and k == 3
                e = _call(t, seq, "pp", op, "started" if waiting else "completed", peer=peer,
                          p2p_seq=k)  # fmt: skip
                e.update((odd or {}).get((rank, op, k), {}))
                out.append(e)
                if waiting:
                    return out
        return out

    return entries


def test_a_healthy_pipelines_sends_and_recvs_raise_nothing(post_batch):
    t = _job(post_batch, ranks=4)
    _post(t, {"pp": [0, 1, 2, 3]}, _pipeline(t), at=HEALTHY_S)
    assert t.diagnose(at=HEALTHY_S + 0.5) == []


def test_a_stage_whose_send_changed_size_is_named(post_batch):
    t = _job(post_batch, ranks=4)
    _post(t, {"pp": [0, 1, 2, 3]}, _pipeline(t, odd={(2, "send", 3): {"numel": 2048}}),
          at=HEALTHY_S)  # fmt: skip
    incident = _mismatch(t.diagnose(at=HEALTHY_S + 0.5), 2)
    assert incident.root_cause["evidence"]["dst"] == 3


def test_a_stage_that_never_sent_is_the_suspect_of_the_next_stages_wait(post_batch):
    t = _job(post_batch, ranks=4)
    t.steps(first=HEALTHY_S, count=10, at=HEALTHY_S + 1, ranks=[0, 2, 3])
    _post(t, {"pp": [0, 1, 2, 3]}, _pipeline(t, stop=1), at=HEALTHY_S + 11)
    incident = next(i for i in t.diagnose(at=HEALTHY_S + 25) if i.kind == "rank_hang")
    assert incident.subject == "rank:job/1"
    (wait,) = [a for a in incident.alerts.all() if a.kind == "collective_timeout"]
    assert (wait.evidence["rank"], wait.evidence["peer"]) == (2, 1)


# -- MoE all_to_all, FSDP, coalesced, unequal groups -------------------------------------


def _a2a(t: Timeline, *, bad_rank: int | None = None) -> Entries:
    def entries(rank: int) -> list[dict[str, Any]]:
        ep = [r for r in range(8) if r // 4 == rank // 4]
        me = ep.index(rank)
        send = [(me + 1) * (j + 2) * 64 for j in range(4)]
        recv = [(i + 1) * (me + 2) * 64 for i in range(4)]
        if rank == bad_rank:
            send = [s + 64 for s in send]
        return [_call(t, 1, f"ep{rank // 4}", "all_to_all_single", numel=sum(send),
                      out_numel=sum(recv), in_splits=send, out_splits=recv)]  # fmt: skip

    return entries


def test_moe_all_to_all_with_uneven_splits_raises_nothing(post_batch):
    t = _job(post_batch)
    _post(t, {"ep0": [0, 1, 2, 3], "ep1": [4, 5, 6, 7]}, _a2a(t), at=HEALTHY_S)
    assert t.diagnose(at=HEALTHY_S + 0.5) == []


def test_moe_all_to_all_with_one_ranks_splits_wrong_is_named(post_batch):
    t = _job(post_batch)
    _post(t, {"ep0": [0, 1, 2, 3], "ep1": [4, 5, 6, 7]}, _a2a(t, bad_rank=5), at=HEALTHY_S)
    incident = _mismatch(t.diagnose(at=HEALTHY_S + 0.5), 5)
    assert incident.root_cause["evidence"]["peers_disagreeing"] == 3


UNEQUAL = {"shard_a": [0, 1, 2], "shard_b": [3, 4, 5, 6, 7]}


def _fsdp(t: Timeline, groups: dict[str, list[int]], odd=None) -> Entries:
    def entries(rank: int) -> list[dict[str, Any]]:
        pg, members = next((pg, m) for pg, m in groups.items() if rank in m)
        n = len(members)
        out = [
            _call(t, 1, pg, "all_gather_into_tensor", numel=1000, out_numel=1000 * n),
            _call(t, 2, pg, "reduce_scatter_tensor", numel=1000 * n, out_numel=1000),
            # gradient buckets, coalesced: the members share seq 3
            *(_call(t, 3, pg, "all_reduce", numel=m, out_numel=m, coalesced=7)
              for m in (256, 512)),
        ]  # fmt: skip
        for i, fields in ((odd or {}).get(rank) or {}).items():
            out[i].update(fields)
        return out

    return entries


def test_fsdp_gathers_scatters_and_coalesced_buckets_in_unequal_groups_raise_nothing(post_batch):
    t = _job(post_batch)
    _post(t, UNEQUAL, _fsdp(t, UNEQUAL), at=HEALTHY_S)
    assert t.diagnose(at=HEALTHY_S + 0.5) == []


@pytest.mark.parametrize(
    ("rank", "odd", "differs"),
    [
        (4, {1: {"numel": 3000}}, "size_relation"),  # sized for the 3-rank group
        (1, {0: {"dtype": "float16"}}, "dtype"),
        (6, {3: {"numel": 128, "out_numel": 128}}, "numel"),  # second bucket of the batch
    ],
)
def test_a_wrong_fsdp_or_coalesced_call_in_one_group_is_named(post_batch, rank, odd, differs):
    t = _job(post_batch)
    _post(t, UNEQUAL, _fsdp(t, UNEQUAL, odd={rank: odd}), at=HEALTHY_S)
    incident = _mismatch(t.diagnose(at=HEALTHY_S + 0.5), rank)
    assert differs in incident.root_cause["evidence"]["differs_in"]


def test_a_payload_from_before_process_groups_is_still_judged(post_batch):
    """Golden v1 shape: no process_groups record, entries with seq/pg/op/numel/dtype only."""
    t = _job(post_batch)
    t.collectives(seq=HEALTHY_S, at=WAIT_AT, entered=list(range(8)), **{"2": {"numel": 7}})
    incident = _mismatch(t.diagnose(at=HEALTHY_S + 20), 2)
    assert "collective_timeout" in symptoms(incident)
