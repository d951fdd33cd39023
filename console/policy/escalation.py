"""Escalation policies, their snapshots, which notifications are due, and silences.

Owns the timing rules: an incident freezes a snapshot of its escalation policy when it
opens, and `due_steps` reads only that snapshot, so editing a policy never changes an
open incident. Pages stop at acknowledge; a resolve is always delivered to every
channel that was paged, silenced or not. It must not send anything (see console.notify).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from fnmatch import fnmatchcase
from typing import Any

SNAPSHOT_VERSION = 1
MAX_SILENCE_S = 72 * 3600


class EscalationError(ValueError):
    """An escalation policy or snapshot the timing rules cannot use."""


class SilenceError(ValueError):
    """A silence or maintenance window that is refused; the message says why."""


@dataclass(frozen=True)
class EscalationStep:
    """Notify `channels` `delay_s` after the previous step (or the opening), then
    `repeat` more times every `repeat_interval_s` while nobody acknowledges."""

    delay_s: int
    channels: tuple[str, ...]
    repeat: int = 0
    repeat_interval_s: int = 0


@dataclass(frozen=True)
class EscalationPolicy:
    """Steps for incidents whose severity is in `severities` (empty: any) and whose
    labels match every glob in `labels` (for example {"group": "llama-*"})."""

    name: str
    steps: tuple[EscalationStep, ...]
    severities: frozenset[str] = frozenset()
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class DueNotification:
    """One notification to send now. `covers` are the keys to record as sent."""

    key: str
    kind: str  # "trigger", "acknowledge" or "resolve"
    channels: tuple[str, ...]
    due_at: datetime
    step: int | None = None
    covers: tuple[str, ...] = ()


def matches(policy: EscalationPolicy, severity: str, labels: Mapping[str, str]) -> bool:
    """Whether `policy` applies to an incident with this severity and labels."""
    if policy.severities and severity not in policy.severities:
        return False
    return all(
        key in labels and fnmatchcase(str(labels[key]), pattern)
        for key, pattern in policy.labels.items()
    )


def select_policy(
    policies: Iterable[EscalationPolicy], severity: str, labels: Mapping[str, str]
) -> EscalationPolicy | None:
    """The first policy, in the given order, that applies; None if none does."""
    return next((p for p in policies if matches(p, severity, labels)), None)


def _check_step(step: EscalationStep, index: int) -> None:
    if step.delay_s < 0:
        raise EscalationError(f"step {index}: delay_s must not be negative, got {step.delay_s}")
    if not step.channels:
        raise EscalationError(f"step {index}: name at least one channel")
    if step.repeat < 0:
        raise EscalationError(f"step {index}: repeat must not be negative, got {step.repeat}")
    if step.repeat and step.repeat_interval_s < 60:
        # A faster re-page is a notification storm, not an escalation.
        raise EscalationError(
            f"step {index}: repeat_interval_s must be at least 60 when repeating, "
            f"got {step.repeat_interval_s}"
        )


def snapshot_policy(policy: EscalationPolicy) -> dict[str, Any]:
    """The policy as plain JSON data, frozen onto an incident when it opens."""
    if not policy.steps:
        raise EscalationError(f'escalation policy "{policy.name}" has no steps')
    for index, step in enumerate(policy.steps):
        _check_step(step, index)
    return {
        "version": SNAPSHOT_VERSION,
        "name": policy.name,
        "severities": sorted(policy.severities),
        "labels": dict(sorted(policy.labels.items())),
        "steps": [
            {
                "delay_s": s.delay_s,
                "channels": list(s.channels),
                "repeat": s.repeat,
                "repeat_interval_s": s.repeat_interval_s,
            }
            for s in policy.steps
        ],
    }


def _steps(snapshot: Mapping[str, Any]) -> list[EscalationStep]:
    if snapshot.get("version") != SNAPSHOT_VERSION:
        raise EscalationError(
            f"escalation snapshot version {snapshot.get('version')!r} is not supported "
            f"(expected {SNAPSHOT_VERSION})"
        )
    try:
        return [
            EscalationStep(
                delay_s=int(s["delay_s"]),
                channels=tuple(s["channels"]),
                repeat=int(s.get("repeat", 0)),
                repeat_interval_s=int(s.get("repeat_interval_s", 0)),
            )
            for s in snapshot["steps"]
        ]
    except (KeyError, TypeError, ValueError) as exc:
        raise EscalationError(f"escalation snapshot is malformed: {exc}") from None


def _schedule(opened_at: datetime, steps: list[EscalationStep]) -> list[tuple[str, int, datetime]]:
    """(key, step index, due time) of every trigger page, in step order."""
    out = []
    at = opened_at
    for index, step in enumerate(steps):
        at = at + timedelta(seconds=step.delay_s)
        for n in range(step.repeat + 1):
            due = at + timedelta(seconds=n * step.repeat_interval_s)
            out.append((f"step:{index}:{n}", index, due))
    return out


def due_steps(
    snapshot: Mapping[str, Any],
    opened_at: datetime,
    acknowledged_at: datetime | None,
    now: datetime,
    already_sent: Iterable[str],
    resolved_at: datetime | None = None,
) -> list[DueNotification]:
    """The notifications due now for one incident, given the keys already sent.

    Pages escalate and repeat until the incident is acknowledged or resolved. After a
    late worker run only the newest due repeat of each step is returned; its `covers`
    lists the older keys to record so they are never sent late.
    """
    steps = _steps(snapshot)
    sent = set(already_sent)
    schedule = _schedule(opened_at, steps)
    paged = sorted({index for key, index, _ in schedule if key in sent})
    paged_channels = tuple(dict.fromkeys(c for i in paged for c in steps[i].channels))
    due: list[DueNotification] = []
    if resolved_at is not None and resolved_at <= now:
        if paged and "resolve" not in sent:
            due.append(DueNotification("resolve", "resolve", paged_channels, resolved_at))
        return due
    if acknowledged_at is not None and acknowledged_at <= now:
        if paged and "acknowledge" not in sent:
            due.append(
                DueNotification("acknowledge", "acknowledge", paged_channels, acknowledged_at)
            )
        return due
    pending: dict[int, list[tuple[str, datetime]]] = {}
    for key, index, at in schedule:
        if at <= now and key not in sent:
            pending.setdefault(index, []).append((key, at))
    for index, items in sorted(pending.items()):
        key, at = items[-1]
        due.append(
            DueNotification(
                key,
                "trigger",
                steps[index].channels,
                at,
                step=index,
                covers=tuple(k for k, _ in items),
            )
        )
    return due


@dataclass(frozen=True)
class Silence:
    """Suppress pages for subjects/labels matching every glob in `matchers` between
    `starts_at` and `ends_at`. The key "subject" matches the finding subject."""

    id: str
    matchers: Mapping[str, str]
    starts_at: datetime
    ends_at: datetime
    reason: str
    created_by: str


def validate_silence(
    silence: Silence, *, now: datetime, max_duration_s: int = MAX_SILENCE_S
) -> None:
    """Raise `SilenceError` unless `silence` is bounded, explained and specific."""
    if silence.starts_at.tzinfo is None or silence.ends_at.tzinfo is None:
        raise SilenceError("silence times must carry a timezone (UTC)")
    if len(silence.reason.strip()) < 3:
        raise SilenceError("a silence needs a reason: say what maintenance or fault it covers")
    if not silence.matchers:
        raise SilenceError("a silence needs at least one matcher; silencing everything is refused")
    if all(pattern.strip("*") == "" for pattern in silence.matchers.values()):
        raise SilenceError('a silence whose matchers are all "*" silences everything; refused')
    if silence.ends_at <= silence.starts_at:
        raise SilenceError("a silence must end after it starts")
    if silence.ends_at <= now:
        raise SilenceError("a silence must end in the future")
    length = (silence.ends_at - silence.starts_at).total_seconds()
    if length > max_duration_s:
        raise SilenceError(
            f"a silence may last at most {max_duration_s // 3600} h, this one lasts "
            f"{length / 3600:.1f} h; split it or shorten it"
        )


def is_silenced(
    subject: str, labels: Mapping[str, str], silences: Iterable[Silence], now: datetime
) -> Silence | None:
    """The active silence that covers this subject and labels, or None.

    Returns the silence itself so the console can show why a page was held back.
    """
    values = {**labels, "subject": subject}
    for silence in silences:
        if not (silence.starts_at <= now < silence.ends_at) or not silence.matchers:
            continue
        if all(
            key in values and fnmatchcase(str(values[key]), pattern)
            for key, pattern in silence.matchers.items()
        ):
            return silence
    return None
