"""The node page, the fleet's hardware filters, REST /api/v1/nodes/<name>/ and the card."""

from __future__ import annotations

import pytest
from django.utils import timezone

from console import queries
from console.models import Node
from ingest.store.fleet_card import NODE_CARD, node_card
from tests.server.fleet.test_fleet_health import GPU, NODE, _post, _sample, _xid

pytestmark = pytest.mark.django_db


@pytest.fixture
def faulted(post_batch) -> None:
    _post(post_batch, [_sample(), _xid(48)])
    post = post_batch
    from tests.conftest import make_batch

    assert post(make_batch([{"kind": "device_sample", "gpu": "GPU-ok-0", "index": 0,
                             "temp_c": 50.0}], node="ok-1")).status_code == 202  # fmt: skip


@pytest.fixture
def viewer(client, cast):
    client.force_login(cast["viewer"])
    return client


def test_it_filters_the_fleet_to_nodes_out_of_service_and_repeat_offenders(viewer, faulted):
    page = viewer.get("/?hardware=out_of_service").content.decode()
    assert f'data-node="{NODE}"' in page and 'data-node="ok-1"' not in page
    assert 'data-lifecycle="faulted"' in page and "Xid 48" in page
    page = viewer.get("/?hardware=repeat_offenders").content.decode()
    assert f'data-node="{NODE}"' not in page
    Node.objects.filter(name=NODE).update(replace_flagged=True)
    page = viewer.get("/?hardware=repeat_offenders").content.decode()
    assert f'data-node="{NODE}"' in page and 'data-node="ok-1"' not in page
    assert viewer.get("/?hardware=").content.decode().count('data-node="') >= 2


def test_it_shows_the_node_page_with_gpus_history_and_incidents(viewer, faulted):
    page = viewer.get(f"/nodes/{NODE}/").content.decode()
    assert 'data-field="lifecycle">faulted' in page
    assert f'data-gpu="{GPU}"' in page
    assert page.count('data-kind="fault"') == 2  # the GPU's and the node's
    assert "needs gpu reset" in page
    assert 'id="return-form"' not in page  # a viewer cannot return it
    assert viewer.get("/nodes/nope/").status_code == 404


def test_it_lets_an_approver_return_a_node_from_its_page_and_refuses_a_viewer(
    client, cast, faulted
):
    client.force_login(cast["viewer"])
    client.post(f"/nodes/{NODE}/return/", {"reason": "reseated"})
    assert Node.objects.get(name=NODE).lifecycle == "faulted"
    client.force_login(cast["approver"])
    assert 'id="return-form"' in client.get(f"/nodes/{NODE}/").content.decode()
    client.post(f"/nodes/{NODE}/return/", {"reason": "GPU reseated, dcgmi diag passed"})
    assert Node.objects.get(name=NODE).lifecycle == "healthy"


def test_it_serves_the_node_with_its_history_over_rest(viewer, faulted):
    body = viewer.get(f"/api/v1/nodes/{NODE}/").json()
    assert body["lifecycle"] == "faulted" and body["repair_needed"] == "gpu_reset"
    (gpu,) = [d for d in body["devices"] if d["uuid"] == GPU]
    assert gpu["lifecycle"] == "faulted" and gpu["lifecycle_evidence"]["code"] == 48
    assert [h["kind"] for h in body["history"]] == ["fault", "fault"]
    (incident,) = body["incidents"]
    assert (incident["scope"], incident["kind"], incident["state"]) == ("node", "xid", "open")
    assert viewer.get("/api/v1/nodes/nope/").status_code == 404


def test_it_reads_the_same_node_card_in_ingest_and_in_the_console(faulted):
    from django.db import connection

    node = Node.objects.get(name=NODE)
    with connection.cursor() as cur:
        cur.execute(NODE_CARD.replace("%(node)s", str(node.pk)))
        card = node_card(cur.fetchone())
    (console_card,) = queries.node_payloads(names=[NODE])
    assert card == console_card
    assert card["lifecycle"] == "faulted" and card["devices"][0]["lifecycle"] == "faulted"
    assert card["lifecycle_since"] <= timezone.now().isoformat()


def test_it_acknowledges_assigns_and_shows_a_node_incident_like_a_group_incident(
    client, cast, faulted
):
    from console import actions
    from console.models import Incident

    incident = Incident.objects.get(node__name=NODE, group=None)
    actions.acknowledge_incident(
        incident_id=incident.pk, actor=cast["operator"], now=timezone.now()
    )
    actions.assign_incident(
        incident_id=incident.pk, assignee=cast["approver"].username, actor=cast["operator"],
        now=timezone.now(),
    )  # fmt: skip
    incident.refresh_from_db()
    assert (incident.state, incident.assignee) == ("acknowledged", cast["approver"])
    client.force_login(cast["viewer"])
    page = client.get(f"/incidents/{incident.pk}/")
    assert page.status_code == 200 and "Xid 48" in page.content.decode()
    assert client.get(f"/api/v1/incidents/{incident.pk}/").status_code == 200
    fleet = client.get("/").content.decode()
    assert f'href="/nodes/{NODE}/"' in fleet
