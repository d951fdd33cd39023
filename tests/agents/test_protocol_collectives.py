"""Contract v1 stays compatible: collective payloads from before process-group detail are accepted
as they were, and the new fields and the `process_groups` kind are validated strictly."""

from __future__ import annotations

import json

import pytest

from agents.protocol import Collective, ContractError, ProcessGroups, decode_batch

# A collective batch exactly as agents shipped it before process groups existed.
GOLDEN_V1_COLLECTIVE = {
    "agent": {"id": "agent-node-017-0001", "node": "node-017", "version": "0.1.0"},
    "seq": 1842,
    "sent_at": "2026-11-29T10:00:00.123Z",
    "records": [
        {"kind": "collective", "ts": "2026-11-29T10:00:00Z", "group": "llama-70b",
         "generation": 7, "rank": 133,
         "entries": [
             {"seq": 41, "pg": "0", "op": "all_reduce", "numel": 1048576,
              "dtype": "bfloat16", "state": "completed",
              "started_ts": "2026-11-29T09:59:59.5Z"},
             {"seq": 42, "op": "barrier", "state": "started"},
         ]},
    ],
}  # fmt: skip


def _body(records: list[dict]) -> bytes:
    return json.dumps({**GOLDEN_V1_COLLECTIVE, "records": records}).encode()


def test_it_accepts_the_golden_v1_collective_payload_unchanged() -> None:
    batch = decode_batch(json.dumps(GOLDEN_V1_COLLECTIVE).encode())
    (rec,) = batch.records
    assert isinstance(rec, Collective)
    assert [(e.seq, e.pg, e.op, e.numel) for e in rec.entries] == [
        (41, "0", "all_reduce", 1048576),
        (42, "default", "barrier", None),
    ]
    assert rec.entries[0].out_numel is None and rec.entries[0].peer is None


def test_it_accepts_process_groups_and_the_new_entry_fields() -> None:
    batch = decode_batch(_body([
        {"kind": "process_groups", "ts": "2026-11-29T10:00:00Z", "group": "g",
         "generation": 1, "rank": 5,
         "groups": [{"pg": "default", "size": 8},
                    {"pg": "3", "size": 4, "ranks": [4, 5, 6, 7], "desc": "tp"}]},
        {"kind": "collective", "ts": "2026-11-29T10:00:00Z", "group": "g", "generation": 1,
         "rank": 5, "entries": [
             {"seq": 1, "pg": "3", "op": "all_to_all_single", "numel": 10, "out_numel": 14,
              "in_splits": [1, 2, 3, 4], "out_splits": [2, 3, 4, 5]},
             {"seq": 1, "op": "isend", "peer": 1, "p2p_seq": 1, "coalesced": 2}]},
    ]))  # fmt: skip
    groups, window = batch.records
    assert isinstance(groups, ProcessGroups) and groups.groups[1].ranks == [4, 5, 6, 7]
    assert window.entries[0].in_splits == [1, 2, 3, 4] and window.entries[1].peer == 1


@pytest.mark.parametrize(
    ("groups", "field"),
    [
        ([{"pg": "3", "size": 0}], "size"),
        ([{"pg": "3", "size": 2, "members": [0, 1]}], "members"),
        ([{"pg": "3", "size": 2, "ranks": [-1, 0]}], "ranks"),
    ],
)
def test_it_refuses_a_malformed_process_group_naming_the_field(groups, field) -> None:
    with pytest.raises(ContractError) as err:
        decode_batch(
            _body(
                [
                    {
                        "kind": "process_groups",
                        "ts": "2026-11-29T10:00:00Z",
                        "group": "g",
                        "generation": 1,
                        "rank": 0,
                        "groups": groups,
                    }
                ]
            )
        )
    assert field in err.value.message  # fmt: skip
