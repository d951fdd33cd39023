"""Who owns a group: which node may place its ranks, fence it, set its job (docs/security.md,
"Who owns a group").

Pure functions over plain values, decided per batch by `ingest.store.fences` from what
the batch's reads already returned (no query of their own). A group bound to a scheduler
job (`owner_job`) belongs to the nodes whose agents attest that job runs on them; any
other group belongs to the nodes of its first generation's rendezvous (`GroupMember`
rows), which its hosts or its launcher may re-declare for a later generation. Its
launcher token may always transition it and set its job, never place its ranks. A claim
outside this is refused, and the refusal is evidence about the claimant, never the group.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

WINDOW = timedelta(hours=1)  # the generation-move budget's window


@dataclass(frozen=True)
class Claimant:
    """The batch's sender: its node, its credential's launcher group ('' for a node's
    agent), and the jobs its agent attests (None: it has no scheduler to ask)."""

    node_id: int
    node: str
    launcher_group: str = ""
    attested: frozenset[str] | None = None

    def launches(self, group: str) -> bool:
        return bool(self.launcher_group) and self.launcher_group == group


@dataclass
class Owner:
    """A group's ownership as this batch read it (mutated as the batch's records apply)."""

    owner_job: str
    member: bool  # the sender is one of the group's GroupMember nodes
    has_members: bool
    rendezvous_until: datetime | None
    world_size: int | None
    created_by_id: int | None
    window_start: datetime | None = None
    window_advance: int = 0
    left_generation: int | None = None  # the sender was one of its nodes until then

    def forming(self) -> bool:
        """No rank placed yet (and no job bound): the first rank record defines it."""
        return not self.owner_job and self.rendezvous_until is None and not self.has_members


def hosts(owner: Owner, who: Claimant) -> bool:
    """The sender hosts the group: its agent attests the group's job, or (no job bound) it
    is one of the group's rendezvous nodes."""
    if owner.owner_job:
        return who.attested is not None and owner.owner_job in who.attested
    return owner.member


def rendezvous_open(owner: Owner, now: datetime) -> bool:
    """New nodes may still join the group's first rendezvous: for a while after its first
    rank was placed, whatever generation it is at by then (a peer whose agent delivers
    late, after an early restart, is still one of its nodes)."""
    if owner.owner_job:
        return False
    return owner.rendezvous_until is None or now < owner.rendezvous_until


def writes(owner: Owner, who: Claimant, now: datetime) -> bool:
    """The sender's rank records may apply: it hosts the group or may still join it."""
    return hosts(owner, who) or rendezvous_open(owner, now)


def may_place(
    owner: Owner,
    who: Claimant,
    rank: int,
    generation: int,
    old: dict[str, Any] | None,
    now: datetime,
) -> bool:
    """A rank's placement on the sender's node.

    A host places a rank nobody holds, one it holds, and one another node held in an older
    generation (the new generation re-placed the ranks) or whose process exited. A node
    that is no host may only take a rank nobody holds below the declared world size, while
    the first rendezvous is open (it then joins it).
    """
    if hosts(owner, who):
        return (
            old is None
            or old["node_id"] == who.node_id
            or generation != old["generation"]
            or old["process_state"] == "exited"
        )
    if not rendezvous_open(owner, now) or old is not None:
        return False
    return owner.world_size is None or rank < owner.world_size


def was_host(owner: Owner, generation: int) -> bool:
    """The sender was one of the group's nodes in `generation` (a declaration has left it
    out since): its records of then are the group's old generation, not a stranger's."""
    return owner.left_generation is not None and generation < owner.left_generation


def may_transition(owner: Owner, who: Claimant, *, group: str, places_here: bool) -> bool:
    """The group's launcher, a host, a node placing a rank in this very batch (rank 0's
    node starts its ranks and announces the job while its peers' agents delivered
    first), or, while nothing is placed and no job bound, the node whose batch created it."""
    if who.launches(group) or hosts(owner, who) or places_here:
        return True
    return not owner.owner_job and not owner.has_members and owner.created_by_id == who.node_id


def may_set_job(owner: Owner, who: Claimant, job: str, *, group: str, host: bool) -> bool:
    """The group's scheduler job (restart_group's target) is set by its launcher, or by a
    host naming a job its agent attests (if it attests any) that is the group's own."""
    if who.launches(group):
        return True
    if not host or (who.attested is not None and job not in who.attested):
        return False
    return not owner.owner_job or owner.owner_job == job


def binds(owner: Owner, who: Claimant, job: str) -> bool:
    """A host that attests `job` binds an unbound group to it: from then on only nodes
    that attest the job host the group."""
    return not owner.owner_job and who.attested is not None and job in who.attested


def takes_name(owner: Owner, who: Claimant, job: str, group: str) -> bool:
    """A group named after a scheduler job belongs to that job's nodes: one that attests it
    takes the name from whoever held it before (a name squatted ahead of its job)."""
    attested = who.attested is not None and job in who.attested
    return job == group and owner.owner_job != job and attested


def within_budget(owner: Owner, advance: int, now: datetime, *, per_hour: int) -> bool:
    """Spend `advance` generations of the group's hourly budget; False (nothing spent)
    when it would exceed `per_hour`."""
    start, spent = owner.window_start, owner.window_advance
    if start is None or now - start >= WINDOW or now < start:
        start, spent = now, 0
    if spent + advance > per_hour:
        return False
    owner.window_start, owner.window_advance = start, spent + advance
    return True
