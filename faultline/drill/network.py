"""The network rows' own verdict: the right node named, the healthy ones not, the sides.

Owns what "the error was located" means for `slow_link`, `lossy_link` and `partition`:
the root cause sits on the faulty namespace node (`drill-net-<i>`) with the agent's
counters as evidence, no healthy node of the drill carries a network finding, a
partition names the ranks on each side and lets only the majority side write, and
nothing restarted the group behind the partition's back (no split-brain restart: the
console's generation and restart count unchanged, its advice not an automatic restart,
no `split_brain` finding). Must not judge the fault itself: it reads the console's
alerts (active or not: a finding may come and go while its incident stays open) and group
through the REST API.
"""

from __future__ import annotations

import time
from typing import Any

Drill = Any  # faultline.drill.runner.Drill (runner imports this module: no cycle)

NETWORK_KINDS = frozenset({"network_slow", "network_partition"})
EVIDENCE_KEYS = ("port", "counter", "counters", "tcp", "peers", "stuck_links", "sides", "may_write")


def node_name(i: int) -> str:
    return f"drill-net-{i}"


# A read that fails (a busy web process) is tried again for this long.
ALERT_READ_S = 5.0


def _alerts(drill: Drill, errors: list[str]) -> list[dict[str, Any]] | None:
    try:
        data = drill.service.api(f"/api/v1/alerts/?group={drill.group}")
    except Exception as exc:  # noqa: BLE001 - tried again, then judged as nothing named
        errors.append(f"{type(exc).__name__}: {exc}"[:200])
        return None
    return list(data["results"])


def _read_alerts(drill: Drill) -> tuple[list[dict[str, Any]], int, list[str]]:
    """Every alert of the group so far, active or not: a socket-led finding under packet
    loss comes and goes pass by pass (its incident stays open), and a healthy node named
    for one pass was still named. Read until one read succeeds or ALERT_READ_S passed."""
    errors: list[str] = []
    deadline = time.monotonic() + ALERT_READ_S
    reads = 0
    while True:
        alerts = _alerts(drill, errors)
        reads += 1
        if alerts is not None:
            return alerts, reads, errors
        if time.monotonic() >= deadline:
            return [], reads, errors
        time.sleep(0.5)


def judge(drill: Drill, faulty: int, head: dict[str, Any]) -> dict[str, bool]:
    """The network invariants, from the console's alerts at detection time."""
    r = drill.result
    world = drill.spec.world
    expected = f"node:{node_name(faulty)}"
    alerts, reads, errors = _read_alerts(drill)
    mine = [a for a in alerts if a["kind"] == head["kind"] and a["subject"] == expected]
    named = sorted({a["subject"] for a in alerts if a["kind"] in NETWORK_KINDS})
    evidence = mine[0]["evidence"] if mine else {}
    r.measured.update(
        named_subject=head.get("subject"),
        expected_subject=expected,
        network_findings_on=named,
        evidence={k: evidence[k] for k in EVIDENCE_KEYS if k in evidence},
        alert_reads=reads,
        **({"alert_read_errors": errors} if errors else {}),
    )
    out = {
        "located_on_the_faulty_node": head.get("subject") == expected and bool(mine),
        "healthy_nodes_not_named": named == [expected],
        "counters_as_evidence": bool(evidence.get("counters") or evidence.get("port")),
    }
    if head["kind"] == "network_partition":
        sides = evidence.get("sides") or {}
        kept = sorted(set(range(world)) - {faulty})
        out["sides_named"] = (sides.get("cut_off") or {}).get("ranks") == [faulty] and (
            sides.get("connected") or {}
        ).get("ranks") == kept
        out["majority_side_writes"] = evidence.get("may_write") == "connected" and (
            2 * len(kept) > world
        )
        info = drill.group_info() or {}
        out["no_split_brain_restart"] = (
            info.get("generation") == 1
            and info.get("restart_count", 0) == 0
            and (head.get("recovery") or {}).get("auto_restart_safe") is False
            and not any(a["kind"] == "split_brain" for a in alerts)
        )
    return out
