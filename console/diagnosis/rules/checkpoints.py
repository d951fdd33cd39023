"""Checkpoint rule family: partial, corrupt, missing-shard and modified checkpoints,
and the newest VALID checkpoint recovery may use.

Owns `checkpoint_partial`, `checkpoint_corrupt`, `checkpoint_missing_shard`,
`checkpoint_modified` and `ctx.valid_checkpoint`: the newest checkpoint that was
committed (or verified), has a complete checksummed manifest and never went corrupt.
Must never pick "the newest directory": staging and written checkpoints do not count.
"""

from __future__ import annotations

from console.diagnosis.findings import CRITICAL, MAJOR, MINOR, ROOT_CAUSE, checkpoint_subject
from console.diagnosis.rules.base import Context
from console.diagnosis.snapshot import CheckpointState, Manifest

COMMITTED = frozenset({"committed", "verified"})


def _shards(m: Manifest | None) -> dict[str, tuple[int | None, str | None]]:
    return {} if m is None else {s.path: (s.bytes, s.sha256) for s in m.shards}


def _incomplete(m: Manifest | None) -> str | None:
    """Why a committed manifest cannot be trusted, or None."""
    if m is None or not m.shards:
        return "committed without a manifest of shards"
    # Sizes are known at commit; checksums may follow with `verified` (the agent hashes
    # shards in the background), so a missing sha256 is "not yet verified", not partial.
    unsized = [s.path for s in m.shards if s.bytes is None]
    if unsized:
        return f"{len(unsized)} shard(s) without a size: {unsized[:3]}"
    total = sum(s.bytes or 0 for s in m.shards)
    if m.total_bytes is not None and total != m.total_bytes:
        return f"shards sum to {total} bytes, manifest says {m.total_bytes}"
    return None


def _checksummed(c: CheckpointState) -> bool:
    """Some committed/verified manifest carries a sha256 for every shard."""
    return any(
        e.phase in COMMITTED
        and e.manifest is not None
        and e.manifest.shards
        and all(s.sha256 for s in e.manifest.shards)
        for e in c.events
    )


def _differs(
    a: tuple[int | None, str | None] | None, b: tuple[int | None, str | None] | None
) -> bool:
    """A shard changed: it appeared/vanished, its size changed, or both hashes exist and differ."""
    if a is None or b is None:
        return a is not b
    (size_a, sha_a), (size_b, sha_b) = a, b
    return size_a != size_b or bool(sha_a and sha_b and sha_a != sha_b)


def _problems(c: CheckpointState) -> list[tuple[str, str, str, dict[str, object]]]:
    """(kind, severity, summary, evidence) for each thing wrong with checkpoint `c`."""
    out: list[tuple[str, str, str, dict[str, object]]] = []
    phases = [e.phase for e in c.events]
    if "corrupt" in phases:
        e = c.events[phases.index("corrupt")]
        out.append(
            (
                "checkpoint_corrupt",
                MAJOR,
                f"Checkpoint {c.checkpoint_id} is corrupt",
                {"corrupt_at": e.ts},
            )
        )
    commit_at = next((i for i, p in enumerate(phases) if p in COMMITTED), None)
    if commit_at is None:
        return out
    commit = c.events[commit_at]
    committed_manifest = commit.manifest or next(
        (e.manifest for e in reversed(c.events[:commit_at]) if e.manifest is not None), None
    )
    why = _incomplete(committed_manifest)
    if why:
        out.append(
            (
                "checkpoint_partial",
                MAJOR,
                f"Checkpoint {c.checkpoint_id} committed incomplete: {why}",
                {"why": why, "committed_at": commit.ts},
            )
        )
    shards = _shards(committed_manifest)
    earlier = set()
    for e in c.events[:commit_at]:
        earlier |= set(_shards(e.manifest))
    missing = sorted(earlier - set(shards))
    if missing:
        out.append(
            (
                "checkpoint_missing_shard",
                MAJOR,
                f"Checkpoint {c.checkpoint_id} committed without {len(missing)} shard(s) "
                f"it had written",
                {"missing": missing[:16], "committed_at": commit.ts},
            )
        )
    # Contract 3: a committed checkpoint is never modified afterwards.
    for e in c.events[commit_at + 1 :]:
        if e.phase == "modified":  # the agent saw the committed files change on disk
            out.append(
                (
                    "checkpoint_modified",
                    CRITICAL,
                    f"Checkpoint {c.checkpoint_id} changed on disk after commit",
                    {"detail": e.detail, "committed_at": commit.ts, "modified_at": e.ts},
                )
            )
            break
        later = _shards(e.manifest)
        if e.manifest is None or not later:
            continue
        changed = sorted(
            p for p in set(shards) | set(later) if _differs(shards.get(p), later.get(p))
        )
        if changed:
            out.append(
                (
                    "checkpoint_modified",
                    CRITICAL,
                    f"Checkpoint {c.checkpoint_id} changed after commit: "
                    f"{len(changed)} shard(s) differ",
                    {
                        "changed": changed[:16],
                        "committed_at": commit.ts,
                        "modified_at": e.ts,
                        "phase": e.phase,
                    },
                )
            )
            break
    return out


def run(ctx: Context) -> None:
    found = {c.checkpoint_id: _problems(c) for c in ctx.snap.checkpoints}
    valid = [
        c
        for c in ctx.snap.checkpoints
        if c.phase in COMMITTED or (any(e.phase in COMMITTED for e in c.events))
    ]
    # Valid for restore: committed, nothing wrong, and checksummed (seed: "atomically
    # committed, checksummed and checked" — never merely the newest directory).
    valid = [c for c in valid if not found[c.checkpoint_id] and _checksummed(c)]
    best = max(
        valid, key=lambda c: (c.step if c.step is not None else -1, c.events[-1].ts), default=None
    )
    ctx.valid_checkpoint = best
    best_step = -1 if best is None or best.step is None else best.step
    for c in ctx.snap.checkpoints:
        # Only a bad checkpoint newer than the valid one could mislead a restart.
        newer = (c.step if c.step is not None else best_step + 1) > best_step
        for kind, sev, summary, ev in found[c.checkpoint_id]:
            f = ctx.put(
                ctx.new(
                    generation=c.events[0].generation,  # the one that wrote it
                    kind=kind,
                    subject=checkpoint_subject(ctx.snap.group, c.checkpoint_id),
                    role=ROOT_CAUSE,
                    severity=sev if newer else MINOR,
                    summary=summary,
                    first_seen=c.events[0].ts,
                    last_seen=c.events[-1].ts,
                    evidence={
                        "checkpoint_id": c.checkpoint_id,
                        "step": c.step,
                        "phases": [e.phase for e in c.events],
                        "newest_valid": None if best is None else best.checkpoint_id,
                        **ev,
                    },
                )
            )
            if newer:
                ctx.unsafe_reasons[f.id] = (
                    f"checkpoint {c.checkpoint_id} is not restorable ({kind}); a human must "
                    "confirm the restore point"
                )
