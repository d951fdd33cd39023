"""Judge a real job's records with the diagnosis engine, as of any moment (no service).

The records are what a real listener caught from the job (the node agent's view); the
engine sees those stamped up to `now`, and the group's state as its transitions left it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from console.diagnosis import build_snapshot, diagnose
from console.diagnosis.findings import Finding


def ts(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def parsed(got: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in got:
        rec = dict(r, ts=ts(r["ts"]))
        if rec["kind"] == "collective":
            rec["entries"] = [
                {**e, "started_ts": ts(e["started_ts"])} if e.get("started_ts") else e
                for e in rec["entries"]
            ]
        out.append(rec)
    return sorted(out, key=lambda r: r["ts"])


def judge(records: list[dict[str, Any]], group: str, now: datetime) -> list[Finding]:
    """The engine's findings for `group` as of `now` (records stamped after it unseen)."""
    seen = [r for r in records if r.get("group") == group and r["ts"] <= now]
    moves = [r for r in seen if r["kind"] == "transition"]
    generation = max((r["generation"] for r in moves), default=0)
    state = moves[-1]["to_state"] if moves else "running"
    snap = build_snapshot(group=group, generation=generation, state=state, records=seen,
                          nodes={}, contract_findings=[], now=now)  # fmt: skip
    return list(diagnose(snap, now).findings)


def blamed(findings: list[Finding]) -> set[tuple[str, str]]:
    """(kind, subject) of every root cause and undetermined cluster: what opens incidents."""
    return {(f.kind, f.subject) for f in findings if f.role in ("root_cause", "undetermined")}


def sweep(
    records: list[dict[str, Any]], group: str, *, every_s: float = 0.5, tail_s: float = 6.0
) -> dict[datetime, set[tuple[str, str]]]:
    """`blamed` at every `every_s` from the group's first record to `tail_s` past its last."""
    mine = [r["ts"] for r in records if r.get("group") == group]
    out = {}
    now = mine[0]
    while now <= mine[-1] + timedelta(seconds=tail_s):
        out[now] = blamed(judge(records, group, now))
        now += timedelta(seconds=every_s)
    return out


def utc_now() -> datetime:
    return datetime.now(UTC)


def timeline(
    records: list[dict[str, Any]], group: str, moments: list[datetime], *, span_s: float = 8.0
) -> list[str]:
    """The group's records from `span_s` before the first of `moments` to its last, one
    line each: what a failing sweep needs to say why it blamed something."""
    if not moments:
        return []
    lo, hi = min(moments) - timedelta(seconds=span_s), max(moments)
    out = []
    for r in records:
        if r.get("group") != group or not lo <= r["ts"] <= hi:
            continue
        what = {k: r[k] for k in ("rank", "step", "from_state", "to_state", "reason", "event",
                                  "generation") if r.get(k) is not None}  # fmt: skip
        out.append(f"{r['ts'].strftime('%H:%M:%S.%f')[:-3]} {r['kind']} {what}")
    return out
