"""A group belongs to its job: its launcher and the nodes that host it (docs/security.md,
"Who owns a group"). Every test posts real batches with real tokens through
POST /api/v1/ingest on the real Postgres; each names the finding it closes.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import hypothesis
import pytest
import time_machine
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from console.models import ConsistencyGroup, Incident, Rank
from ingest.auth import issue_token
from ingest.models import ContractViolation, ProcessRecord, StepRecord, TransitionRecord
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db

EVIL = "evil"
_JOBS = itertools.count(700_001)  # Slurm job ids, one per property example


@pytest.fixture(autouse=True)
def _fresh_redis_budgets():
    """The hourly new-group budget lives in Redis: give each test its own."""
    from ingest import ratelimit

    client = ratelimit._redis()
    for key in client.scan_iter("faultline:ingest-*"):
        client.delete(key)


def process(rank: int, event: str = "started", *, group: str = "job", gen: int = 0, **kw) -> dict:
    return {"kind": "process", "group": group, "generation": gen, "rank": rank, "event": event,
            **kw}  # fmt: skip


def step(rank: int, n: int, *, group: str = "job", gen: int = 0) -> dict:
    return {"kind": "step", "group": group, "generation": gen, "rank": rank, "step": n,
            "tokens": 1, "duration_ms": 900.0}  # fmt: skip


def transition(to: str, *, group: str = "job", gen: int = 0, **kw) -> dict:
    return {"kind": "transition", "group": group, "generation": gen, "to_state": to, **kw}


def heartbeat(jobs: list[str] | None) -> dict:
    rec: dict = {"kind": "heartbeat", "uptime_s": 1.0}
    if jobs is not None:
        rec["jobs"] = jobs
    return rec


def send(post_batch, records: list[dict], node: str, token: str | None = None) -> None:
    response = post_batch(make_batch(records, node=node), token=token)
    assert response.status_code == 202, response.content


def group(name: str = "job") -> ConsistencyGroup:
    return ConsistencyGroup.objects.get(name=name)


def claims_of(node: str) -> list[str]:
    """The refusals recorded about `node`: evidence about the claimant, never its victim."""
    rows = ContractViolation.objects.filter(subject=f"node:{node}")
    assert all(v.group_id is None for v in rows)
    return sorted(rows.values_list("kind", flat=True))


def group_violations(name: str = "job") -> list[str]:
    return sorted(ContractViolation.objects.filter(group__name=name).values_list("kind", flat=True))


def start_job(post_batch, *, hosts=("host-a", "host-b"), per_host: int = 2, gen: int = 0,
              name: str = "job", world: bool = True) -> None:  # fmt: skip
    """A real job: each host starts its ranks, rank 0's host announces `running`."""
    size = len(hosts) * per_host
    for i, host in enumerate(reversed(hosts)):  # rank 0's host last, as agents deliver
        ranks = range((len(hosts) - 1 - i) * per_host, (len(hosts) - i) * per_host)
        records = [process(r, group=name, gen=gen) for r in ranks]
        records += [step(r, 1, group=name, gen=gen) for r in ranks]
        if host == hosts[0]:
            extra = {"world_size": size} if world else {}
            records.append(transition("running", group=name, gen=gen, **extra))
        send(post_batch, records, host)
    assert group(name).state == "running"


def later(minutes: float = 30):
    """Past the first generation's rendezvous (docs/security.md)."""
    return time_machine.travel(datetime.now(UTC) + timedelta(minutes=minutes), tick=True)


def chain(start: int, moves: int, jump: int = 1000, *, name: str = "job") -> list[dict]:
    return [transition("running", group=name, gen=start + jump * (i + 1)) for i in range(moves)]


# -- High 2: a stranger's rank, then a chain of transitions ------------------------------
@pytest.mark.parametrize("shape", ["one_batch", "claim_then_chain", "chain_over_batches"])
@pytest.mark.parametrize("world", [True, False])
def test_a_node_that_places_a_rank_nobody_held_cannot_fence_the_job(post_batch, shape, world):
    """The review's chain: a rank nobody held (one past the world, or any number once the
    rendezvous closed), then 2,000 transitions of +1,000 moved generation 0 to 2,000,000."""
    start_job(post_batch, world=world)
    with later():
        claim = [process(4), process(900_000), step(4, 1)]
        moves = chain(0, 2000)
        if shape == "one_batch":
            batches = [claim + moves]
        elif shape == "claim_then_chain":
            batches = [claim, moves]
        else:
            batches = [claim] + [moves[i : i + 100] for i in range(0, 2000, 100)]
        for records in batches:
            send(post_batch, records, EVIL)
        assert group().generation == 0
        assert not Rank.objects.filter(group__name="job", node__name=EVIL).exists()
        assert set(claims_of(EVIL)) == {"rank_claim", "unauthorized_transition"}
        assert group_violations() == []
        # The real job goes on, and its own restart is not refused.
        send(post_batch, [transition("recovering", gen=1)], "host-a")
        assert group().generation == 1


def test_a_node_may_join_the_first_generations_rendezvous_while_it_is_open(post_batch):
    """The other side of the rendezvous: a job's late peer (its agent delivered after rank
    0's announced the job) still places its ranks and is not refused."""
    start_job(post_batch, hosts=("host-a",), world=False)
    late = [process(2), process(3), step(2, 1)]
    send(post_batch, late, "host-c")
    assert Rank.objects.get(group__name="job", rank=3).node.name == "host-c"
    assert claims_of("host-c") == []


def test_a_rank_beyond_the_declared_world_is_refused_even_while_the_rendezvous_is_open(
    post_batch,
):
    start_job(post_batch)  # world size 4
    send(post_batch, [process(4), transition("failed", gen=1)], EVIL)
    assert not Rank.objects.filter(group__name="job", rank=4).exists()
    assert group().generation == 0
    assert set(claims_of(EVIL)) == {"rank_claim", "unauthorized_transition"}


def test_a_groups_generation_moves_are_rate_limited_even_from_its_own_hosts(post_batch):
    start_job(post_batch)
    send(post_batch, chain(0, 2), "host-a")  # +1000, +1000
    assert group().generation == 1000
    assert claims_of("host-a") == ["generation_rate"]
    # +1: the hour's budget is spent, in one batch or the next.
    send(post_batch, [transition("running", gen=1001)], "host-a")
    assert group().generation == 1000
    assert claims_of("host-a") == ["generation_rate", "generation_rate"]
    with later(61):
        send(post_batch, [transition("running", gen=1001)], "host-a")
        assert group().generation == 1001
    # Another group's budget is its own.
    start_job(post_batch, name="other", hosts=("host-c",))
    send(post_batch, chain(0, 1, name="other"), "host-c")
    assert group("other").generation == 1000


# -- High 2: the first node to report a rank after a generation change ---------------------
@pytest.mark.parametrize("before_transition", [True, False])
@pytest.mark.parametrize("rank", [0, 3])
def test_a_foreign_node_cannot_take_a_rank_after_a_generation_change(
    post_batch, rank, before_transition
):
    start_job(post_batch)
    grab = [process(rank, gen=1), step(rank, 1, gen=1)]
    if before_transition:
        send(post_batch, grab, EVIL)
    send(post_batch, [transition("running", gen=1)], "host-a")
    send(post_batch, grab, EVIL)
    assert Rank.objects.get(group__name="job", rank=rank).node.name != EVIL
    # The job's own hosts re-place it in the new generation (ranks may move between them).
    mine = "host-b" if rank == 0 else "host-a"
    send(post_batch, [process(rank, gen=1)], mine)
    placed = Rank.objects.get(group__name="job", rank=rank)
    assert (placed.node.name, placed.generation) == (mine, 1)
    assert claims_of(EVIL) == ["rank_claim"]
    assert group_violations() == []


def test_a_host_declares_the_new_generations_nodes_and_a_replacement_takes_its_ranks(
    post_batch,
):
    """A node replaced by a spare (the demo, torchrun with a new node): the new generation's
    rendezvous is declared by a host of the old one; an undeclared node is still refused."""
    start_job(post_batch)
    declare = transition("running", gen=1, nodes=["host-b", "spare-1"])
    send(post_batch, [declare], "host-b")
    spare = [process(0, gen=1), process(1, gen=1), step(0, 5, gen=1)]
    send(post_batch, spare, "spare-1")
    assert Rank.objects.get(group__name="job", rank=0).node.name == "spare-1"
    send(post_batch, [process(2, gen=1)], "host-a")
    assert Rank.objects.get(group__name="job", rank=2).node.name == "host-b"  # not declared
    assert claims_of("host-a") == ["rank_claim"]
    # Its old process of generation 0, still writing: the group's split brain, not a claim.
    with later(1):
        send(post_batch, [step(1, 9, gen=0)], "host-a")
    assert group_violations() == ["split_brain"]
    # A stranger's declaration is not one.
    sneaky = transition("running", gen=2, nodes=[EVIL])
    send(post_batch, [sneaky], EVIL)
    send(post_batch, [process(0, gen=2)], EVIL)
    assert group().generation == 1
    assert Rank.objects.get(group__name="job", rank=0).node.name == "spare-1"


# -- High 2: a name squatted ahead of its job --------------------------------------------
@pytest.mark.parametrize("by", ["transition", "rank"])
def test_a_group_cannot_be_created_at_a_generation_beyond_the_jump_bound(post_batch, by):
    top = 2**31 - 1
    squat = transition("completed", gen=top) if by == "transition" else process(0, gen=top)
    send(post_batch, [squat], EVIL)
    assert group().generation == 0
    assert claims_of(EVIL) == ["generation_jump"]
    start_job(post_batch)
    assert Rank.objects.get(group__name="job", rank=0).node.name == "host-a"


def test_a_name_announced_before_its_job_placed_a_rank_goes_to_the_jobs_ranks(post_batch):
    """Squat, then wait: a transition alone (no rank) does not hold a name; the first
    generation's rendezvous is the ranks' nodes, at their generation."""
    send(post_batch, [transition("running", gen=900)], EVIL)
    with later(60):
        start_job(post_batch)
        assert (group().generation, group().state) == (0, "running")
        send(post_batch, [transition("completed", gen=901)], EVIL)
        assert (group().generation, group().state) == (0, "running")
        assert "unauthorized_transition" in claims_of(EVIL)
        assert group_violations() == []


def test_a_name_squatted_ahead_of_its_slurm_job_goes_to_the_nodes_that_run_the_job(post_batch):
    """The job's group is named after its Slurm job id (the zero-configuration default): a
    node that squatted the name (with a rank, at a high generation) loses it to the nodes
    whose agents attest the job."""
    squat = [process(0, group="4242", gen=999), step(0, 1, group="4242", gen=999)]
    send(post_batch, squat, EVIL)
    with later(60):
        real = [heartbeat(["4242"]), process(0, group="4242", job="4242"),
                transition("running", group="4242", job="4242", world_size=1)]  # fmt: skip
        send(post_batch, real, "host-a")
        g = group("4242")
        assert (g.generation, g.state, g.scheduler_job) == (0, "running", "4242")
        assert Rank.objects.get(group=g, rank=0).node.name == "host-a"
        send(post_batch, [step(0, 2, group="4242", gen=999)], EVIL)
        send(post_batch, [transition("failed", group="4242", gen=1)], EVIL)
        assert group("4242").state == "running"
        assert group_violations("4242") == []


def test_a_squatted_name_is_reclaimed_by_its_launcher(post_batch):
    """A name without a scheduler job (a bare torchrun) belongs to its first rendezvous; a
    stranger that got there first is removed by the group's launcher token."""
    squat = [process(0, gen=500), step(0, 1, gen=500)]
    send(post_batch, squat, EVIL)
    with later(60):
        token = issue_token(node_name="launcher", launcher_group="job")
        reclaim = transition("initializing", gen=0, nodes=["host-a", "host-b"])
        send(post_batch, [reclaim], "launcher", token)
        start_job(post_batch)
        assert group().generation == 0
        assert Rank.objects.get(group__name="job", rank=0).node.name == "host-a"
        send(post_batch, [step(0, 2, gen=500)], EVIL)
        assert Rank.objects.get(group__name="job", rank=0).node.name == "host-a"


# -- High 2: a group bound to its scheduler job --------------------------------------------
def _slurm_job(post_batch, job: str = "77") -> None:
    """Ranks 0-1 on host-a, 2-3 on host-b; both agents attest Slurm job `job`."""
    for host, ranks in (("host-b", (2, 3)), ("host-a", (0, 1))):
        records = [heartbeat([job, "5"])]
        records += [process(r, job=job) for r in ranks]
        if host == "host-a":
            records.append(transition("running", job=job, world_size=4))
        send(post_batch, records, host)
    assert group().scheduler_job == job


@pytest.mark.parametrize("evil_attests", [None, [], ["99"]])
def test_a_group_bound_to_a_slurm_job_takes_ranks_and_transitions_only_from_its_nodes(
    post_batch, evil_attests
):
    _slurm_job(post_batch)
    # Within the rendezvous window and below the world size: attestation decides.
    grab = [heartbeat(evil_attests), process(3, gen=1), transition("running", gen=1)]
    send(post_batch, grab, EVIL)
    send(post_batch, [process(1, gen=0)], EVIL)
    assert group().generation == 0
    assert not Rank.objects.filter(group__name="job", node__name=EVIL).exists()
    assert set(claims_of(EVIL)) == {"rank_claim", "unauthorized_transition"}


def test_a_requeued_slurm_job_moves_to_new_nodes_that_attest_it(post_batch):
    """Requeued onto other nodes: they attest the job, so they take its ranks in the new
    generation without any declaration; a node whose allocation ended is out."""
    _slurm_job(post_batch)
    send(post_batch, [transition("recovering", gen=1)], "host-a")
    moved = [heartbeat(["77"]), process(0, gen=1), process(1, gen=1), step(0, 3, gen=1)]
    send(post_batch, moved, "host-c")
    assert Rank.objects.get(group__name="job", rank=0).node.name == "host-c"
    send(post_batch, [heartbeat(["5"])], "host-b")  # its allocation of job 77 ended
    send(post_batch, [process(2, gen=1), transition("failed", gen=2)], "host-b")
    assert group().generation == 1
    assert Rank.objects.get(group__name="job", rank=2).generation == 0  # not re-placed
    assert set(claims_of("host-b")) == {"rank_claim", "unauthorized_transition"}


# -- Medium 5: who sets a group's scheduler job -----------------------------------------
@pytest.mark.parametrize(
    ("via", "claims", "wait"),
    [
        ([process(1, job="31337")], ["rank_claim"], False),  # rank 1 is held: not applied
        ([transition("running", job="31337")], ["unauthorized_transition"], False),
        ([process(9), process(9, job="31337")], ["rank_claim"], True),  # rendezvous closed
        ([process(4, job="31337")], ["rank_claim"], False),  # beyond the world
    ],
    ids=["process", "transition", "claim_then_process", "beyond_world"],
)
def test_only_the_groups_hosts_or_launcher_set_its_job(post_batch, via, claims, wait):
    """A node hosting no rank set a group's Slurm job id (restart_group's target)."""
    start_job(post_batch)
    if wait:
        with later():
            send(post_batch, via, EVIL)
    else:
        send(post_batch, via, EVIL)
    assert group().scheduler_job == ""
    assert claims_of(EVIL) == claims
    # The job's host may, and so may its launcher.
    send(post_batch, [process(0, job="1234")], "host-a")
    assert group().scheduler_job == "1234"
    token = issue_token(node_name="launcher", launcher_group="job")
    send(post_batch, [transition("running", job="1235")], "launcher", token)
    assert group().scheduler_job == "1235"
    assert group_violations() == []


def test_a_host_that_attests_its_jobs_may_not_name_a_job_it_does_not_run(post_batch):
    _slurm_job(post_batch)
    lie = [heartbeat(["77"]), process(0, job="31337")]
    send(post_batch, lie, "host-a")
    assert group().scheduler_job == "77"
    assert claims_of("host-a") == ["job_claim"]


# -- Medium 6: a refused claim is evidence about the claimant, not the victim ------------
@pytest.mark.parametrize(
    "claim",
    [
        [process(0), step(0, 9)],  # a rank another node holds
        [process(4), transition("failed", gen=1)],  # claim, then fence
        [transition("completed", gen=1)],  # a fence from nowhere
        [step(0, 1, gen=0), transition("running", gen=5000)],  # a jump
        [process(1, job="31337")],  # a job id
    ],
    ids=["rank", "claim_then_fence", "fence", "jump", "job"],
)
def test_a_refused_claim_opens_no_incident_on_the_victim_group(post_batch, claim):
    from console import pipeline

    start_job(post_batch)
    send(post_batch, claim, EVIL)
    assert claims_of(EVIL)
    pipeline.diagnose(group_name="job", now=datetime.now(UTC))
    assert not Incident.objects.filter(group__name="job").exists()
    assert group_violations() == []


def test_a_stale_generation_from_a_stranger_is_its_claim_not_the_groups_split_brain(post_batch):
    start_job(post_batch)
    send(post_batch, [transition("running", gen=1)], "host-a")
    with later(1):
        send(post_batch, [step(0, 50, gen=0)], EVIL)
    assert group_violations() == []
    assert claims_of(EVIL) == ["rank_claim"]
    # The job's own stale writer still is split brain.
    with later(1):
        send(post_batch, [step(2, 50, gen=0)], "host-b")
    assert group_violations() == ["split_brain"]


@pytest.mark.parametrize("wait", [False, True], ids=["rendezvous_open", "rendezvous_closed"])
def test_a_strangers_progress_stamped_past_a_later_fence_is_not_the_groups_split_brain(
    post_batch, wait
):
    """A stranger stores old-generation steps stamped ahead (within the allowed clock
    skew) before the job's real restart: the fence must not read them as the job's own
    progress written past it (they are stored as not applied)."""
    start_job(post_batch)
    with later(30 if wait else 0):
        ahead = (datetime.now(UTC) + timedelta(seconds=120)).isoformat()
        forged = [{**step(r, 99), "ts": ahead} for r in (0, 2)]
        forged.append({"kind": "checkpoint", "ts": ahead, "group": "job", "generation": 0,
                       "checkpoint_id": "c99", "step": 99, "phase": "committed"})  # fmt: skip
        send(post_batch, forged, EVIL)
        assert StepRecord.objects.filter(node__name=EVIL, stale=False).count() == 0
        send(post_batch, [transition("recovering", gen=1)], "host-a")
    assert group().generation == 1
    assert group_violations() == []
    assert claims_of(EVIL) == ["rank_claim"]


def test_records_a_stranger_sends_are_stored_as_telemetry(post_batch):
    start_job(post_batch)
    with later():
        send(post_batch, [process(7), transition("failed", gen=3)], EVIL)
    assert ProcessRecord.objects.filter(node__name=EVIL).count() == 1
    assert TransitionRecord.objects.filter(node__name=EVIL).count() == 1


# -- the space: any interleaving of a stranger's moves with a Slurm job's own batches ------
def _stranger_moves(name: str) -> list[list[dict]]:
    """What a stranger's token tried in the review, each a batch: a rank nobody held, then
    fences and jumps; a held rank; a stale write; the job id; a squat at a high generation."""
    return [
        [heartbeat(["99"]), process(1, group=name), step(1, 1, group=name)],
        [transition("running", group=name, gen=5), transition("failed", group=name, gen=900)],
        [process(9, group=name, gen=3), step(0, 7, group=name, gen=0)],
        [process(2, group=name, job="31337"), transition("completed", group=name, job=name)],
        [transition("completed", group=name, gen=2**31 - 1)],
    ]


def _job_batches(name: str) -> list[tuple[str, list[dict]]]:
    """The job's own nodes, its group named after its Slurm job id (zero configuration)."""
    return [
        ("host-b", [heartbeat([name]), process(2, group=name, job=name),
                    process(3, group=name, job=name), step(2, 1, group=name)]),
        ("host-a", [heartbeat([name]), process(0, group=name, job=name),
                    process(1, group=name, job=name), step(0, 1, group=name),
                    transition("running", group=name, job=name, world_size=4)]),
    ]  # fmt: skip


@hypothesis.settings(
    max_examples=25,
    deadline=None,
    # Each example names a group of its own: state carried between examples is harmless.
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(order=st.permutations(list(range(7))), data=st.data())
def test_a_stranger_cannot_take_a_slurm_jobs_group_in_any_order_of_its_moves(
    post_batch, order, data, settings
):
    """Permutations of the job's two batches with the stranger's five, each stranger move
    in one batch or several: the job ends up with its ranks, its generation, its job id,
    and no violation of its own, whichever came first."""
    settings.INGEST_NEW_GROUPS_PER_HOUR = 10_000
    name = f"{next(_JOBS)}"
    moves = [(EVIL, b) for b in _stranger_moves(name)] + _job_batches(name)
    for i in order:
        node, records = moves[i]
        if node == EVIL and len(records) > 1 and data.draw(st.booleans()):
            for record in records:  # the same move, record by record
                send(post_batch, [record], node)
        else:
            send(post_batch, records, node)
    g = group(name)
    assert (g.generation, g.state, g.scheduler_job, g.owner_job) == (0, "running", name, name)
    placed = dict(Rank.objects.filter(group=g).values_list("rank", "node__name"))
    assert placed == {0: "host-a", 1: "host-a", 2: "host-b", 3: "host-b"}
    assert group_violations(name) == []
    send(post_batch, [transition("recovering", group=name, gen=1)], "host-a")
    assert group(name).generation == 1
