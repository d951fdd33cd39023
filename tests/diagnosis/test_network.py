"""Network rules over plain records: a partition's sides, a lossy node's retransmits, and
no blame for a healthy node."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from console.diagnosis import ROOT_CAUSE, SYMPTOM, diagnose
from console.diagnosis.findings import node_subject
from tests.diagnosis.factory import (
    T0,
    collective,
    entry,
    heartbeats,
    node_of,
    of_kind,
    snap,
    training,
)

NOW = T0 + timedelta(seconds=1)
RANKS = 3  # one rank per node, as in the drill's namespaces


def _job(ranks: int = RANKS, collective_share: float = 0.25) -> list[dict[str, Any]]:
    recs = training(ranks=ranks, gpus_per_node=1)
    for r in recs:
        if r["kind"] == "step":
            d = r["duration_ms"]
            r["phases"] = {**r["phases"], "collective": d * collective_share,
                           "compute": d * (0.85 - collective_share)}  # fmt: skip
    return recs


def _diag(recs: list[dict[str, Any]], ranks: int = RANKS):
    return diagnose(snap(recs, nodes=heartbeats(ranks, NOW, gpus_per_node=1)), NOW)


def _link(node: str, event: str, ago_s: float = 20.0, state: str = "down") -> dict[str, Any]:
    return {"kind": "net_event", "ts": NOW - timedelta(seconds=ago_s), "node": node,
            "port": "eth0", "link": "eth", "event": event, "state": state,
            "counters": {"carrier_changes": 1}}  # fmt: skip


def _waits(ranks: range, ago_s: float = 300.0) -> list[dict[str, Any]]:
    since = NOW - timedelta(seconds=ago_s)
    return [collective(rk, NOW, [entry(120, "started", since)]) for rk in ranks]


def _ip(rank: int) -> str:
    return f"10.213.7.{rank + 1}"


def _tcp(
    rank: int, stuck_to: tuple[int, ...] = (), ago_s: float = 1.0, once_to: tuple[int, ...] = ()
) -> list[dict[str, Any]]:
    """What the agent of rank's node sends: its address, its peers (agents/host.py)."""
    ts = NOW - timedelta(seconds=ago_s)
    node = node_of(rank, 1)
    base = {"kind": "net_sample", "ts": ts, "node": node, "link": "tcp"}
    out = [
        {**base, "port": "tcp", "counters": {"retrans_segs": 40, "out_segs": 900}},
        {**base, "port": f"tcp-local@{_ip(rank)}", "counters": {"sockets": 4}},
    ]
    for peer in range(RANKS):
        if peer != rank:
            stuck = 1 if peer in stuck_to else 0
            # Of the round's 4 reads of the socket table: all (stuck), one (in flight), none.
            reads = 4 if stuck else 1 if peer in once_to else 0
            out.append({**base, "port": f"tcp@{_ip(peer)}", "counters": {"sockets": 2,
                        "backed_up": stuck, "tx_queue_bytes": 30000 * stuck, "reads": 4,
                        "stuck_reads": reads}})  # fmt: skip
    return out


def _named_nodes(d: Any) -> set[str]:
    return {f.subject for f in d.findings if f.subject.startswith("node:")}


def test_a_cut_node_is_the_partition_and_the_majority_side_may_keep_writing() -> None:
    cut = node_of(2, 1)
    d = _diag([*_job(), _link(cut, "link_down"), *_waits(range(RANKS))])
    (f,) = of_kind(d, "network_partition")
    assert f.role == ROOT_CAUSE and f.subject == node_subject(cut)
    sides = f.evidence["sides"]
    assert sides["cut_off"] == {"nodes": [cut], "ranks": [2], "may_write": False}
    assert sides["connected"]["ranks"] == [0, 1] and sides["connected"]["may_write"] is True
    assert f.evidence["may_write"] == "connected"
    # The healthy side is not named; its waits are the partition's symptoms.
    assert _named_nodes(d) == {node_subject(cut)}
    waits = of_kind(d, "collective_timeout")
    assert waits and all(w.role == SYMPTOM and w.caused_by == (f.id,) for w in waits)
    # No split-brain restart: restarting now would leave the cut-off rank running unseen.
    assert d.recovery is not None and d.recovery.auto_restart_safe is False


def test_a_tie_gives_neither_side_the_right_to_write() -> None:
    d = _diag([*_job(ranks=2), _link(node_of(1, 1), "link_down"), *_waits(range(2))], ranks=2)
    (f,) = of_kind(d, "network_partition")
    assert f.evidence["may_write"] is None
    assert f.evidence["sides"]["connected"]["may_write"] is False


def test_a_link_down_nobody_waits_on_or_that_came_back_is_no_partition() -> None:
    node = node_of(2, 1)
    assert not of_kind(_diag([*_job(), _link(node, "link_down")]), "network_partition")
    back = [_link(node, "link_down", 30), _link(node, "link_up", 20, state="up")]
    assert not of_kind(_diag([*_job(), *back, *_waits(range(RANKS))]), "network_partition")


def test_every_node_cut_names_no_side() -> None:
    links = [_link(node_of(rk, 1), "link_down") for rk in range(RANKS)]
    assert not of_kind(_diag([*_job(), *links, *_waits(range(RANKS))]), "network_partition")


def test_the_node_every_stuck_link_touches_is_the_slow_network() -> None:
    # Node 1's link is slow: its bytes to 0 and 2 queue, and theirs to it.
    tcp = [*_tcp(0, stuck_to=(1,)), *_tcp(1, stuck_to=(0, 2)), *_tcp(2, stuck_to=(1,))]
    d = _diag([*_job(collective_share=0.7), *tcp])
    (f,) = of_kind(d, "network_slow")
    slow = node_of(1, 1)
    assert f.subject == node_subject(slow) and f.role == ROOT_CAUSE
    assert f.evidence["ranks"] == [1]
    assert f.evidence["peers"] == [node_of(0, 1), node_of(2, 1)]
    assert f.evidence["counters"][f"tcp@{_ip(0)}"]["backed_up"] == 1
    assert f.evidence["tcp"]["retrans_segs"] == 40
    assert _named_nodes(d) == {node_subject(slow)}  # never the healthy ones
    assert d.recovery is not None and d.recovery.auto_restart_safe is True


def test_seen_from_one_side_only_it_still_names_the_common_node() -> None:
    # Lossy node 1's own sockets look fine at the instant: its peers' queues name it.
    tcp = [*_tcp(0, stuck_to=(1,)), *_tcp(1), *_tcp(2, stuck_to=(1,))]
    (f,) = of_kind(_diag([*_job(collective_share=0.7), *tcp]), "network_slow")
    assert f.subject == node_subject(node_of(1, 1))


def test_one_stuck_link_has_two_suspects_and_names_nobody() -> None:
    tcp = [*_tcp(0, stuck_to=(1,)), *_tcp(1, stuck_to=(0,)), *_tcp(2)]
    assert not _named_nodes(_diag([*_job(collective_share=0.7), *tcp]))


def test_stuck_links_without_one_common_node_name_nobody() -> None:
    tcp = [*_tcp(0, stuck_to=(1, 2)), *_tcp(1, stuck_to=(2,)), *_tcp(2)]
    assert not _named_nodes(_diag([*_job(collective_share=0.7), *tcp]))


def test_stuck_bytes_while_the_group_does_not_wait_on_the_network_name_nobody() -> None:
    tcp = [*_tcp(0, stuck_to=(1,)), *_tcp(1, stuck_to=(0, 2)), *_tcp(2, stuck_to=(1,))]
    assert not _named_nodes(_diag([*_job(collective_share=0.2), *tcp]))


def test_stale_socket_samples_name_nobody() -> None:
    tcp = [*_tcp(0, (1,), 60), *_tcp(1, (0, 2), 60), *_tcp(2, (1,), 60)]
    assert not _named_nodes(_diag([*_job(collective_share=0.7), *tcp]))


def test_a_healthy_link_caught_once_with_bytes_in_flight_does_not_shift_the_blame() -> None:
    # Node 1 is slow; node 0's socket to node 2 was caught once mid-send (a loaded box):
    # counted as stuck, {0,1} and {0,2} would have named node 0.
    tcp = [*_tcp(0, stuck_to=(1,), once_to=(2,)), *_tcp(1), *_tcp(2, stuck_to=(1,))]
    d = _diag([*_job(collective_share=0.7), *tcp])
    assert _named_nodes(d) == {node_subject(node_of(1, 1))}


def test_collective_stragglers_elsewhere_are_the_located_links_symptoms() -> None:
    # Rank 0's collective phase is the longest (it waits on the slow node): the straggler
    # test alone would file network_slow on node 0, a healthy node.
    recs = _job(collective_share=0.7)
    for r in recs:
        if r["kind"] == "step" and r["rank"] == 0:
            r["duration_ms"] += 700.0
            r["phases"] = {**r["phases"], "collective": r["phases"]["collective"] + 700.0}
    tcp = [*_tcp(0, stuck_to=(1,)), *_tcp(1, stuck_to=(0, 2)), *_tcp(2, stuck_to=(1,))]
    d = _diag([*recs, *tcp])
    assert _named_nodes(d) == {node_subject(node_of(1, 1))}
    (slow,) = of_kind(d, "network_slow")
    stragglers = of_kind(d, "straggler")
    assert stragglers and all(f.caused_by == (slow.id,) for f in stragglers)


def test_a_retransmission_timer_seen_once_is_a_stuck_link() -> None:
    # Lossy node 1: its peers' sockets sat in RTO backoff at one read each.
    tcp = [*_tcp(0), *_tcp(1), *_tcp(2)]
    for r in tcp:
        if r["node"] != node_of(1, 1) and r["port"] == f"tcp@{_ip(1)}":
            r["counters"] = {**r["counters"], "retrans_reads": 1}
    d = _diag([*_job(collective_share=0.7), *tcp])
    assert _named_nodes(d) == {node_subject(node_of(1, 1))}


def _lost(tcp: list[dict[str, Any]], towards: int, resent: int, sent: int) -> None:
    """Every other node's sockets to `towards` resent `resent` of `sent` data segments this
    round (the kernel's per-socket counters), none of them caught stuck or in RTO."""
    for r in tcp:
        port = r["port"]
        if port.startswith("tcp@"):
            lossy = r["node"] != node_of(towards, 1) and port == f"tcp@{_ip(towards)}"
            r["counters"] = {**r["counters"], "retrans_segs": resent if lossy else 0,
                             "data_segs_out": sent}  # fmt: skip


def test_segments_resent_over_the_round_name_the_lossy_node_though_no_read_caught_it() -> None:
    # 20 % random loss on node 1: no read of the socket table landed on a queue or an RTO
    # timer, but its peers' sockets resent 30 of 150 segments to it over the round.
    tcp = [*_tcp(0), *_tcp(1), *_tcp(2)]
    _lost(tcp, towards=1, resent=30, sent=150)
    d = _diag([*_job(collective_share=0.7), *tcp])
    (f,) = of_kind(d, "network_slow")
    assert f.subject == node_subject(node_of(1, 1))
    assert _named_nodes(d) == {node_subject(node_of(1, 1))}
    assert f.evidence["counter"] == "retrans_segs"
    assert (f.evidence["resent_segs"], f.evidence["sent_segs"]) == (60, 600)
    assert "60 of 600 segments on them resent (10%)" in f.summary


def test_a_busy_links_stray_retransmits_are_no_lossy_link() -> None:
    # Two segments resent, or 40 of 100,000 (0.04 %): a healthy link's noise, nobody named.
    for resent, sent in ((2, 10), (40, 100_000)):
        tcp = [*_tcp(0), *_tcp(1), *_tcp(2)]
        _lost(tcp, towards=1, resent=resent, sent=sent)
        assert not _named_nodes(_diag([*_job(collective_share=0.7), *tcp])), (resent, sent)


def test_loss_on_one_link_alone_names_neither_end() -> None:
    tcp = [*_tcp(0), *_tcp(1), *_tcp(2)]
    _lost(tcp, towards=1, resent=30, sent=150)
    for r in tcp:  # only node 0 -> node 1 lost anything
        if r["node"] == node_of(2, 1) and r["port"].startswith("tcp@"):
            r["counters"]["retrans_segs"] = 0
    assert not _named_nodes(_diag([*_job(collective_share=0.7), *tcp]))


def _waiting_rank_0(recs: list[dict[str, Any]], last: int | None = None) -> list[dict[str, Any]]:
    """Rank 0 waits 700 ms more in collectives (in its `last` steps, or all)."""
    steps = sorted(r["step"] for r in recs if r["kind"] == "step" and r["rank"] == 0)
    first = steps[-last] if last else steps[0]
    for r in recs:
        if r["kind"] == "step" and r["rank"] == 0 and r["step"] >= first:
            r["duration_ms"] += 700.0
            r["phases"] = {**r["phases"], "collective": r["phases"]["collective"] + 700.0}
    return recs


def test_a_rank_waiting_in_collectives_names_no_node_while_the_sockets_name_none() -> None:
    """`faultline drill --only lossy_link` on a quiet box: node 1 dropped 20 % of its
    packets; rank 2, downstream of it in the ring, waited longest, and the collective-
    phase path named node 2 (healthy) before the sockets named node 1. With the nodes'
    sockets reported, a waiting rank's node is never named from its phases."""
    one_link = [*_tcp(0, stuck_to=(1,)), *_tcp(1, stuck_to=(0,)), *_tcp(2)]  # two suspects
    d = _diag([*_waiting_rank_0(_job(collective_share=0.7)), *one_link])
    assert not _named_nodes(d)
    (f,) = of_kind(d, "straggler")
    assert f.role == "undetermined" and "sockets name no single node" in str(
        f.evidence["missing_evidence"]
    )
    # Slow for only a few steps: held back while the sockets' rounds come in.
    d = _diag([*_waiting_rank_0(_job(collective_share=0.7), last=4), *one_link])
    assert not _named_nodes(d) and not of_kind(d, "straggler")


def test_without_socket_reports_a_collective_straggler_still_names_its_node() -> None:
    d = _diag(_waiting_rank_0(_job(collective_share=0.7)))
    (f,) = of_kind(d, "network_slow")
    assert f.subject == node_subject(node_of(0, 1))


def test_a_group_whose_processes_all_exited_is_not_slowed_by_its_old_nodes_links() -> None:
    """`faultline drill`: after the slow_link row stopped its job, the partition row cut
    node 2 and the stopped group, still `running` on the console, got a `network_slow`
    on node 2 from its old steps and the new job's sockets."""
    from tests.diagnosis.factory import process

    tcp = [*_tcp(0, stuck_to=(2,)), *_tcp(1, stuck_to=(2,)), *_tcp(2, stuck_to=(0, 1))]
    recs = _job(collective_share=0.7)
    assert _named_nodes(_diag([*recs, *tcp])) == {node_subject(node_of(2, 1))}
    exits = [process(rk, NOW - timedelta(seconds=0.5), "exited", gpus_per_node=1, signal=15)
             for rk in range(RANKS)]  # fmt: skip
    assert not of_kind(_diag([*recs, *exits, *tcp]), "network_slow")
