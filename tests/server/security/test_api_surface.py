"""The API's own surface: schema and docs behind login, bounded pages (low)."""

from __future__ import annotations

import pytest

from console.models import Node

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("url", ["/api/schema/", "/api/docs/"])
def test_it_refuses_the_schema_and_docs_to_anonymous_callers(client, url):
    assert client.get(url).status_code in (401, 403)


@pytest.mark.parametrize("url", ["/api/schema/", "/api/docs/"])
def test_it_serves_the_schema_and_docs_to_a_viewer(client, cast, url):
    client.force_login(cast["viewer"])
    assert client.get(url).status_code == 200


def test_it_caps_the_page_size_whatever_limit_is_asked(client, cast):
    Node.objects.bulk_create(Node(name=f"n-{i:04d}") for i in range(1005))
    client.force_login(cast["viewer"])
    page = client.get("/api/v1/nodes/?limit=1000000").json()
    assert page["count"] == 1005
    assert len(page["results"]) == 1000 and page["next"]
