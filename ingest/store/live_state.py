"""Live-state SQL for the batch's last send: GPUs, node health, ranks, groups, activity.

Owns the statements that upsert what the console shows live (console_device, console_node,
console_rank, console_consistencygroup), the read of the named groups and ranks that opens
a batch (FOR KEY SHARE or FOR UPDATE), and this process's memory of the group activity it
wrote. Statements only: `writer.BatchWriter` decides which run. Must not COPY telemetry.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from agents.vocab import HEALTH_ORDER
from console.models import ConsistencyGroup
from ingest.rawsql import columns
from ingest.store.delivery import NODE_DELAY_SET

DEVICE_UPSERT = """
INSERT INTO console_device (uuid, node_id, index, last_sample, last_seen, health, isolated)
SELECT x.uuid, %(node)s, x.index, x.sample, x.seen, x.health, false
FROM jsonb_to_recordset(%(devices)s)
    AS x(uuid text, index int, sample jsonb, seen timestamptz, health text)
ON CONFLICT (uuid) DO UPDATE SET node_id = EXCLUDED.node_id, index = EXCLUDED.index,
    last_sample = CASE
        WHEN EXCLUDED.last_sample ? 'throttled'
            OR NOT coalesce(console_device.last_sample ? 'throttled', false)
        THEN EXCLUDED.last_sample
        ELSE EXCLUDED.last_sample
            || jsonb_build_object('throttled', console_device.last_sample -> 'throttled')
    END,
    last_seen = EXCLUDED.last_seen,
    health = CASE console_device.lifecycle WHEN 'healthy' THEN EXCLUDED.health
                  WHEN 'validating' THEN 'warning' ELSE 'critical' END
WHERE console_device.node_id = EXCLUDED.node_id OR console_device.last_seen IS NULL
    OR console_device.last_seen < %(move_before)s
"""

# `throttled` (the newest sample that showed throttle reasons) is carried over clean samples:
# the straggler rule still blames a throttle whose slow steps are in its window.
# A latched fault (console.policy.fleet_health) keeps the GPU critical through clean samples
# until it is repaired; a validating GPU reads as a warning until its window passes.

# A GPU named only by an event (Xid, gpu_lost) keeps its last sample; it turns critical.
EVENT_DEVICE_UPSERT = """
INSERT INTO console_device (uuid, node_id, index, last_sample, last_seen, health, isolated)
SELECT x.uuid, %(node)s, 0, '{}'::jsonb, %(now)s, 'critical', false
FROM jsonb_array_elements_text(%(events_only)s) AS x(uuid)
ON CONFLICT (uuid) DO UPDATE SET node_id = EXCLUDED.node_id, health = 'critical'
WHERE console_device.node_id = EXCLUDED.node_id OR console_device.last_seen IS NULL
    OR console_device.last_seen < %(move_before)s
"""

# last_seen never moves backwards (a replayed backlog); health is the worst GPU's, and is
# recomputed only when this batch touched a GPU; the delivery delay is the batch's.
_HEALTH_RANKS = ", ".join(f"('{h}', {i})" for i, h in enumerate(HEALTH_ORDER))
NODE_UPDATE = f"""
UPDATE console_node SET
    last_seen = CASE WHEN %(seen)s::timestamptz IS NULL THEN last_seen
                     ELSE greatest(coalesce(last_seen, %(seen)s::timestamptz), %(seen)s) END,
    health = CASE WHEN NOT %(touched)s THEN health ELSE coalesce((
        SELECT o.h FROM (VALUES {_HEALTH_RANKS}) AS o(h, r)
        WHERE o.h IN (SELECT d.health FROM console_device d WHERE d.node_id = %(node)s)
        ORDER BY o.r DESC LIMIT 1), 'ok') END,{NODE_DELAY_SET}
WHERE id = %(node)s
"""  # noqa: S608 - constant health names

RANK_STATE = (
    "generation",
    "last_step",
    "last_step_at",
    "data_cursor",
    "process_state",
    "gpu",
    "node_id",
)

RANK_UPSERT = """
INSERT INTO console_rank (group_id, rank, node_id, gpu, generation, last_step, last_step_at,
    data_cursor, process_state)
SELECT x.group_id, x.rank, %(node)s, coalesce(x.gpu, ''), x.generation, x.last_step,
    x.last_step_at, x.data_cursor, coalesce(x.process_state, '')
FROM jsonb_to_recordset(%(ranks)s) AS x(group_id bigint, rank int, gpu text, generation int,
    last_step bigint, last_step_at timestamptz, data_cursor bigint, process_state text)
ON CONFLICT (group_id, rank) DO UPDATE SET node_id = EXCLUDED.node_id, gpu = EXCLUDED.gpu,
    generation = EXCLUDED.generation, last_step = EXCLUDED.last_step,
    last_step_at = EXCLUDED.last_step_at, data_cursor = EXCLUDED.data_cursor,
    process_state = EXCLUDED.process_state
WHERE console_rank.node_id = EXCLUDED.node_id OR console_rank.generation <> EXCLUDED.generation
    OR console_rank.process_state = 'exited'
"""

# What ingest may change on a group; diagnosis owns the rest of `summary`, so only the
# versions seen are merged into it, and only when a transition changed them.
GROUP_WRITTEN = (
    "kind",
    "state",
    "generation",
    "restart_count",
    "world_size",
    "topology",
    "data_cursor",
    "model_version",
    "last_checkpoint_step",
    "state_since",
    "last_activity",
    "scheduler_job",
    "objectives",
    "owner_job",
    "rendezvous_until",
    "generation_window_start",
    "generation_window_advance",
)
GROUP_JSON = {"topology", "objectives"}
_GROUP_SET = ", ".join(f"{f} = %(g_{f})s" for f in GROUP_WRITTEN)
GROUP_UPDATE = f"""
UPDATE console_consistencygroup SET {_GROUP_SET},
    summary = CASE WHEN %(g_versions)s::jsonb IS NULL THEN summary
        ELSE summary || jsonb_build_object('versions_seen', %(g_versions)s::jsonb) END
WHERE id = %(g_id)s
"""  # noqa: S608 - constant column names

# A batch that only shares the row (FOR KEY SHARE) and places the first rank of a group
# that has none (its first rendezvous starts, ingest.ownership): written once, by the
# first such batch to commit; another's finds the rendezvous started and changes nothing.
GROUP_UPDATE_FORMING = GROUP_UPDATE.rstrip() + " AND rendezvous_until IS NULL\n"

KIND_UPDATE = """
UPDATE console_consistencygroup SET kind = %(g_kind)s WHERE id = %(g_id)s AND kind = 'unknown'
"""

ACTIVITY_STEP = timedelta(seconds=1)
# Per process: the newest last_activity this process committed for each group id.
recent_activity: dict[int, datetime] = {}
# Forward only, and never a wait: a row another transaction holds (a diagnosis pass writing
# the group's summary, a transition, a concurrent batch's own activity) is skipped, and the
# next batch a second later moves it. Waiting here held every batch of a group behind a
# pass stuck inside its transaction (a frozen worker): its Xids and steps with them.
ACTIVITY_UPDATE = """
UPDATE console_consistencygroup SET last_activity = %(g_last_activity)s
WHERE id = (SELECT id FROM console_consistencygroup WHERE id = %(g_id)s
    AND (last_activity IS NULL OR last_activity < %(g_last_activity)s)
    FOR NO KEY UPDATE SKIP LOCKED)
"""


def forget_recent() -> None:
    """Drop this process's memory of the activity it wrote (tests)."""
    recent_activity.clear()


# The actions this node's agent runs: its own, and those routed to it as a controller agent
# (console.actions.remediation._run_by, the same rule).
ACTIONS_PENDING = """
SELECT EXISTS (SELECT 1 FROM console_action
  WHERE ((node_id = %(node)s AND executor_id IS NULL) OR executor_id = %(node)s)
    AND state = ANY(%(live)s::text[]))
"""

_GROUP_ATTNAMES = [f.attname for f in ConsistencyGroup._meta.concrete_fields]
GROUP_NAME, GROUP_KIND = _GROUP_ATTNAMES.index("name"), _GROUP_ATTNAMES.index("kind")

# After the group's columns: whether the batch's node is one of its rendezvous nodes (-1),
# left them at a generation (N), or never was one (NULL), and whether it has any (who
# owns the group: ingest.ownership). Index lookups on ingest_groupmember's (group, node).
GROUPS_AND_RANKS = f"""
SELECT {columns(ConsistencyGroup, "g")},
    (SELECT coalesce(m.left_generation, -1) FROM ingest_groupmember m
     WHERE m.group_id = g.id AND m.node = %(node_name)s),
    EXISTS (SELECT 1 FROM ingest_groupmember m WHERE m.group_id = g.id
            AND m.left_generation IS NULL)
FROM console_consistencygroup g
WHERE g.name = ANY(%(names)s::text[]) ORDER BY g.name FOR KEY SHARE;
SELECT g.name, r.rank, {", ".join(f"r.{c}" for c in RANK_STATE)}
FROM console_consistencygroup g JOIN console_rank r ON r.group_id = g.id
WHERE g.name = ANY(%(names)s::text[]) AND r.rank = ANY(%(ranks)s::int[])
"""  # noqa: S608 - constant column names
# The ranks read are every named group's ranks among the numbers named (a superset of the
# pairs, looked up by pair): both lists are tiny and go through (name) and (group, rank)
# indexes. A join on a jsonb_to_recordset of the pairs was planned as a scan of all ranks.
GROUPS_AND_RANKS_LOCKED = GROUPS_AND_RANKS.replace("FOR KEY SHARE;", "FOR UPDATE;")

# Who owns a group (ingest.ownership): the nodes that joined its first rendezvous, a
# generation's nodes declared by a host or the launcher (replacing the others), and the
# ranks a reset leaves to the group's owners (a name taken by the job it names: ranks of
# nodes whose agent does not attest the job; a launcher's reclaim: ranks of nodes it did
# not declare).
MEMBERS_JOIN = """
INSERT INTO ingest_groupmember (group_id, node)
SELECT unnest(%(joins)s::bigint[]), %(node_name)s ON CONFLICT DO NOTHING
"""
MEMBERS_DECLARE = """
UPDATE ingest_groupmember SET left_generation = %(d_gen)s WHERE group_id = %(d_group)s
    AND left_generation IS NULL AND NOT node = ANY(%(d_nodes)s::text[]);
INSERT INTO ingest_groupmember (group_id, node)
SELECT %(d_group)s, unnest(%(d_nodes)s::text[])
ON CONFLICT (group_id, node) DO UPDATE SET left_generation = NULL
"""
RANKS_OF_NON_ATTESTERS_DROP = """
DELETE FROM console_rank r WHERE r.group_id = %(d_group)s AND NOT EXISTS (
    SELECT 1 FROM ingest_agentstate a WHERE a.node_id = r.node_id AND a.jobs ? %(d_job)s);
DELETE FROM ingest_groupmember WHERE group_id = %(d_group)s
"""
RANKS_OF_UNDECLARED_DROP = """
DELETE FROM console_rank r WHERE r.group_id = %(d_group)s AND NOT EXISTS (
    SELECT 1 FROM console_node n WHERE n.id = r.node_id AND n.name = ANY(%(d_nodes)s::text[]));
DELETE FROM ingest_groupmember WHERE group_id = %(d_group)s
"""
# A group started afresh (its name taken by its job, reclaimed by its launcher): what was
# recorded under whoever held it before is theirs, not the group's (no incident cites it).
VIOLATIONS_DETACH = """
UPDATE ingest_contractviolation SET group_id = NULL WHERE group_id = %(d_group)s
"""
