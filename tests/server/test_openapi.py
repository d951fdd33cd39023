"""The served OpenAPI schema: valid OpenAPI 3, every route in it, ingest from the contract.

The ingest operation is generated from agents.protocol and agents.replies (faultline.openapi);
these tests check the schema against an independent validator, that every URL the service
routes under /api/ is documented, and that ingest's real answers decode with the reply
Structs the schema was generated from (so the documented replies cannot drift).
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from django.urls import URLPattern, URLResolver, get_resolver
from openapi_spec_validator import validate

from agents import protocol, replies
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db


@pytest.fixture
def schema(client: Any, cast: dict[str, Any]) -> dict[str, Any]:
    client.force_login(cast["viewer"])
    response = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    return json.loads(response.content)


def test_it_serves_a_schema_that_an_openapi_validator_accepts(schema: dict[str, Any]) -> None:
    validate(schema)  # raises OpenAPIValidationError naming the first problem


def _routes(patterns: list[Any], prefix: str = "") -> list[str]:
    out: list[str] = []
    for p in patterns:
        if isinstance(p, URLResolver):
            out += _routes(p.url_patterns, prefix + str(p.pattern))
        elif isinstance(p, URLPattern):
            out.append(prefix + str(p.pattern))
    return out


def test_it_documents_every_api_route(schema: dict[str, Any]) -> None:
    import re

    documented = {re.sub(r"\{[^}]+\}", "{}", path) for path in schema["paths"]}
    routed = {
        "/" + re.sub(r"<[^>]+>", "{}", route)
        for route in _routes(get_resolver().url_patterns)
        if route.startswith("api/v1/")
    }
    assert routed - documented == set()


def test_it_documents_ingest_from_the_wire_contract(schema: dict[str, Any]) -> None:
    op = schema["paths"]["/api/v1/ingest"]["post"]
    body = op["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/IngestBatch"}
    components = schema["components"]["schemas"]
    (_,), generated = msgspec.json.schema_components([protocol.Batch])
    # Every struct of the contract, and every field of each, is in the schema.
    for name, struct in generated.items():
        assert set(components["Ingest" + name]["properties"]) == set(struct["properties"])
    assert components["IngestBatch"]["additionalProperties"] is False
    kinds = components["IngestBatch"]["properties"]["records"]["items"]["discriminator"]
    contract_kinds = generated["Batch"]["properties"]["records"]["items"]["discriminator"]
    assert set(kinds["mapping"]) == set(contract_kinds["mapping"])  # every record kind
    assert {"heartbeat", "device_sample", "step", "collective", "serving"} <= set(kinds["mapping"])
    assert set(op["responses"]) == {"202", "400", "401", "403", "413", "429", "503"}
    assert op["security"] == [{"agentToken": []}]


def test_it_answers_ingest_with_the_documented_replies(post_batch: Any) -> None:
    batch = make_batch([{"kind": "heartbeat", "uptime_s": 3.0}], node="n-9", seq=4)
    accepted = msgspec.json.decode(post_batch(batch).content, type=replies.Accepted)
    assert (accepted.ack_seq, accepted.duplicate) == (4, False)
    invalid = post_batch(make_batch([{"kind": "step", "rank": -1}], node="n-9", seq=5))
    assert invalid.status_code == 400
    violation = msgspec.json.decode(invalid.content, type=replies.ContractViolation)
    assert violation.record == 0
    refused = post_batch(batch, token="nope")
    assert refused.status_code == 401
    msgspec.json.decode(refused.content, type=replies.Refusal)


def test_it_keeps_the_violation_reply_in_step_with_contract_error() -> None:
    error = protocol.ContractError("record 0: bad", index=0, field="rank")
    decoded = msgspec.json.decode(json.dumps(error.as_dict()), type=replies.ContractViolation)
    assert (decoded.record, decoded.field) == (0, "rank")
