"""The node's fleet card, read in the batch's last send: the live push costs no query.

`NODE_CARD` selects what `console.queries.node_payloads` returns for one node, from the
node and GPU rows the batch just wrote; `node_card` (console.events.node_payload) turns
its row into the same dict (a test holds the two equal). Must not write.
"""

from __future__ import annotations

from console import events

node_card = events.node_payload  # the card's one definition, shared with the fleet grid


# Read last in the transaction: the node and GPU rows this batch just wrote.
NODE_CARD = """
SELECT n.name, n.health, n.last_seen, n.quarantined, n.cordoned, coalesce((
    SELECT jsonb_agg(jsonb_build_object(
        'uuid', d.uuid, 'index', d.index, 'health', d.health,
        'temp_c', d.last_sample -> 'temp_c', 'power_w', d.last_sample -> 'power_w',
        'util_pct', d.last_sample -> 'util_pct', 'sm_clock_mhz', d.last_sample -> 'sm_clock_mhz',
        'throttle_reasons', coalesce(d.last_sample -> 'throttle_reasons', '[]'::jsonb),
        'lifecycle', d.lifecycle
    ) ORDER BY d.index, d.id) FROM console_device d WHERE d.node_id = n.id), '[]'::jsonb),
    n.lifecycle, n.lifecycle_reason, n.lifecycle_since, n.taken_out_by, n.replace_flagged,
    n.delivery_delay_s
FROM console_node n WHERE n.id = %(node)s
"""
