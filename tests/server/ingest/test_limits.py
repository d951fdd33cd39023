"""Numbers the contract allows but a column cannot hold: 400 naming record and field."""

from __future__ import annotations

import pytest

from ingest.models import BatchReceipt, StepRecord
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db


def _step(**fields: object) -> dict:
    return {"kind": "step", "group": "job", "generation": 1, "rank": 0, "step": 1, **fields}


def test_it_names_the_record_and_field_of_a_generation_beyond_its_column(post_batch):
    batch = make_batch([_step(), {"kind": "heartbeat"}, _step(step=2, generation=2**40)])
    response = post_batch(batch)
    assert response.status_code == 400
    assert (response.json()["record"], response.json()["field"]) == (2, "generation")
    assert StepRecord.objects.count() == 0
    assert BatchReceipt.objects.count() == 0


def test_it_refuses_a_counter_beyond_64_bits_without_storing_anything(post_batch):
    response = post_batch(make_batch([{"kind": "heartbeat", "spool_depth": 2**63}]))
    assert response.status_code == 400
    assert BatchReceipt.objects.count() == 0


@pytest.mark.parametrize(
    ("record", "field"),
    [
        ({"kind": "device_event", "gpu": "GPU-1", "event": "xid", "detail": "a\u0000b"}, "detail"),
        ({"kind": "device_sample", "gpu": "GPU-\u0000", "index": 0}, "gpu"),
        (_step(phases={"compute": 1.0}, error="x"), None),  # unknown field: refused as before
    ],
)
def test_it_refuses_nul_naming_record_and_field_and_stores_nothing(post_batch, record, field):
    response = post_batch(make_batch([{"kind": "heartbeat"}, record]))
    assert response.status_code == 400
    body = response.json()
    assert body["record"] == 1
    if field is not None:
        assert body["field"] == field
        assert "NUL" in body["error"]
    assert BatchReceipt.objects.count() == 0


def test_a_literal_backslash_u0000_text_is_not_a_nul(post_batch):
    detail = "\\u0000 is how JSON escapes NUL"
    record = {"kind": "device_event", "gpu": "GPU-1", "event": "xid", "detail": detail}
    assert post_batch(make_batch([record])).status_code == 202
