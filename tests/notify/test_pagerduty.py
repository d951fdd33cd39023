from __future__ import annotations

import pytest

from console.notify.message import Event
from console.notify.pagerduty import build_payload, severity
from tests.notify.cast import notification


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        ("critical", "critical"),
        ("error", "error"),
        ("High", "error"),
        ("warning", "warning"),
        ("info", "info"),
        ("something-new", "error"),
    ],
)
def test_it_maps_severity(ours: str, theirs: str) -> None:
    assert severity(ours) == theirs


def test_it_builds_a_trigger_with_payload_and_dedup_key() -> None:
    body = build_payload(notification(), "R0UTING")
    assert body["routing_key"] == "R0UTING"
    assert body["event_action"] == "trigger"
    assert body["dedup_key"] == "faultline:inc-42"
    assert body["payload"]["severity"] == "critical"
    assert body["payload"]["custom_details"]["xid"] == 79
    assert body["links"][0]["href"].endswith("/inc-42")


@pytest.mark.parametrize("event", [Event.ACKNOWLEDGE, Event.RESOLVE])
def test_it_sends_acknowledge_and_resolve_by_dedup_key_alone(event: Event) -> None:
    body = build_payload(notification(event=event), "R0UTING")
    assert body == {
        "routing_key": "R0UTING",
        "event_action": str(event),
        "dedup_key": "faultline:inc-42",
    }


def test_it_truncates_the_summary_to_what_pagerduty_accepts() -> None:
    body = build_payload(notification(title="x" * 5000), "R0UTING")
    assert len(body["payload"]["summary"]) == 1024


def test_it_does_not_let_evidence_overwrite_the_incident_id() -> None:
    body = build_payload(notification(evidence={"incident": "forged"}), "R0UTING")
    assert body["payload"]["custom_details"]["incident"] == "inc-42"


def test_it_refuses_a_missing_routing_key() -> None:
    with pytest.raises(ValueError, match="routing key"):
        build_payload(notification(), "")


def test_it_refuses_an_empty_dedup_key() -> None:
    with pytest.raises(ValueError, match="dedup_key"):
        build_payload(notification(dedup_key=""), "R0UTING")
