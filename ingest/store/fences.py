"""Fencing and ownership, decided per record over what the batch's two reads returned.

Each record is fenced against its group's generation (`Fences.fence`); ownership is
decided here with no query per record: a GPU belongs to the node that first reported it, a
group to its job's nodes and its launcher (ingest.ownership decides who). A claim without
evidence is stored as telemetry, never applied, and recorded as a violation about the
claimant, never the group it claimed (as fencing treats a stale record); so is a node's
GPU or new group beyond its limit (settings INGEST_MAX_GPUS_PER_NODE,
INGEST_NEW_GROUPS_PER_HOUR). Must not write: the writer's flush does.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings

from agents import protocol as p
from agents import vocab
from console.models import ConsistencyGroup
from ingest import fencing, ownership
from ingest.rawsql import send
from ingest.store.batch_state import BatchState
from ingest.store.live_state import RANKS_OF_NON_ATTESTERS_DROP, VIOLATIONS_DETACH

# The progress (steps, checkpoints) an older generation stored past a new fence, newest
# first per generation: read once per fence, a restart's worth of rows at most.
# Stored but not applied (stale: a stranger's refused progress) is the stranger's claim, not
# the group's split brain.
WRITTEN_PAST_FENCE = """
SELECT 'step', generation, max(ts) FROM ingest_steprecord
 WHERE group_id = %(g)s AND generation < %(gen)s AND ts > %(fence)s AND NOT stale
 GROUP BY generation
UNION ALL
SELECT 'checkpoint', generation, max(ts) FROM ingest_checkpointrecord
 WHERE group_id = %(g)s AND generation < %(gen)s AND ts > %(fence)s AND NOT stale
 GROUP BY generation
"""


# Records a rank's node sends: from a node that does not own their group (ingest.ownership)
# they are stored as telemetry and never applied.
_RANK_RECORDS = (p.Step, p.Collective, p.Process, p.ProcessGroups, p.Probe, p.Checkpoint)


class Fences(BatchState):
    """Per-record fencing, claims and ownership over a batch's state."""

    def written_past_the_fence(self, group: ConsistencyGroup, view: Any, fence: datetime) -> None:
        """An older generation's progress stamped after this fence that reached the service
        before it (the launcher's node delivered the transition late: its agent between
        sends, its spool after an outage) is split brain too, as it is when it arrives
        after the fence: the verdict must not depend on which record came first."""
        with send(
            WRITTEN_PAST_FENCE, {"g": group.pk, "gen": view.generation, "fence": fence}
        ) as cur:
            for kind, generation, at in cur.fetchall():
                violation = fencing.stale_violation(view, kind, generation, at)
                if violation is not None:
                    self.violations.append(violation)

    def fence(self, rec: Any, ts: datetime, *, is_transition: bool = False) -> bool:
        """True when the record may move live state; flags stale writers, and refuses the
        rank records of a node that does not own the group (ingest.ownership)."""
        group, view = self.groups[rec.group]
        self.touched_groups.add(group.name)
        owner = self.owners[group.name]
        if not is_transition:
            if rec.generation <= view.generation and self._foreign(rec, owner):
                return False  # a newer generation's is only stored (`ahead`), whoever sent it
            forming = not view.is_new and owner.forming() and getattr(rec, "rank", None) is not None
            if (view.is_new or forming) and rec.generation > settings.INGEST_MAX_GENERATION_JUMP:
                self.claim(
                    "generation_jump",
                    f"group:{group.name}",
                    view.generation,
                    {
                        "record_generation": rec.generation,
                        "active_generation": 0,
                        "max_jump": settings.INGEST_MAX_GENERATION_JUMP,
                    },
                )
                return False
            if forming:  # its first rank: the group's first rendezvous starts at its generation
                if rec.generation != view.generation:
                    self.reset(group, view, owner, rec.generation, ts)
                self.start_rendezvous(group.name, owner)
        verdict = fencing.classify_generation(view, rec.generation, is_transition=is_transition)
        if verdict == "stale":
            violation = fencing.stale_violation(view, rec.__struct_config__.tag, rec.generation, ts)
            if violation is None:
                return False
            # The group's own old generation writing: a host, a node joining its rendezvous
            # earlier in this batch, or one that held the rank in that generation.
            ours = is_transition or ownership.hosts(owner, self.claimant) or self._held_here(rec)
            if ours or (not owner.owner_job and self.places_here(group.name)):
                self.violations.append(violation)
            else:  # a node that is none of its hosts: its claim, not the group's split brain
                self.claim(
                    "rank_claim",
                    f"group:{group.name}",
                    rec.generation,
                    {**violation.evidence, "contract": violation.kind},
                )
            return False
        if verdict == "ahead":
            return False
        if view.is_new:
            view.generation = rec.generation
            group.generation = rec.generation
            view.is_new = False
        group.last_activity = max(group.last_activity or ts, ts)
        return True

    def _foreign(self, rec: Any, owner: ownership.Owner) -> bool:
        """True (and the claim recorded) for a rank's record (or, once the group has
        owners, a checkpoint) from a node that may not write the group. A record of a
        generation the group has not reached is never applied, so no claim: a spare's agent
        may deliver its ranks before the host that declared it delivers the transition."""
        if type(rec) is p.Checkpoint:
            if not (owner.owner_job or owner.has_members):
                return False
        elif not isinstance(rec, _RANK_RECORDS) or getattr(rec, "rank", None) is None:
            return False
        who = self.claimant
        if ownership.hosts(owner, who) or who.launches(rec.group):
            return False
        if ownership.rendezvous_open(owner, self.now):
            # Joining the first rendezvous: only with a rank it may take (decided here, not
            # at flush, so a refused claim's rows are stored as not applied); a checkpoint
            # only from a node that places a rank (or while none is placed).
            rank = getattr(rec, "rank", None)
            if rank is None:
                if not owner.has_members or self.places_here(rec.group):
                    return False
            else:
                old = self.existing_ranks.get((rec.group, rank))
                if ownership.may_place(owner, who, rank, rec.generation, old, self.now):
                    return False
        if self._held_here(rec):  # its old generation, still writing: the group's split brain
            return False
        evidence = {
            "record_kind": rec.__struct_config__.tag,
            "rank": getattr(rec, "rank", None),
            "owner_job": owner.owner_job or None,
        }
        self.claim("rank_claim", f"group:{rec.group}", rec.generation, evidence)
        return True

    def _held_here(self, rec: Any) -> bool:
        """This node held the record's rank in the record's (older) generation: a node the
        group has left since (replaced, its allocation ended) whose old process lives on."""
        rank = getattr(rec, "rank", None)
        if rank is None or rec.generation >= self.groups[rec.group][1].generation:
            return False
        if ownership.was_host(self.owners[rec.group], rec.generation):
            return True
        old = self.existing_ranks.get((rec.group, rank))
        return old is not None and (old["node_id"], old["generation"]) == (
            self.node_id,
            rec.generation,
        )

    def claim(
        self, kind: str, what: str, generation: int, evidence: dict[str, Any] | None = None
    ) -> None:
        """Record a refused claim: evidence about this node (the claimant), never about the
        group or rank it claimed (no incident of that group cites it). One per claimed
        thing and kind a batch."""
        if (kind, what) in self._claimed:
            return
        self._claimed.add((kind, what))
        self.violations.append(
            fencing.Violation(
                kind, f"node:{self.node.name}", generation, {"claimed": what, **(evidence or {})}
            )
        )

    def start_rendezvous(self, name: str, owner: ownership.Owner) -> None:
        if owner.rendezvous_until is None:
            owner.rendezvous_until = self.now + timedelta(seconds=settings.INGEST_RENDEZVOUS_S)
            self.started.add(name)

    def reset(
        self,
        group: ConsistencyGroup,
        view: fencing.GroupView,
        owner: ownership.Owner,
        generation: int,
        ts: datetime,
    ) -> None:
        """Start the group afresh at `generation`: what a node announced before its job's
        ranks came (a name squatted ahead of its job), or what its launcher reclaims."""
        view.generation = group.generation = generation
        view.fenced_at = group.state_since = ts
        group.state = vocab.INITIALIZING
        view.restart_count = group.restart_count = 0
        view.data_cursor = group.data_cursor = None
        view.model_version = group.model_version = ""
        view.versions_seen = []
        view.last_checkpoint_step = group.last_checkpoint_step = None
        view.is_new = False
        group.world_size = owner.world_size = None
        group.topology = {}
        group.objectives = {k: v for k, v in (group.objectives or {}).items() if k != "launcher"}
        owner.window_start, owner.window_advance = None, 0
        group.summary = {**group.summary, "versions_seen": []}
        self.summary_changed.add(group.name)
        if VIOLATIONS_DETACH not in self.drops[group.name]:
            self.drops[group.name].append(VIOLATIONS_DETACH)

    def set_job(self, job: str, group: ConsistencyGroup) -> None:
        """The group's scheduler job, as a node that may transition it names it (its
        launcher, a host, one placing a rank in this batch, its creator while nothing is
        placed); a host whose agent attests the job binds the group to it
        (ingest.ownership). Anyone else's is a `job_claim` about them."""
        owner, who = self.owners[group.name], self.claimant
        if job == group.scheduler_job and (owner.owner_job or not ownership.binds(owner, who, job)):
            return
        # Whoever may transition the group (a host, its creator while nothing is placed).
        host = self.groups[group.name][1].is_new or ownership.may_transition(
            owner, who, group=group.name, places_here=self.places_here(group.name)
        )
        if not ownership.may_set_job(owner, who, job, group=group.name, host=host):
            attested = sorted(who.attested) if who.attested is not None else None
            evidence = {"job": job, "group_job": group.scheduler_job or None, "attested": attested}
            self.claim("job_claim", f"group:{group.name}", group.generation, evidence)
            return
        group.scheduler_job = job
        if host and ownership.binds(owner, who, job):
            self._bind(group.name, job)

    def take_name(self, job: str, name: str, generation: int, ts: datetime) -> None:
        """A group named after the job this node's agent attests is that job's: taken from
        whoever held the name (ranks of nodes that do not attest the job are dropped) and
        started afresh at the job's generation, unless it was the job's already."""
        owner, who = self.owners[name], self.claimant
        if who.launches(name) or not ownership.takes_name(owner, who, job, name):
            return
        group, view = self.groups[name]
        if not view.is_new:
            self.reset(group, view, owner, generation, ts)
        group.scheduler_job = job
        self._bind(name, job)

    def _bind(self, name: str, job: str) -> None:
        """Bind the group to `job`: from now on its hosts are the nodes that attest the job,
        and the ranks other nodes hold (a first rendezvous's strangers) are dropped."""
        owner, (group, view) = self.owners[name], self.groups[name]
        owner.owner_job = group.owner_job = job
        owner.member, owner.has_members = False, False
        if not view.is_new:
            self.drops[name].append(RANKS_OF_NON_ATTESTERS_DROP)
            self.existing_ranks = {
                k: v
                for k, v in self.existing_ranks.items()
                if k[0] != name or v["node_id"] == self.node_id
            }

    def places_here(self, name: str) -> bool:
        """True when a record earlier in this batch placed a rank of group `name` on this
        node, and not as a claim `_rank_move_refused` would refuse: a job's rank-0 node
        starts its ranks and announces the job in one batch, while its peers' agents may
        have delivered (and placed their ranks) first."""
        return any(
            gname == name and self._may_place(gname, rank, entry)
            for (gname, rank), entry in self.ranks.items()
        )

    def _may_place(self, gname: str, rank: int, entry: dict[str, Any]) -> bool:
        """A rank's placement on this node (ingest.ownership.may_place): a host moves a rank
        with evidence (a new generation re-placed the ranks, or its process exited on its
        old node); a node that hosts nothing only takes one nobody held, while the group's
        first rendezvous is open."""
        old = self.existing_ranks.get((gname, rank))
        return ownership.may_place(
            self.owners[gname], self.claimant, rank, entry["generation"], old, self.now
        )

    def _owned_elsewhere(self, uuid: str) -> bool:
        """True when another node owns this GPU and has reported it recently."""
        owner = self.device_owners.get(uuid)
        if owner is None or owner[0] == self.node_id:
            return False
        seen = owner[1]
        move_after = timedelta(seconds=settings.INGEST_DEVICE_MOVE_AFTER_S)
        return seen is not None and seen >= self.now - move_after

    def _rank_move_refused(self, gname: str, rank: int, entry: dict[str, Any]) -> bool:
        """`_may_place`'s refusal, recorded as a `rank_claim` about this node."""
        if self._may_place(gname, rank, entry):
            return False
        old = self.existing_ranks.get((gname, rank))
        self.claim(
            "rank_claim",
            f"rank:{gname}/{rank}",
            entry["generation"],
            {
                "owner_node_id": old["node_id"] if old else None,
                "owner_process_state": old["process_state"] if old else None,
            },
        )
        return True
