"""What the service answers to `POST /api/v1/ingest` (contract v1), beside agents.protocol.

These Structs are the reply half of the contract: the OpenAPI schema is generated from them
(faultline.openapi) and the service's tests decode its answers with them, so the documented
replies cannot drift from the ones sent. msgspec only, like agents.protocol.
"""

from __future__ import annotations

from msgspec import Struct

from agents.actions_contract import Action


class Accepted(Struct, forbid_unknown_fields=True):
    """202: the batch is stored (or was already: `duplicate`); `ack_seq` is its seq.

    `high_water` and `gaps` are the agent's receipts as this batch found them: the highest
    seq the service had stored for the agent (null: none) and the seq ranges at or below it
    that it lacks (its newest 100 gap ranges). A seq the agent saw acknowledged that lies
    above `high_water` or inside a gap was lost by the service (a failover to a standby
    that lagged): the agent re-sends it from its replay window (agents/replay.py).
    """

    ack_seq: int
    duplicate: bool
    actions: list[Action]  # approved actions for this node (agents.actions_contract)
    high_water: int | None = None
    gaps: list[list[int]] = []  # [first, last] each


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
