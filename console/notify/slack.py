"""Slack-compatible incoming-webhook payload (also accepted by Mattermost).

Owns the message layout: a plain-text fallback plus Block Kit blocks. User-controlled
text is escaped so a group or subject name cannot inject mentions or links. It must
not send anything.
"""

from __future__ import annotations

from typing import Any

from console.notify.message import Event, Notification

_EMOJI = {
    Event.TRIGGER: ":rotating_light:",
    Event.ACKNOWLEDGE: ":eyes:",
    Event.RESOLVE: ":white_check_mark:",
}
_MAX_TEXT = 3000  # Slack rejects section text longer than this.


def escape(text: str) -> str:
    """Escape Slack's control characters so `<!channel>` and links stay plain text."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def build_payload(n: Notification) -> dict[str, Any]:
    """The JSON body for a Slack incoming webhook."""
    state = {Event.TRIGGER: "open", Event.ACKNOWLEDGE: "acknowledged", Event.RESOLVE: "resolved"}
    headline = f"{_EMOJI[n.event]} [{n.severity.upper()}] {n.title} ({state[n.event]})"
    fields = [f"*Subject*\n{escape(n.subject)}"]
    if n.group:
        fields.append(f"*Group*\n{escape(n.group)}")
    if n.root_cause:
        fields.append(f"*Root cause*\n{escape(n.root_cause)}")
    evidence = "\n".join(f"• {escape(k)}: {escape(str(v))}" for k, v in n.evidence.items())
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": headline[:150]}},
        {"type": "section", "fields": [{"type": "mrkdwn", "text": f} for f in fields]},
    ]
    if evidence:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": evidence[:_MAX_TEXT]}})
    if n.url:
        blocks.append(
            {
                "type": "actions",
                "elements": [
                    {
                        "type": "button",
                        "text": {"type": "plain_text", "text": "Open incident"},
                        "url": n.url,
                    }
                ],
            }
        )
    blocks.append(
        {
            "type": "context",
            "elements": [
                {
                    "type": "mrkdwn",
                    "text": f"incident {escape(n.incident_id)} · {n.occurred_at.isoformat()}",
                }
            ],
        }
    )
    return {"text": escape(headline), "blocks": blocks}
