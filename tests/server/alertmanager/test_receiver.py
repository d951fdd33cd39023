"""POST /api/v1/alertmanager through the test client: auth, evidence, node incidents,
resolves, and a DCGM Xid alert folding with the agent's own Xid."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from console.models import AuditLog, ExternalAlert, HealthEvent, Incident
from tests.conftest import iso, make_batch

from .conftest import GPU, NODE, TOKEN

pytestmark = pytest.mark.django_db


def alert(status: str = "firing", *, fp: str = "a1b2c3", start: datetime | None = None,
          end: datetime | None = None, **labels: str) -> dict[str, Any]:  # fmt: skip
    start = start or datetime.now(UTC) - timedelta(minutes=1)
    return {"status": status, "labels": {"alertname": "NodeFilesystemFull", "severity": "warning",
                                         **labels},
            "annotations": {"summary": "/ is 97% full"}, "startsAt": iso(start),
            "endsAt": iso(end) if end else "0001-01-01T00:00:00Z", "fingerprint": fp,
            "generatorURL": "http://prometheus/graph"}  # fmt: skip


def deliver(client, *alerts: dict[str, Any], token: str | None = TOKEN) -> Any:
    body = {"version": "4", "groupKey": "{}:{}", "status": alerts[0]["status"],
            "receiver": "faultline", "groupLabels": {}, "commonLabels": {},
            "commonAnnotations": {}, "externalURL": "http://am",
            "alerts": list(alerts)}  # fmt: skip
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token is not None else {}
    return client.post("/api/v1/alertmanager", data=json.dumps(body),
                       content_type="application/json", **headers)  # fmt: skip


@pytest.mark.parametrize("sent", [None, "wrong-token", ""])
def test_it_refuses_a_delivery_without_the_right_token(client, inventory, sent):
    response = deliver(client, alert(instance=f"{NODE}:9100"), token=sent)
    assert response.status_code == 401
    assert not ExternalAlert.objects.exists()


def test_it_refuses_everything_when_no_token_is_set(client, inventory, settings):
    settings.ALERTMANAGER_TOKEN = ""
    response = deliver(client, alert(instance=f"{NODE}:9100"))
    assert response.status_code == 403
    assert "FAULTLINE_ALERTMANAGER_TOKEN" in response.json()["detail"]


def test_it_refuses_what_is_not_a_webhook_payload(client):
    response = client.post("/api/v1/alertmanager", data=json.dumps({"alerts": [{"status": "x"}]}),
                           content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {TOKEN}")  # fmt: skip
    assert response.status_code == 400
    assert client.get("/api/v1/alertmanager").status_code == 405


def test_it_files_a_firing_alert_on_its_node_and_opens_the_node_incident(client, inventory):
    start = datetime.now(UTC) - timedelta(minutes=1)
    assert deliver(client, alert(instance=f"{NODE}:9100", start=start)).json() == {"accepted": 1}
    row = ExternalAlert.objects.get()
    assert (row.node.name, row.status, row.severity) == (NODE, "firing", "minor")
    incident = Incident.objects.get(group=None, node__name=NODE)
    assert row.incident == incident
    assert (incident.kind, incident.state) == ("external_alert", "open")
    assert "NodeFilesystemFull" in incident.summary
    assert AuditLog.objects.filter(actor="alertmanager", verb="alert.firing").count() == 1
    # Alertmanager re-sends firing alerts: nothing new.
    deliver(client, alert(instance=f"{NODE}:9100", start=start))
    assert ExternalAlert.objects.count() == 1
    assert AuditLog.objects.filter(verb="alert.firing").count() == 1


def test_it_resolves_the_evidence_and_its_incident_when_alertmanager_resolves(client, inventory):
    start = datetime.now(UTC) - timedelta(minutes=5)
    deliver(client, alert(instance=f"{NODE}:9100", start=start), alert(fp="b2", start=start,
            Hostname=NODE, alertname="NodeLoadHigh"))  # fmt: skip
    assert Incident.objects.get(node__name=NODE).external_alerts.count() == 2
    end = datetime.now(UTC) - timedelta(seconds=5)
    deliver(client, alert("resolved", instance=f"{NODE}:9100", start=start, end=end))
    first = ExternalAlert.objects.get(fingerprint="a1b2c3")
    assert first.status == "resolved" and first.resolved_at is not None
    assert Incident.objects.get(node__name=NODE).state == "open"  # the other still fires
    deliver(client, alert("resolved", fp="b2", start=start, end=end, Hostname=NODE,
                          alertname="NodeLoadHigh"))  # fmt: skip
    assert Incident.objects.get(node__name=NODE).state == "resolved"


def test_it_files_a_group_alert_as_the_groups_evidence(client, post_batch):
    rec = {"kind": "transition", "group": "chat", "generation": 1, "to_state": "running"}
    post_batch(make_batch([rec], node="node-0"))
    deliver(client, alert(group="chat", alertname="HighErrorRate"))
    row = ExternalAlert.objects.get()
    assert (row.group.name, row.node, row.incident) == ("chat", None, None)


def xid_alert(code: int = 79, **extra: str) -> dict[str, Any]:
    return alert(fp="dcgm1", alertname="DCGM_FI_DEV_XID_ERRORS", severity="critical",
                 Hostname=NODE, gpu="3", UUID=GPU, err_code=str(code), **extra)  # fmt: skip


def agent_xid(post_batch, code: int = 79) -> None:
    event = {"kind": "device_event", "gpu": GPU, "event": "xid", "code": code, "detail": "fell"}
    assert post_batch(make_batch([event], node=NODE)).status_code == 202


def test_it_latches_a_dcgm_xid_alert_as_the_gpus_fault(client, inventory):
    deliver(client, xid_alert())
    incident = Incident.objects.get(group=None, node__name=NODE)
    assert (incident.kind, incident.subject) == ("xid", f"gpu:{GPU}")
    event = HealthEvent.objects.get(kind="fault", gpu=GPU)
    assert (event.gpu, event.actor, event.evidence["code"]) == (GPU, "alertmanager", 79)
    assert ExternalAlert.objects.get().incident == incident


def test_it_folds_the_agents_xid_after_a_dcgm_alert_into_one_fault(client, inventory, post_batch):
    deliver(client, xid_alert())
    agent_xid(post_batch)
    assert Incident.objects.filter(group=None, node__name=NODE).count() == 1
    assert HealthEvent.objects.filter(kind="fault", gpu=GPU).count() == 1


def test_it_folds_a_dcgm_alert_after_the_agents_xid_into_one_fault(client, inventory, post_batch):
    agent_xid(post_batch)
    # Keyed by the GPU's index (dcgm-exporter's `gpu` label), no UUID.
    xid = xid_alert()
    del xid["labels"]["UUID"]
    deliver(client, xid)
    assert Incident.objects.filter(group=None, node__name=NODE).count() == 1
    assert HealthEvent.objects.filter(kind="fault", gpu=GPU).count() == 1
    row = ExternalAlert.objects.get()
    assert (row.gpu, row.joined) == (GPU, "agent")
    assert row.incident == Incident.objects.get(group=None, node__name=NODE)


def test_it_keeps_a_different_xid_on_another_gpu_apart(client, inventory, post_batch):
    other = {"kind": "device_sample", "gpu": "GPU-other", "index": 1, "temp_c": 50.0}
    post_batch(make_batch([other], node=NODE))
    agent_xid(post_batch)
    xid = xid_alert()
    xid["labels"].update(gpu="1", UUID="GPU-other")
    deliver(client, xid)
    assert ExternalAlert.objects.get().joined == ""
    faults = HealthEvent.objects.filter(kind="fault").exclude(gpu="")
    assert set(faults.values_list("gpu", flat=True)) == {GPU, "GPU-other"}
