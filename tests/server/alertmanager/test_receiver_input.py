"""Whatever Alertmanager (or someone holding its token) sends: 200 or a 400 naming the alert
and field, never a 500, and nothing of a refused delivery stored."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from console.models import AuditLog, ExternalAlert, HealthEvent

from .conftest import GPU, NODE, TOKEN
from .test_receiver import alert, deliver, xid_alert

pytestmark = pytest.mark.django_db


def _post(client: Any, body: bytes | str, **headers: str) -> Any:
    return client.post("/api/v1/alertmanager", data=body, content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {TOKEN}", **headers)  # fmt: skip


# The inventory fixture's node enrolment (its agent token) is audited; a delivery is not.
_ENROLMENT = ("node.registered", "agent_token.issued")


def _nothing_stored() -> bool:
    return (
        not ExternalAlert.objects.exists()
        and not AuditLog.objects.exclude(verb__in=_ENROLMENT).exists()
    )


def test_a_time_without_a_zone_is_utc(client: Any, inventory: Any) -> None:
    naive = alert(instance=f"{NODE}:9100")
    naive["startsAt"] = "2026-12-03T10:00:00"
    naive["endsAt"] = "2026-12-03T10:05:00.123456789"  # Alertmanager sends nanoseconds
    assert deliver(client, naive).status_code == 200
    row = ExternalAlert.objects.get()
    assert row.starts_at == datetime(2026, 12, 3, 10, 0, tzinfo=UTC)
    assert row.ends_at == datetime(2026, 12, 3, 10, 5, 0, 123456, tzinfo=UTC)


@pytest.mark.parametrize("code", ["inf", "-inf", "nan", "1e30", "-1", "79.5", "2147483648"])
def test_an_xid_code_that_is_no_whole_code_is_a_400_naming_it(
    client: Any, inventory: Any, code: str
) -> None:
    response = deliver(client, alert(instance=f"{NODE}:9100"), xid_alert(code=code))  # type: ignore[arg-type]  # a code of the wrong type on purpose
    assert response.status_code == 400, response.content
    assert response.json()["detail"].startswith("alertmanager: alerts[1].labels.err_code must be")
    assert _nothing_stored() and not HealthEvent.objects.filter(kind="fault").exists()


@pytest.mark.parametrize(("code", "latched"), [("79", 79), ("79.0", 79), ("7.9e1", 79),
                                               ("0", None), ("unknown", None)])  # fmt: skip
def test_a_whole_xid_code_in_any_number_form_latches(
    client: Any, inventory: Any, code: str, latched: int | None
) -> None:
    assert deliver(client, xid_alert(code=code)).status_code == 200  # type: ignore[arg-type]  # a code of the wrong type on purpose
    assert ExternalAlert.objects.get().xid == latched
    faults = HealthEvent.objects.filter(kind="fault", gpu=GPU)
    assert [e.evidence["code"] for e in faults] == ([latched] if latched else [])


def _deep(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.parametrize(
    ("body", "names"),
    [
        (json.dumps({"alerts": [{**alert(), "startsAt": "yesterday"}]}), "alerts[0].startsAt"),
        (json.dumps({"alerts": [{**alert(), "startsAt": 1796000000}]}), "alerts[0].startsAt"),
        (json.dumps({"alerts": [{**alert(), "startsAt": "9999-12-31T23:59:59-14:00"}]}),
         "alerts[0].startsAt"),
        (json.dumps({"alerts": [{**alert(), "endsAt": "1999-12-31T23:59:59Z"}]}),
         "alerts[0].endsAt"),
        (json.dumps({"alerts": [{**alert(), "labels": {"instance": {"a": [1]}}}]}),
         "alerts[0].labels.instance must be a string"),
        (json.dumps({"alerts": [{**alert(), "labels": {"instance": "a\u0000b"}}]}),
         "alerts[0].labels.instance: NUL"),
        (json.dumps({"alerts": [{**alert(), "annotations": ["x"]}]}), "alerts[0].annotations"),
        (json.dumps({"alerts": [{**alert(), "fingerprint": 7}]}), "fingerprint"),
        (json.dumps({"alerts": [{**alert(), "status": {"x": 1}}]}), "alerts[0].status"),
        (json.dumps({"alerts": [alert(), 5]}), "alerts[1] is not an object"),
        ('{"alerts": ' + _deep(100_000) + "}", "nested too deep"),
        ('{"alerts": [' + _deep(5_000) + "]}", "nested too deep"),
        (b"\xff\xfe not utf-8", "alertmanager: "),
        ("[]", "'alerts' list"),
    ],
    # The bodies carry now(): ids from them would differ between xdist workers.
    ids=lambda value: "body" if isinstance(value, bytes) or str(value)[:1] in "{[" else None,
)  # fmt: skip
def test_a_malformed_delivery_is_a_400_naming_what_and_stores_nothing(
    client: Any, inventory: Any, body: Any, names: str
) -> None:
    response = _post(client, body)
    assert response.status_code == 400, response.content[:300]
    assert names in response.json()["detail"]
    assert _nothing_stored()


def test_a_body_over_the_limit_is_refused_before_it_is_read(client: Any) -> None:
    response = _post(client, b"{}", CONTENT_LENGTH=str(5 * 1024 * 1024))
    assert response.status_code == 413 and "max_alerts" in response.json()["detail"]


# Any JSON value where an alert's fields go.
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner,
                                                               max_size=3),
    max_leaves=8,
)  # fmt: skip
FIELDS = ["status", "labels", "annotations", "startsAt", "endsAt", "fingerprint"]


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(field=st.sampled_from(FIELDS), value=JSON, label=st.text(max_size=20))
def test_any_value_in_any_field_is_stored_or_refused_never_a_500(
    client: Any, inventory: Any, field: str, value: Any, label: str
) -> None:
    base = xid_alert() if label.startswith("x") else alert(instance=f"{NODE}:9100")
    base["labels"]["extra"] = label
    before = ExternalAlert.objects.count(), AuditLog.objects.count()
    response = deliver(client, {**base, field: value})
    assert response.status_code in (200, 400), (field, value, response.content[:300])
    if response.status_code == 400:
        assert (ExternalAlert.objects.count(), AuditLog.objects.count()) == before
        assert response.json()["detail"].startswith("alertmanager: ")


def test_a_delivery_with_one_bad_alert_stores_none_of_its_good_ones(
    client: Any, inventory: Any
) -> None:
    start = datetime.now(UTC) - timedelta(minutes=1)
    good = [alert(instance=f"{NODE}:9100", fp=f"fp{i}", start=start) for i in range(5)]
    response = deliver(client, *good, xid_alert(code="inf"))  # type: ignore[arg-type]  # a code of the wrong type on purpose
    assert response.status_code == 400
    assert _nothing_stored()
