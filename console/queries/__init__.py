"""Reads for pages, the API, live payloads and diagnosis, with their joins baked in.

`fleet` reads the console's own tables (groups, incidents, nodes and their GPUs) and is
re-exported here (`queries.node_payloads(...)`). `telemetry` is the one console package
that reads ingest's tables or imports `ingest` at all, one module per record family;
import the family by name (`from console.queries.telemetry import step_rows`) so the seam
shows at every call site.
Nothing in this package writes.
"""

from console.queries.fleet import (
    FleetNode,
    fleet_grid,
    group_incidents,
    groups_on_nodes,
    groups_overview,
    node_detail,
    node_payloads,
    open_incidents,
)

__all__ = [
    "FleetNode",
    "fleet_grid",
    "group_incidents",
    "groups_on_nodes",
    "groups_overview",
    "node_detail",
    "node_payloads",
    "open_incidents",
]
