"""The `Finding` the engine emits, its recovery advice, subjects and stable ids.

Owns the findings vocabulary of DESIGN §5 as data: roles, severities, subject
spelling, deterministic ids and fingerprints, and JSON-safe rendering. Must not decide
anything: rules decide, this module only shapes.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Any

from agents import vocab

ROOT_CAUSE = "root_cause"
SYMPTOM = "symptom"
UNDETERMINED = "undetermined"

# Severities and their order are agents.vocab's; the short names are the rules'.
CRITICAL = vocab.SEVERITY_CRITICAL
MAJOR = vocab.SEVERITY_MAJOR
MINOR = vocab.SEVERITY_MINOR
INFO = vocab.SEVERITY_INFO
SEVERITY_RANK = vocab.SEVERITY_RANK

# Recovery objectives (rules/objectives.py): a promise at risk or broken. They are
# risks, not faults: they head their own incident, never need a restart, never block one
# and call for no remediation (console.policy.remediation maps them to nothing).
RPO_EXCEEDED = "rpo_exceeded"  # newest valid checkpoint older than the RPO
RTO_EXCEEDED = "rto_exceeded"  # a recovery running longer than the RTO
RISK_KINDS = frozenset({RPO_EXCEEDED, RTO_EXCEEDED})


def node_subject(name: str) -> str:
    return f"node:{name}"


def gpu_subject(uuid: str) -> str:
    return f"gpu:{uuid}"


def rank_subject(group: str, rank: int) -> str:
    return f"rank:{group}/{rank}"


def group_subject(group: str) -> str:
    return f"group:{group}"


def worker_subject(group: str, worker: str) -> str:
    return f"worker:{group}/{worker}"


def checkpoint_subject(group: str, checkpoint_id: str) -> str:
    return f"checkpoint:{group}/{checkpoint_id}"


def culprit_of(subject: str, evidence: Mapping[str, Any]) -> tuple[str, int | str] | None:
    """("rank", n) or ("worker", name) a finding is about: its subject when it is a rank or
    a worker, else the one rank its evidence names (`rank`, or `ranks` with one entry: an
    Xid names the ranks on its GPU). None: the finding is about no one rank or worker (a
    node, a checkpoint, the group, a GPU shared by several ranks)."""
    kind, _, rest = subject.partition(":")
    _group, _, name = rest.rpartition("/")
    if kind == "rank" and name.isascii() and name.isdigit():
        return ("rank", int(name))
    if kind == "worker" and name:
        return ("worker", name)
    rank = evidence.get("rank")
    ranks = evidence.get("ranks")
    if rank is None and isinstance(ranks, list) and len(ranks) == 1:
        rank = ranks[0]
    if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0:
        return ("rank", rank)
    return None


@lru_cache(maxsize=1 << 17)  # pure; a 16k-rank pass re-derives the same 16k ids each pass
def fingerprint_of(group: str, generation: int, kind: str, subject: str, key: str = "") -> str:
    """Stable across re-diagnosis of the same group and generation (incident dedup)."""
    raw = f"{group}\x1f{generation}\x1f{kind}\x1f{subject}\x1f{key}"
    return hashlib.sha256(raw.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Recovery:
    """Advice attached to a root cause: may automation restart, and at what cost."""

    auto_restart_safe: bool
    reason: str
    checkpoint: str | None = None
    lost_steps: int | None = None
    lost_tokens: int | None = None
    lost_gpu_hours: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "auto_restart_safe": self.auto_restart_safe,
            "reason": self.reason,
            "checkpoint": self.checkpoint,
            "lost_steps": self.lost_steps,
            "lost_tokens": self.lost_tokens,
            "lost_gpu_hours": self.lost_gpu_hours,
        }


@dataclass(frozen=True, slots=True)
class Finding:
    """One diagnosed fact: a root cause, a symptom linked to one, or undetermined."""

    id: str
    kind: str
    subject: str
    role: str
    severity: str
    summary: str
    first_seen: datetime
    last_seen: datetime
    fingerprint: str
    evidence: Mapping[str, Any] = field(default_factory=dict)
    caused_by: tuple[str, ...] = ()
    recovery: Recovery | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: datetimes as ISO 8601, non-finite floats as the contract's strings."""
        return {
            "id": self.id,
            "kind": self.kind,
            "subject": self.subject,
            "role": self.role,
            "caused_by": list(self.caused_by),
            "severity": self.severity,
            "evidence": jsonable(self.evidence),
            "first_seen": self.first_seen.isoformat(),
            "last_seen": self.last_seen.isoformat(),
            "summary": self.summary,
            "fingerprint": self.fingerprint,
            "recovery": None if self.recovery is None else self.recovery.to_dict(),
        }


def make_finding(
    *,
    group: str,
    generation: int,
    kind: str,
    subject: str,
    role: str,
    severity: str,
    summary: str,
    first_seen: datetime,
    last_seen: datetime | None = None,
    evidence: Mapping[str, Any] | None = None,
    caused_by: Sequence[str] = (),
    key: str = "",
) -> Finding:
    """Build a finding whose id and fingerprint derive from (group, gen, kind, subject, key)."""
    fp = fingerprint_of(group, generation, kind, subject, key)
    return Finding(
        id=fp[:16],
        kind=kind,
        subject=subject,
        role=role,
        severity=severity,
        summary=summary,
        first_seen=first_seen,
        last_seen=last_seen or first_seen,
        fingerprint=fp,
        evidence=dict(evidence or {}),
        caused_by=tuple(caused_by),
    )


def jsonable(value: Any) -> Any:
    """Render evidence JSON-safe without losing NaN (DESIGN §3 spells it "NaN")."""
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value) if isinstance(value, (set, frozenset)) else value
        return [jsonable(v) for v in items]
    return value
