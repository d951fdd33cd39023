"""What the service answers to `POST /api/v1/ingest` (contract v1), beside agents.protocol.

These Structs are the reply half of the contract: the OpenAPI schema is generated from them
(faultline.openapi) and the service's tests decode its answers with them, so the documented
replies cannot drift from the ones sent. msgspec only, like agents.protocol.
"""

from __future__ import annotations

from msgspec import Struct

from agents.actions_contract import Action


class Accepted(Struct, forbid_unknown_fields=True):
    """202: the batch is stored (or was already: `duplicate`); `ack_seq` is its seq."""

    ack_seq: int
    duplicate: bool
    actions: list[Action]  # approved actions for this node (agents.actions_contract)


class ContractViolation(Struct, forbid_unknown_fields=True):
    """400: the batch breaks the contract; nothing of it was stored.

    `record` is the index of the offending record and `field` its field, when known
    (agents.protocol.ContractError.as_dict).
    """

    error: str
    record: int | None = None
    field: str | None = None


class Refusal(Struct, forbid_unknown_fields=True):
    """401, 403, 413, 429, 503: why the batch was refused; retry after `retry_after` s."""

    error: str
    retry_after: int | None = None
