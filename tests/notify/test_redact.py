"""Redaction of channel secrets for the audit log."""

from __future__ import annotations

from console.notify.redact import REDACTED, channel_audit_data, redact, redact_url

SLACK = "https://hooks.slack.com/services/T000/B000/XXXXsecretXXXX"


def test_it_keeps_only_the_origin_of_a_slack_webhook_url() -> None:
    assert redact_url(SLACK) == f"https://hooks.slack.com/{REDACTED}"
    assert "XXXXsecretXXXX" not in redact_url(SLACK)


def test_it_drops_user_info_query_and_fragment() -> None:
    shown = redact_url("https://user:pw@example.com:8443/hook?token=abc#frag")
    assert shown == f"https://example.com:8443/{REDACTED}"
    assert "pw" not in shown and "abc" not in shown


def test_it_leaves_a_bare_origin_readable() -> None:
    assert redact_url("https://events.pagerduty.com") == "https://events.pagerduty.com/"


def test_it_redacts_secret_keys_and_urls_inside_nested_payloads() -> None:
    data = {
        "name": "ops",
        "url": SLACK,
        "routing_key": "R0UT1NG",
        "nested": [{"hmac_secret": "k", "link": "http://10.0.0.1/admin?x=1"}],
        "count": 3,
    }
    out = redact(data)
    assert out["name"] == "ops" and out["count"] == 3
    assert out["routing_key"] == REDACTED
    assert out["nested"][0] == {"hmac_secret": REDACTED, "link": f"http://10.0.0.1/{REDACTED}"}
    assert "XXXXsecretXXXX" not in repr(out) and "R0UT1NG" not in repr(out)


def test_it_records_whether_a_channel_has_a_secret_but_not_the_secret() -> None:
    data = channel_audit_data(name="ops", kind="slack", url=SLACK, secret_set=True)
    assert data == {
        "name": "ops",
        "kind": "slack",
        "url": f"https://hooks.slack.com/{REDACTED}",
        "secret_set": True,
    }


def test_it_hides_a_url_quoted_inside_a_sentence_and_in_a_channel_verbs_extras() -> None:
    assert redact({"reason": f"rotating: {SLACK} leaked"}) == {
        "reason": f"rotating: https://hooks.slack.com/{REDACTED} leaked"
    }
    data = channel_audit_data(
        name="ops", kind="slack", url=SLACK, secret_set=True, reason=f"see {SLACK}",
        changed=["url"], secret="k",
    )  # fmt: skip
    assert data["reason"] == f"see https://hooks.slack.com/{REDACTED}"
    assert data["secret"] == REDACTED and data["changed"] == ["url"]
    assert "XXXXsecretXXXX" not in repr(data)
