"""Forms and API bodies that used to answer 500 (low)."""

from __future__ import annotations

import pytest
from django.utils import timezone

from console.models import ConsistencyGroup, Incident

pytestmark = pytest.mark.django_db


@pytest.fixture
def incident() -> Incident:
    group = ConsistencyGroup.objects.create(name="job")
    return Incident.objects.create(
        group=group, fingerprint="fp", kind="xid", subject="gpu:GPU-1", severity="critical",
        summary="Xid 79", opened_at=timezone.now(),
    )  # fmt: skip


@pytest.mark.parametrize(
    "version", ["\u00b2", "\u0661", "\uff11"]
)  # ², Arabic-Indic 1, fullwidth 1
def test_it_takes_non_ascii_digits_in_the_version_field_without_a_500(
    client, cast, incident, version
):
    client.force_login(cast["operator"])
    response = client.post(f"/incidents/{incident.pk}/acknowledge/", {"version": version})
    assert response.status_code == 302
    assert Incident.objects.get(pk=incident.pk).state == "acknowledged"


@pytest.mark.parametrize("depth", [40, 100_000])
def test_it_answers_400_for_deeply_nested_api_json(client, cast, depth):
    client.force_login(cast["operator"])
    body = '{"kind": "cordon_node", "target": "node:n-1", "reason": "r", "params": %s}' % (
        '{"a":' * depth + "1" + "}" * depth
    )
    response = client.post("/api/v1/actions/", data=body, content_type="application/json")
    assert response.status_code == 400, response.content[:200]
    assert "nested more than 32 levels" in response.content.decode()


def test_it_answers_400_for_a_rank_target_in_non_ascii_digits(client, cast):
    ConsistencyGroup.objects.create(name="g")
    client.force_login(cast["operator"])
    response = client.post(
        "/api/v1/actions/",
        {
            "kind": "isolate_rank",
            "target": "rank:g/\u00b2",
            "reason": "rank 2 is stuck in allreduce",
        },
        content_type="application/json",
    )
    assert response.status_code == 400, response.content[:300]
    assert "rank must be a number" in response.content.decode()
