"""Free-text fields lose paths and secret-looking runs and stay bounded before storage."""

from __future__ import annotations

import json

import pytest

from console.models import AuditLog, Device, HealthEvent, Incident
from ingest.models import DeviceEvent, ProcessRecord
from ingest.scrub import ELLIPSIS, MAX_TEXT, scrub_text
from tests.conftest import make_batch
from tests.server.scenarios.timeline import HEALTHY_S, healthy_job


def test_it_replaces_posix_and_windows_paths():
    text = scrub_text(r"FileNotFoundError: /home/alice/data/shard-7.bin and C:\Users\bob\x.py")
    assert "alice" not in text and "bob" not in text
    assert text.count("<path>") == 2


def test_it_replaces_home_and_relative_paths():
    assert scrub_text("open ~/keys/id_rsa failed; ./run/out/log") == ("open <path> failed; <path>")


def test_it_keeps_units_that_merely_contain_a_slash():
    assert scrub_text("3.2 ms/step at 400 tokens/s") == "3.2 ms/step at 400 tokens/s"


def test_it_replaces_long_digit_runs_but_keeps_short_codes():
    text = scrub_text("Xid 79 at 00000000:3B:00.0 for account 4111111111111111")
    assert "4111111111111111" not in text and "<num>" in text
    assert text.startswith("Xid 79 at 00000000:3B:00.0")


def test_it_replaces_long_hex_runs():
    assert scrub_text("session 9f86d081884c7d659a2feaa0c55ad015 expired") == (
        "session <hex> expired"
    )


def test_it_replaces_token_like_runs():
    token = "flt_" + "Ab3" * 12
    assert token not in scrub_text(f"auth with {token} failed")


def test_it_truncates_to_the_limit_with_an_ellipsis():
    text = scrub_text("x" * 1000)
    assert len(text) == MAX_TEXT and text.endswith(ELLIPSIS)


def test_it_passes_none_through():
    assert scrub_text(None) is None


@pytest.mark.django_db
def test_it_stores_process_and_event_text_scrubbed(post_batch):
    secret = "a1b2c3d4e5f60718293a4b5c6d7e8f90"
    batch = make_batch(
        [
            {
                "kind": "process",
                "group": "job",
                "generation": 1,
                "rank": 0,
                "event": "exited",
                "error_type": f"OSError: /mnt/datasets/private/{secret}.bin",
            },
            {"kind": "device_event", "gpu": "GPU-0", "event": "xid", "code": 13,
             "detail": f"graphics engine exception, job key {secret}"},
        ]
    )  # fmt: skip
    assert post_batch(batch).status_code == 202
    stored = ProcessRecord.objects.get().error_type + DeviceEvent.objects.get().detail
    assert secret not in stored and "/mnt/datasets" not in stored
    assert stored.startswith("OSError: <path>")


PATH = "/home/alice/datasets/customer-x/shard-00017.bin"
TOKEN = "flt_9f8e7d6c5b4a39281706f5e4d3c2b1a0ffeeddcc"
SECRET = "sk-Zm9vYmFyYmF6cXV4cXV1eHF1dXhxdXV4cXV1eA"


@pytest.mark.django_db
def test_an_xid_detail_reaches_no_incident_audit_or_history_with_a_path_or_token(post_batch):
    """Scrubbed once, as the batch enters the writer: the GPU's latched fault, its node
    incident, the job's incident, the audit log and the health history all read that."""
    tl = healthy_job(post_batch)
    detail = f"Xid 48 DBE reading {PATH} with key {TOKEN} {SECRET}"
    tl.add(tl.node(5), tl.at(HEALTHY_S + 0.5), {"kind": "device_event", "gpu": tl.gpu(5),
           "event": "xid", "code": 48, "detail": detail})  # fmt: skip
    tl.collectives(seq=HEALTHY_S, at=HEALTHY_S + 1, entered=[0, 1, 2, 3, 4, 6, 7])
    incidents = tl.diagnose(at=HEALTHY_S + 1.5)
    node_incidents = list(Incident.objects.filter(group=None))
    assert incidents and node_incidents  # the job's and the GPU's
    stored = [
        *(json.dumps([i.summary, i.root_cause, i.timeline, i.recovery], default=str)
          for i in incidents + node_incidents),
        *(json.dumps([a.reason, a.data], default=str) for a in AuditLog.objects.all()),
        *(json.dumps([h.reason, h.evidence], default=str) for h in HealthEvent.objects.all()),
        *(json.dumps([d.lifecycle_reason, d.lifecycle_evidence], default=str)
          for d in Device.objects.all()),
        *(e.detail or "" for e in DeviceEvent.objects.all()),
    ]  # fmt: skip
    assert any("<path>" in s for s in stored)  # the scrubbed detail did travel
    for secret in (PATH, "alice", "customer-x", TOKEN, SECRET):
        assert not [s for s in stored if secret in s], secret
