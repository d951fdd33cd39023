from __future__ import annotations

import json

from console.notify.message import Event
from console.notify.slack import build_payload
from tests.notify.cast import notification


def test_it_puts_severity_title_and_state_in_the_fallback_text() -> None:
    payload = build_payload(notification())
    assert payload["text"] == (
        ":rotating_light: [CRITICAL] Xid 79 on node-017 stalled group llama (open)"
    )


def test_it_escapes_mentions_hidden_in_names() -> None:
    payload = build_payload(notification(group="<!channel> llama"))
    text = json.dumps(payload)
    assert "<!channel>" not in text
    assert "&lt;!channel&gt; llama" in text


def test_it_links_the_incident_with_a_button() -> None:
    blocks = build_payload(notification())["blocks"]
    actions = [b for b in blocks if b["type"] == "actions"]
    assert actions[0]["elements"][0]["url"] == "https://faultline.example/incidents/inc-42"


def test_it_leaves_out_the_button_without_a_url() -> None:
    blocks = build_payload(notification(url=None))["blocks"]
    assert all(b["type"] != "actions" for b in blocks)


def test_it_marks_a_resolve() -> None:
    payload = build_payload(notification(event=Event.RESOLVE))
    assert payload["text"].startswith(":white_check_mark:")
    assert payload["text"].endswith("(resolved)")
