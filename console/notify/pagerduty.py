"""PagerDuty Events API v2 payloads: trigger, acknowledge and resolve.

Owns the mapping of our incidents onto PagerDuty events: one `dedup_key` per incident
so every event lands on the same PagerDuty alert, and our severities onto the four
PagerDuty accepts. It must not send anything.
"""

from __future__ import annotations

from typing import Any

from agents import vocab

from console.notify.message import Event, Notification

EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"
# Ours (agents.vocab), then the words other tools use for theirs.
_SEVERITY = {
    vocab.SEVERITY_CRITICAL: "critical",
    vocab.SEVERITY_MAJOR: "error",
    vocab.SEVERITY_MINOR: "warning",
    vocab.SEVERITY_INFO: "info",
    "fatal": "critical",
    "page": "critical",
    "error": "error",
    "high": "error",
    "warning": "warning",
    "warn": "warning",
    "medium": "warning",
    "low": "info",
}
_MAX_SUMMARY = 1024  # PagerDuty rejects a longer summary.
_MAX_DEDUP = 255


def severity(value: str) -> str:
    """PagerDuty's severity for ours; an unknown one maps to "error" so it still pages."""
    return _SEVERITY.get(value.strip().lower(), "error")


def build_payload(n: Notification, routing_key: str, source: str = "faultline") -> dict[str, Any]:
    """The Events API v2 body for `n`."""
    if not routing_key:
        raise ValueError("a PagerDuty routing key is required")
    if not n.dedup_key or len(n.dedup_key) > _MAX_DEDUP:
        raise ValueError(f"dedup_key must be 1..{_MAX_DEDUP} characters, got {n.dedup_key!r}")
    body: dict[str, Any] = {
        "routing_key": routing_key,
        "event_action": str(n.event),
        "dedup_key": n.dedup_key,
    }
    if n.event is not Event.TRIGGER:
        # Acknowledge and resolve identify the alert by dedup_key alone.
        return body
    details: dict[str, Any] = {**n.evidence, "incident": n.incident_id, "subject": n.subject}
    if n.role:
        details["role"] = n.role
    body["payload"] = {
        "summary": f"[{n.severity}] {n.title}"[:_MAX_SUMMARY],
        "source": source,
        "severity": severity(n.severity),
        "timestamp": n.occurred_at.isoformat(),
        "component": n.subject,
        "group": n.group,
        "class": n.root_cause,
        "custom_details": details,
    }
    body["client"] = "Faultline"
    if n.url:
        body["client_url"] = n.url
        body["links"] = [{"href": n.url, "text": "Faultline incident"}]
    return body
