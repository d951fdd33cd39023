"""Node rule family: a silent node whose ranks also stopped is down; otherwise only
its agent is silent.

Owns `node_down` and `agent_silent`. Must not treat a missing heartbeat alone as an
outage: a heartbeat proves nothing about the workload, and its absence proves little.
"""

from __future__ import annotations

from console.diagnosis.findings import CRITICAL, MINOR, ROOT_CAUSE, node_subject
from console.diagnosis.rules.base import Context


def run(ctx: Context) -> None:
    limit = ctx.cfg.heartbeat_timeout_s
    for node in ctx.snap.nodes:
        age = ctx.age_s(node.last_heartbeat)
        if age is not None and age <= limit:
            continue
        ranks = sorted(ctx.ranks_on_node.get(node.name, ()))
        progress = {rk: ctx.last_progress(ctx.ranks[rk]) for rk in ranks}
        stopped = [
            rk
            for rk, ts in progress.items()
            if ts is None or (ctx.now - ts).total_seconds() > limit
        ]
        seen = node.last_heartbeat or ctx.now
        ev = {
            "node": node.name,
            "last_heartbeat": node.last_heartbeat,
            "silent_s": age,
            "heartbeat_timeout_s": limit,
            "ranks": ctx.capped(ranks),
            "stopped_ranks": ctx.capped(stopped),
        }
        if ranks and len(stopped) == len(ranks):
            ctx.put(
                ctx.new(
                    kind="node_down",
                    subject=node_subject(node.name),
                    role=ROOT_CAUSE,
                    severity=CRITICAL,
                    summary=f"{node.name} down: no heartbeat for {age or 0:.0f}s and its "
                    f"{len(ranks)} rank(s) stopped",
                    first_seen=seen,
                    last_seen=ctx.now,
                    evidence=ev,
                )
            )
        else:
            # Ranks still progress (or the node hosts none of this group): the agent, not
            # the node, is the problem — low severity, never a root cause of waits.
            if ranks:
                why = "its ranks still progress"
            elif ctx.placement_unknown_since is not None:
                why = "this generation's ranks have not said where they run yet"
            else:
                why = "no rank of this group runs there"
            ctx.put(
                ctx.new(
                    kind="agent_silent",
                    subject=node_subject(node.name),
                    role=ROOT_CAUSE,
                    severity=MINOR,
                    summary=f"Agent on {node.name} silent for "
                    f"{'ever' if age is None else f'{age:.0f}s'}; {why}",
                    first_seen=seen,
                    last_seen=ctx.now,
                    evidence=ev,
                )
            )
