"""Network rule family: locate a lossy, shaped or cut link from the nodes' own counters.

Owns `network_partition` (a node of the group whose fabric port went down while the
group's ranks wait in a collective: the ranks on each side, and which side may keep
writing) and the socket-led `network_slow` (the one node that every backed-up TCP link
of the group touches, while the group's steps are dominated by collectives). A
synchronous collective inflates every rank's collective phase alike, so the per-rank
straggler rule (`stragglers`) cannot tell which node's link is slow; the nodes' own
sockets and counters can. Neither finding is filed without both the node's evidence and
the group's symptom, and `network_slow` needs one common node: a single stuck link has
two suspects, and node-wide retransmit counters point at the lossy node's peers (they
retransmit what it dropped), so neither names anybody. Must run after `host` and before
`collectives`, whose waits link to these findings. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from functools import partial
from statistics import median

from console.diagnosis.findings import CRITICAL, MAJOR, ROOT_CAUSE, node_subject
from console.diagnosis.rules.base import RECENT_STEPS, Context
from console.diagnosis.snapshot import NetEvent, NetPort, RankState

# agents/host.py's TCP pseudo-ports: the node's MIB, its addresses, its peers.
TCP_PORT = "tcp"
LOCAL_PREFIX = "tcp-local@"
PEER_PREFIX = "tcp@"
FRESH_S = 30.0  # a sample older than this says nothing about now
ROUND_S = 2.0  # samples this close to a node's newest are of the same agent round
COLLECTIVE_SHARE = 0.5  # of the median step: the group waits on the network
LOSS_MIN_SEGS = 3  # segments retransmitted towards one peer in a round: a lossy link ...
LOSS_SHARE = 0.01  # ... when they are also this share of the data segments sent


def _waiting(ctx: Context) -> list[int]:
    """Ranks that report a collective in flight (agents.torch's watchdog); a function of
    the windows, kept between passes while none changes (`Context.windows_key`)."""
    ranks = ctx.snap.ranks
    return list(ctx.keyed("network_waiting", ctx.windows_key, partial(_in_flight, ranks)))


def _in_flight(ranks: tuple[RankState, ...]) -> tuple[int, ...]:
    return tuple(
        sorted(
            r.rank
            for r in ranks
            if r.collective is not None and any(e.state == "started" for e in r.collective.entries)
        )
    )


def _collective_share(ctx: Context) -> float | None:
    """Median over ranks of the collective phase's share of their recent steps."""
    shares = []
    for r in ctx.snap.ranks:
        steps = [
            s
            for s in ctx.steps(r)[-RECENT_STEPS // 4 :]
            if s.duration_ms and s.phases.collective is not None
        ]
        if steps:
            shares.append(
                median([(s.phases.collective or 0.0) / (s.duration_ms or 1.0) for s in steps])
            )
    return median(shares) if shares else None


def _down_ports(ctx: Context, node: str) -> list[NetEvent]:
    """Fabric ports of `node` whose newest link event is a `link_down` (no `link_up` since)
    and whose newest sample, if any, does not say the port is up again."""
    since = ctx.now - timedelta(seconds=ctx.cfg.host_event_window_s)
    newest: dict[str, NetEvent] = {}
    for e in ctx.snap.net_events:
        if e.node != node or e.ts < since or e.event not in ("link_down", "link_up"):
            continue
        if e.port not in newest or e.ts >= newest[e.port].ts:
            newest[e.port] = e
    out = []
    for port, e in sorted(newest.items()):
        sample = next((p for p in ctx.snap.net_ports if p.node == node and p.port == port), None)
        back_up = (
            sample is not None
            and sample.ts > e.ts
            and (sample.state or "").upper()
            in (
                "UP",
                "ACTIVE",
            )
        )
        if e.event == "link_down" and not back_up:
            out.append(e)
    return out


def _partition(ctx: Context, waiting: list[int]) -> None:
    nodes = sorted(ctx.ranks_on_node)
    # Only a node with a link event can have a port down (not each of 2k nodes a pass).
    told = {e.node for e in ctx.snap.net_events}
    cut = {node: _down_ports(ctx, node) for node in nodes if node in told}
    cut = {node: ports for node, ports in cut.items() if ports}
    if not cut or len(cut) == len(nodes) or not waiting:
        return  # nothing cut, everything cut (no side to name), or nobody waits on it
    cut_ranks = sorted(rk for node in cut for rk in ctx.ranks_on_node[node])
    kept_nodes = [n for n in nodes if n not in cut]
    kept_ranks = sorted(rk for node in kept_nodes for rk in ctx.ranks_on_node[node])
    world = len(cut_ranks) + len(kept_ranks)
    # Quorum: only a side holding a strict majority of the ranks may keep writing (hold the
    # group's state and checkpoints); the cut-off side must be fenced. A tie: neither.
    writer = "connected" if 2 * len(kept_ranks) > world else None
    sides = {
        "cut_off": {"nodes": sorted(cut), "ranks": ctx.capped(cut_ranks), "may_write": False},
        "connected": {
            "nodes": kept_nodes,
            "ranks": ctx.capped(kept_ranks),
            "may_write": writer == "connected",
        },
    }
    for node, ports in sorted(cut.items()):
        e = ports[0]
        f = ctx.put(
            ctx.new(
                kind="network_partition",
                subject=node_subject(node),
                role=ROOT_CAUSE,
                severity=CRITICAL,
                summary=f"Network partition: {node} lost its link ({e.port} {e.event}); "
                f"rank(s) {cut_ranks[:8]} cut off from rank(s) {kept_ranks[:8]}; "
                + (
                    f"the connected side ({len(kept_ranks)} of {world} ranks) may keep writing"
                    if writer
                    else "no side holds a majority: neither may write"
                ),
                first_seen=e.ts,
                last_seen=ctx.now,
                evidence={
                    "node": node,
                    "port": e.port,
                    "link": e.link,
                    "net_event": e.event,
                    "state": e.state,
                    "counters": dict(sorted(e.counters.items())),
                    "at": e.ts,
                    "sides": sides,
                    "may_write": writer,
                    "waiting_ranks": ctx.capped(waiting),
                    "rule": "quorum: a strict majority of the ranks",
                },
            )
        )
        ctx.unsafe_reasons[f.id] = (
            f"network partition ({node} cut off): a restart now runs without the cut-off "
            "ranks, which may still be alive and writing (split brain); heal the link, or "
            f"fence {node} and restart without it"
        )


def _fresh_ports(ctx: Context) -> dict[str, list[NetPort]]:
    """The group's nodes' TCP view of their newest round (older samples of a peer that is
    gone linger in the window: only the samples of a node's newest round count)."""
    by_node: dict[str, list[NetPort]] = {}
    for p in ctx.snap.net_ports:
        if p.link == "tcp" and p.node in ctx.ranks_on_node:
            by_node.setdefault(p.node, []).append(p)
    fresh = ctx.now - timedelta(seconds=FRESH_S)
    out = {}
    for node, ports in by_node.items():
        newest = max(p.ts for p in ports)
        if newest >= fresh:
            out[node] = [p for p in ports if (newest - p.ts).total_seconds() <= ROUND_S]
    return out


def lossy(counters: Mapping[str, int]) -> bool:
    """The kernel's per-socket counters say the round lost segments towards this peer: at
    least `LOSS_MIN_SEGS` retransmitted, and at least `LOSS_SHARE` of the data segments
    sent (a healthy data-centre link resends far under 0.1 %; one lone retransmit of a
    busy link is noise, not a lossy link)."""
    retrans = counters.get("retrans_segs", 0)
    return retrans >= LOSS_MIN_SEGS and retrans >= LOSS_SHARE * counters.get("data_segs_out", 0)


def _stuck(counters: Mapping[str, int]) -> bool:
    """Segments lost over the round (`lossy`), a retransmission timer running in any of
    the round's reads of the socket table, or bytes backed up in most of them (a healthy
    link caught once with bytes in flight is traffic, not a stuck link); one read: that
    read."""
    reads = counters.get("reads", 1)
    if lossy(counters) or counters.get("retrans_reads", 0) > 0:
        return True
    if reads <= 1:
        return counters.get("backed_up", 0) > 0
    return 2 * counters.get("stuck_reads", 0) > reads


def _peer_ports(ports: dict[str, list[NetPort]]) -> list[tuple[frozenset[str], NetPort]]:
    """Each node's per-peer socket sample with the link (node pair) it describes."""
    owner = {
        p.port.removeprefix(LOCAL_PREFIX): node
        for node, ps in ports.items()
        for p in ps
        if p.port.startswith(LOCAL_PREFIX)
    }
    out = []
    for node, ps in ports.items():
        for p in ps:
            peer = owner.get(p.port.removeprefix(PEER_PREFIX))
            if p.port.startswith(PEER_PREFIX) and peer and peer != node:
                out.append((frozenset((node, peer)), p))
    return out


def _loss(
    pairs: list[tuple[frozenset[str], NetPort]], links: set[frozenset[str]]
) -> tuple[int, int]:
    """Segments retransmitted and data segments sent this round on `links`, both ends."""
    resent = sent = 0
    for link, p in pairs:
        if link in links:
            resent += p.counters.get("retrans_segs", 0)
            sent += p.counters.get("data_segs_out", 0)
    return resent, sent


def _slow_links(ctx: Context) -> None:
    """The one node every stuck link of the group touches (network tomography over the
    nodes' sockets). One stuck link alone has two suspects: nobody is named."""
    ports = _fresh_ports(ctx)
    pairs = _peer_ports(ports)
    # Node pairs with bytes stuck or lost between them (seen from either end).
    links = {link for link, p in pairs if _stuck(p.counters)}
    if len(links) < 2:
        return
    common = frozenset.intersection(*links)
    if len(common) != 1:
        return
    (node,) = common
    share = _collective_share(ctx)
    if share is None or share < COLLECTIVE_SHARE:
        return  # the group is not waiting on the network: the stuck bytes are someone else's
    if any(f.kind in ("network_slow", "network_partition") for f in ctx.on(node_subject(node))):
        return
    mib = next((p for p in ports.get(node, ()) if p.port == TCP_PORT), None)
    peers = sorted(n for link in links for n in link if n != node)
    ranks = sorted(ctx.ranks_on_node[node])
    retrans = dict(mib.counters) if mib else {}
    resent, sent = _loss(pairs, links)
    if resent and sent:
        cited = f", {resent} of {sent} segments on them resent ({resent / sent:.0%})"
    elif retrans.get("retrans_segs"):
        cited = f", {retrans['retrans_segs']} segments retransmitted"
    else:
        cited = ""
    ctx.put(
        ctx.new(
            kind="network_slow",
            subject=node_subject(node),
            role=ROOT_CAUSE,
            severity=MAJOR,
            summary=f"Slow or lossy network on {node}: bytes stuck or lost on its links to "
            f"{', '.join(peers[:4])} (every such link of the group touches {node}{cited}); "
            f"collectives take {share:.0%} of the median step",
            first_seen=ctx.now,
            last_seen=ctx.now,
            evidence={
                "node": node,
                "ranks": ctx.capped(ranks),
                "port": TCP_PORT,
                "counter": "retrans_segs" if resent else "backed_up",
                "resent_segs": resent,
                "sent_segs": sent,
                "stuck_links": sorted(sorted(link) for link in links),
                "peers": peers[: ctx.cfg.max_evidence_items],
                "counters": {
                    p.port: dict(p.counters)
                    for p in ports.get(node, ())
                    if p.port.startswith(PEER_PREFIX)
                },
                "tcp": retrans,
                "collective_share": round(share, 3),
            },
        )
    )


def sockets_seen(ctx: Context) -> bool:
    """True when at least two of the group's nodes report their peer sockets this round:
    the tomography above can locate a slow link, so a collective phase inflated on one
    node's ranks (which in a ring points at the link's downstream victim as often as at
    its culprit) names nobody by itself."""
    ports = _fresh_ports(ctx)
    return sum(any(p.port.startswith(PEER_PREFIX) for p in ps) for ps in ports.values()) >= 2


def run(ctx: Context) -> None:
    if not ctx.ranks_on_node:
        return
    _partition(ctx, _waiting(ctx))
    # A cut link stays the story of the exits it caused; but once no process of the group
    # lives, its nodes' sockets carry another job's traffic and slow nothing of this one.
    if not ctx.per_pass("all_exited", None, partial(_all_exited, ctx.snap.ranks)):
        _slow_links(ctx)


def _all_exited(ranks: tuple[RankState, ...]) -> bool:
    return all(r.processes and r.processes[-1].event == "exited" for r in ranks)
