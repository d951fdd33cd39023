"""ingest.ownership's rules as a table, without a database: who places a rank, who may
transition, how far a generation moves in an hour (the integration tests are
test_group_ownership.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ingest import ownership as o

NOW = datetime(2026, 12, 7, 12, tzinfo=UTC)
ME = o.Claimant(node_id=1, node="me")


def owner(**kw: object) -> o.Owner:
    base: dict = {"owner_job": "", "member": False, "has_members": True,
                  "rendezvous_until": NOW - timedelta(seconds=1), "world_size": 4,
                  "created_by_id": None}  # fmt: skip
    return o.Owner(**{**base, **kw})


def old(node: int, generation: int = 0, state: str = "started") -> dict:
    return {"node_id": node, "generation": generation, "process_state": state}


OPEN = {"rendezvous_until": NOW + timedelta(seconds=60)}


@pytest.mark.parametrize(
    ("kw", "who", "rank", "generation", "held", "placed"),
    [
        ({"member": True}, ME, 0, 0, None, True),  # a host: a rank nobody holds
        ({"member": True}, ME, 0, 1, old(2), True),  # a host: a new generation re-places
        ({"member": True}, ME, 0, 0, old(2), False),  # a host: another host's live rank
        ({"member": True}, ME, 0, 0, old(2, state="exited"), True),
        ({}, ME, 0, 1, old(2), False),  # not a host: never a held rank, new generation or not
        ({}, ME, 0, 0, old(2, state="exited"), False),
        ({}, ME, 3, 0, None, False),  # not a host, rendezvous closed: not even a free rank
        (OPEN, ME, 3, 0, None, True),  # the rendezvous is open: a free rank below the world
        (OPEN, ME, 4, 0, None, False),  # beyond the declared world
        ({**OPEN, "world_size": None}, ME, 900, 0, None, True),  # no world declared yet
        ({**OPEN, "rendezvous_until": None, "has_members": False}, ME, 0, 0, None, True),
        ({"owner_job": "77"}, o.Claimant(1, "me", attested=frozenset({"77"})), 0, 1, old(2), True),
        ({"owner_job": "77", **OPEN}, o.Claimant(1, "me", attested=frozenset({"5"})), 0, 0,
         None, False),  # bound: no rendezvous, attestation only
        ({"owner_job": "77"}, ME, 0, 0, None, False),  # bound, and it attests nothing
    ],
)  # fmt: skip
def test_who_places_a_rank(kw, who, rank, generation, held, placed):
    assert o.may_place(owner(**kw), who, rank, generation, held, NOW) is placed


@pytest.mark.parametrize(
    ("kw", "who", "places_here", "allowed"),
    [
        ({"member": True}, ME, False, True),
        ({}, ME, False, False),
        ({}, ME, True, True),
        ({}, o.Claimant(1, "me", launcher_group="job"), False, True),
        ({}, o.Claimant(1, "me", launcher_group="other"), False, False),
        ({"has_members": False, "created_by_id": 1}, ME, False, True),  # creator, nothing placed
        ({"has_members": True, "created_by_id": 1}, ME, False, False),  # placed: hosts only
        ({"owner_job": "77", "has_members": False, "created_by_id": 1}, ME, False, False),
    ],
)
def test_who_may_transition(kw, who, places_here, allowed):
    assert o.may_transition(owner(**kw), who, group="job", places_here=places_here) is allowed


def test_a_groups_generation_budget_is_per_hour_and_spent_only_when_granted():
    own = owner()
    assert o.within_budget(own, 600, NOW, per_hour=1000)
    assert not o.within_budget(own, 401, NOW + timedelta(minutes=10), per_hour=1000)
    assert own.window_advance == 600  # a refused move spends nothing
    assert o.within_budget(own, 400, NOW + timedelta(minutes=59), per_hour=1000)
    assert not o.within_budget(own, 1, NOW + timedelta(minutes=59, seconds=59), per_hour=1000)
    assert o.within_budget(own, 1000, NOW + timedelta(hours=1), per_hour=1000)  # a new hour
    assert not o.within_budget(own, 1001, NOW + timedelta(hours=3), per_hour=1000)


@pytest.mark.parametrize(
    ("attested", "job", "kw", "allowed"),
    [
        (None, "77", {}, True),  # no scheduler to ask: a host names the job
        (frozenset({"77"}), "77", {}, True),
        (frozenset({"5"}), "77", {}, False),  # its agent attests jobs, not this one
        (frozenset({"77", "78"}), "78", {"owner_job": "77"}, False),  # bound to another
    ],
)
def test_a_host_names_only_a_job_it_runs(attested, job, kw, allowed):
    who = o.Claimant(1, "me", attested=attested)
    assert o.may_set_job(owner(**kw), who, job, group="job", host=True) is allowed
    assert o.may_set_job(owner(**kw), who, job, group="job", host=False) is False
