"""Contract rule family: pass ingest's contract findings through as root causes.

Owns the severity and restart-safety of `stale_generation`, `split_brain`,
`non_monotonic` and `data_cursor_regression`. Must not re-detect them: ingest sees
the records in order and raised them already.
"""

from __future__ import annotations

from console.diagnosis.findings import CRITICAL, MAJOR, ROOT_CAUSE
from console.diagnosis.rules.base import Context

SEVERITY = {"split_brain": CRITICAL, "stale_generation": CRITICAL}
SUMMARY = {
    "split_brain": "Split brain: two generations of {group} are active",
    "stale_generation": "Stale generation wrote to {group}",
    "non_monotonic": "Non-monotonic counter in {group}",
    "data_cursor_regression": "Data cursor went backwards in {group}: samples repeat",
}


def run(ctx: Context) -> None:
    for c in ctx.snap.contract_findings:
        seen = c.ts or ctx.now
        template = SUMMARY.get(c.kind, "Contract violation {kind} in {group}")
        f = ctx.put(
            ctx.new(
                generation=c.generation,  # one incident per violation, across restarts
                kind=c.kind,
                subject=c.subject,
                role=ROOT_CAUSE,
                severity=SEVERITY.get(c.kind, MAJOR),
                summary=template.format(group=ctx.snap.group, kind=c.kind) + f" ({c.subject})",
                first_seen=seen,
                evidence=dict(c.evidence),
            )
        )
        # A broken contract means safe replay cannot be proven: stop, don't fake it.
        ctx.unsafe_reasons[f.id] = f"contract violated ({c.kind}): replay cannot be proven safe"
