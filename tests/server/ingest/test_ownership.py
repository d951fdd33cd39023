"""One node's token must not reach beyond its node.

Every test posts real batches with real agent tokens through POST /api/v1/ingest.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from console.models import ConsistencyGroup, Device, Rank
from ingest.auth import issue_token
from ingest.models import AgentState, ContractViolation, DeviceSample, StepRecord
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_redis_budgets(settings):
    """The hourly new-group budget lives in Redis: give each test its own node ids' keys."""
    from ingest import ratelimit

    client = ratelimit._redis()
    for key in client.scan_iter("faultline:ingest-*"):
        client.delete(key)


def sample(gpu: str, index: int = 0) -> dict:
    return {"kind": "device_sample", "gpu": gpu, "index": index, "temp_c": 50.0}


def step(rank: int, n: int, *, group: str = "job", gen: int = 1) -> dict:
    return {"kind": "step", "group": group, "generation": gen, "rank": rank, "step": n,
            "tokens": 1, "duration_ms": 900.0}  # fmt: skip


def process(rank: int, event: str, *, group: str = "job", gen: int = 1, gpu: str = "") -> dict:
    rec = {"kind": "process", "group": group, "generation": gen, "rank": rank, "event": event}
    return {**rec, "gpu": gpu} if gpu else rec


def transition(to: str, *, group: str = "job", gen: int = 1) -> dict:
    return {"kind": "transition", "group": group, "generation": gen, "to_state": to}


def kinds() -> list[str]:
    return sorted(ContractViolation.objects.values_list("kind", flat=True))


# -- High 2: GPUs and ranks ----------------------------------------------------------------
def test_it_refuses_a_gpu_another_node_still_reports_and_records_the_claim(post_batch):
    assert post_batch(make_batch([sample("GPU-victim")], node="victim")).status_code == 202
    response = post_batch(make_batch([sample("GPU-victim"), sample("GPU-own", 1)], node="evil"))
    assert response.status_code == 202  # the rest of the batch is stored
    assert Device.objects.get(uuid="GPU-victim").node.name == "victim"
    assert Device.objects.get(uuid="GPU-own").node.name == "evil"
    assert DeviceSample.objects.filter(gpu="GPU-victim", node__name="evil").count() == 1
    violation = ContractViolation.objects.get(kind="device_claim")
    assert violation.subject == "node:evil" and violation.group is None  # about the claimant
    assert violation.evidence["claimed"] == "gpu:GPU-victim"


def test_it_lets_a_gpu_move_once_its_old_node_stopped_reporting_it(post_batch, settings):
    settings.INGEST_DEVICE_MOVE_AFTER_S = 60
    assert post_batch(make_batch([sample("GPU-m")], node="old")).status_code == 202
    Device.objects.filter(uuid="GPU-m").update(last_seen=datetime.now(UTC) - timedelta(seconds=120))
    assert post_batch(make_batch([sample("GPU-m")], node="new")).status_code == 202
    assert Device.objects.get(uuid="GPU-m").node.name == "new"
    assert kinds() == []


def test_it_bounds_the_gpus_one_node_may_add(post_batch, settings):
    settings.INGEST_MAX_GPUS_PER_NODE = 4
    invented = [sample(f"GPU-fake-{i}", i) for i in range(10)]
    assert post_batch(make_batch(invented, node="evil")).status_code == 202
    assert Device.objects.filter(node__name="evil").count() == 4
    assert ContractViolation.objects.filter(kind="device_limit").count() == 6
    # A later batch adds none either: the node is at its limit.
    assert post_batch(make_batch([sample("GPU-fake-99", 0)], node="evil")).status_code == 202
    assert Device.objects.filter(node__name="evil").count() == 4


def test_it_refuses_a_rank_placed_on_another_node_while_its_process_lives(post_batch):
    ok = make_batch([transition("running"), process(0, "started"), step(0, 1)], node="victim")
    assert post_batch(ok).status_code == 202
    assert (
        post_batch(make_batch([step(0, 2), process(0, "started")], node="evil")).status_code == 202
    )
    rank = Rank.objects.get(group__name="job", rank=0)
    assert rank.node.name == "victim" and rank.last_step == 1
    assert "rank_claim" in kinds()
    assert StepRecord.objects.filter(node__name="evil").count() == 1  # stored, not applied


def test_it_moves_a_rank_when_its_process_exited_on_the_old_node(post_batch):
    """Between the job's own nodes (a stranger may take no held rank: test_group_ownership)."""
    placed = make_batch([transition("running"), process(0, "started")], node="a")
    assert post_batch(placed).status_code == 202
    assert post_batch(make_batch([process(1, "started")], node="b")).status_code == 202
    assert post_batch(make_batch([process(0, "exited")], node="a")).status_code == 202
    assert post_batch(make_batch([process(0, "started"), step(0, 3)], node="b")).status_code == 202
    assert Rank.objects.get(group__name="job", rank=0).node.name == "b"
    assert "rank_claim" not in kinds()


# -- High 3: transitions -------------------------------------------------------------------
def test_it_refuses_a_transition_from_a_node_hosting_none_of_the_groups_ranks(post_batch):
    setup = make_batch([transition("running"), process(0, "started"), step(0, 1)], node="host")
    assert post_batch(setup).status_code == 202
    fence = make_batch([transition("completed", gen=2**31 - 1), sample("GPU-e")], node="evil")
    assert post_batch(fence).status_code == 202
    group = ConsistencyGroup.objects.get(name="job")
    assert (group.generation, group.state) == (1, "running")
    assert kinds() == ["unauthorized_transition"]
    assert Device.objects.filter(uuid="GPU-e").exists()  # the rest of the batch is stored
    # The real job is not a stale writer afterwards.
    assert post_batch(make_batch([step(0, 2)], node="host")).status_code == 202
    assert Rank.objects.get(group__name="job", rank=0).last_step == 2


def test_only_its_creator_may_transition_a_group_with_no_ranks_placed(post_batch):
    """Finding 3's hole: a group with no placement to check (a serving deployment, a job
    before its first rank) accepted a fence from any node."""
    created = make_batch([transition("running", group="svc")], node="creator")
    assert post_batch(created).status_code == 202
    assert ConsistencyGroup.objects.get(name="svc").created_by.name == "creator"
    fence = make_batch([transition("completed", group="svc", gen=900)], node="evil")
    assert post_batch(fence).status_code == 202
    group = ConsistencyGroup.objects.get(name="svc")
    assert (group.generation, group.state) == (1, "running")
    assert kinds() == ["unauthorized_transition"]
    # A group that only saw telemetry so far (a serving window, no rank) likewise.
    window = {"kind": "serving", "group": "svc2", "worker": "w0", "window": {"seconds": 10}}
    assert post_batch(make_batch([window], node="creator")).status_code == 202
    assert post_batch(make_batch([transition("stopped", group="svc2", gen=5)],
                                 node="evil")).status_code == 202  # fmt: skip
    assert ConsistencyGroup.objects.get(name="svc2").state != "stopped"
    # The creator may, and so may the group's launcher token.
    assert post_batch(make_batch([transition("recovering", group="svc", gen=2)],
                                 node="creator")).status_code == 202  # fmt: skip
    token = issue_token(node_name="launch-svc", launcher_group="svc")
    batch = make_batch([transition("running", group="svc", gen=3)], node="launch-svc")
    assert post_batch(batch, token=token).status_code == 202
    assert ConsistencyGroup.objects.get(name="svc").generation == 3


def test_a_group_with_no_creator_recorded_and_no_ranks_refuses_every_nodes_transition(
    post_batch,
):
    ConsistencyGroup.objects.create(name="legacy", generation=1, state="running")
    fence = make_batch([transition("completed", group="legacy", gen=2)], node="evil")
    assert post_batch(fence).status_code == 202
    assert ConsistencyGroup.objects.get(name="legacy").state == "running"
    assert kinds() == ["unauthorized_transition"]


def test_it_bounds_how_far_a_hosts_transition_may_move_the_generation(post_batch, settings):
    settings.INGEST_MAX_GENERATION_JUMP = 1000
    setup = make_batch([transition("running"), process(0, "started")], node="host")
    assert post_batch(setup).status_code == 202
    assert post_batch(make_batch([transition("running", gen=5000)], node="host")).status_code == 202
    assert ConsistencyGroup.objects.get(name="job").generation == 1
    assert kinds() == ["generation_jump"]
    assert post_batch(make_batch([transition("recovering", gen=2)], node="host")).status_code == 202
    assert ConsistencyGroup.objects.get(name="job").generation == 2


def test_it_accepts_a_launcher_tokens_transition_of_its_own_group_only(post_batch):
    setup = make_batch([transition("running"), process(0, "started")], node="host")
    assert post_batch(setup).status_code == 202
    other = make_batch([transition("running", group="other"), process(0, "started", group="other")],
                       node="host")  # fmt: skip
    assert post_batch(other).status_code == 202
    token = issue_token(node_name="launch-1", launcher_group="job")
    batch = make_batch(
        [transition("recovering", gen=2), transition("completed", group="other", gen=2)],
        node="launch-1",
    )
    response = post_batch(batch, token=token)  # another group's record: nothing of it stored
    assert response.status_code == 403
    assert 'record 1: a launcher token speaks for group "job" only' in response.json()["error"]
    assert ConsistencyGroup.objects.get(name="job").generation == 1
    batch = make_batch([transition("recovering", gen=2)], node="launch-1")
    assert post_batch(batch, token=token).status_code == 202
    assert ConsistencyGroup.objects.get(name="job").generation == 2
    assert ConsistencyGroup.objects.get(name="other").state == "running"
    assert kinds() == []


def test_it_issues_a_launcher_token_from_the_command_line(monkeypatch, capsys):
    from contextlib import nullcontext

    from faultline import bootstrap, cli
    from ingest.models import AgentCredential

    monkeypatch.setattr(bootstrap, "django_ready", lambda data_dir: nullcontext())
    args = cli.build_parser().parse_args(["token", "create", "launch-9", "--launcher", "job"])
    assert args.func(args) == 0
    assert "launcher of group job" in capsys.readouterr().out
    assert AgentCredential.objects.get(node__name="launch-9").launcher_group == "job"


# -- High 4: floods ------------------------------------------------------------------------
def test_it_caps_the_new_groups_one_node_may_create_an_hour(post_batch, settings):
    settings.INGEST_NEW_GROUPS_PER_HOUR = 5
    flood = [step(0, 1, group=f"fake-{i:04d}") for i in range(50)]
    assert post_batch(make_batch(flood, node="evil")).status_code == 202
    assert ConsistencyGroup.objects.filter(name__startswith="fake-").count() == 5
    violation = ContractViolation.objects.get(kind="new_group_limit")
    assert violation.subject == "node:evil" and violation.evidence["refused"] == 45
    again = [step(0, 1, group=f"more-{i}") for i in range(3)]
    assert post_batch(make_batch(again, node="evil")).status_code == 202
    assert not ConsistencyGroup.objects.filter(name__startswith="more-").exists()
    # Another node's budget is its own, and a known group is never refused.
    assert post_batch(make_batch([step(0, 1, group="real")], node="good")).status_code == 202
    assert ConsistencyGroup.objects.filter(name="real").exists()
    assert post_batch(make_batch([step(0, 2, group="fake-0000")], node="evil")).status_code == 202


def test_it_rate_limits_records_not_only_batches(post_batch, settings):
    settings.INGEST_RECORDS_PER_MIN = 300
    big = [sample(f"GPU-r{i % 4}", i % 4) for i in range(200)]
    assert post_batch(make_batch(big, node="busy")).status_code == 202
    response = post_batch(make_batch(big, node="busy"))
    assert response.status_code == 429
    assert "record rate" in response.json()["error"]
    assert response["Retry-After"] == "60"


# -- Medium 5: agent ids -------------------------------------------------------------------
def test_it_refuses_a_batch_naming_another_nodes_agent_id(post_batch):
    first = make_batch([sample("GPU-v")], node="victim", agent_id="agent-victim", seq=1)
    assert post_batch(first).status_code == 202
    hijack = make_batch([sample("GPU-x")], node="evil", agent_id="agent-victim", seq=10**9)
    response = post_batch(hijack)
    assert response.status_code == 403
    assert "belongs to another node" in response.json()["error"]
    # The victim's next batches are stored, not acknowledged as duplicates.
    nxt = make_batch([sample("GPU-v")], node="victim", agent_id="agent-victim", seq=2)
    assert post_batch(nxt).json()["duplicate"] is False
    state = AgentState.objects.get(agent_id="agent-victim")
    assert (state.node.name, state.batches, state.last_seq) == ("victim", 2, 2)
    assert not Device.objects.filter(uuid="GPU-x").exists()


# -- High 4: established groups are diagnosed ahead of young ones ---------------------------
def test_it_diagnoses_established_groups_ahead_of_a_flood_of_new_ones(
    post_batch, settings, monkeypatch
):
    from console import scheduling

    settings.INGEST_NEW_GROUPS_PER_HOUR = 100
    settings.DIAGNOSIS_YOUNG_PER_S = 3
    settings.DIAGNOSIS_YOUNG_DEBOUNCE_MS = 5000
    queued: list[tuple[str, float]] = []
    monkeypatch.setattr(
        scheduling, "enqueue", lambda name, group, countdown=None: queued.append((group, countdown))
    )
    # One budget second for the whole test: under CI load the flood's batch crossed a
    # second boundary and got a fresh budget (6 queued, not 3).
    clock = SimpleNamespace(time=lambda: 1_000_000.0, monotonic=time.monotonic)
    monkeypatch.setattr(scheduling, "time", clock)
    ConsistencyGroup.objects.create(name="real", generation=1)  # an established group
    flood = [step(0, 1, group=f"new-{i:03d}") for i in range(30)]
    assert post_batch(make_batch(flood, node="evil")).status_code == 202
    assert post_batch(make_batch([step(0, 1, group="real")], node="good")).status_code == 202
    young = [c for g, c in queued if g.startswith("new-")]
    assert len(young) == 3  # evil's budget a second; the next batch or the sweep retries
    assert all(c == settings.DIAGNOSIS_YOUNG_DEBOUNCE_MS / 1000 for c in young)
    assert ("real", settings.DIAGNOSIS_DEBOUNCE_MS / 1000) in queued


def _budget_second(settings, monkeypatch, *, per_s: int) -> tuple[list[str], SimpleNamespace]:
    """Young groups' diagnoses at `per_s` a node, queued groups recorded, and the budget's
    clock held in one second (`clock.time` moves it on): under CI load a batch crossed a
    second boundary and got a fresh budget."""
    from console import live, scheduling

    live.forget_recent()
    scheduling.forget_recent()
    settings.INGEST_NEW_GROUPS_PER_HOUR = 100
    settings.DIAGNOSIS_YOUNG_PER_S = per_s
    queued: list[str] = []
    monkeypatch.setattr(
        scheduling, "enqueue", lambda name, group, countdown=None: queued.append(group)
    )
    clock = SimpleNamespace(time=lambda: 1_000_000.0, monotonic=time.monotonic)
    monkeypatch.setattr(scheduling, "time", clock)
    return queued, clock


def test_a_flood_of_new_groups_leaves_another_nodes_new_job_its_own_budget(
    post_batch, settings, monkeypatch
):
    """A real job created after a flood is young too: one node's invented groups must not
    spend its diagnosis budget (a shared one left its first Xid to the sweep, 8.6 s)."""
    from django.core.cache import cache

    from console import scheduling

    # Within one budget second: the flood spends evil's budget, then the new job arrives.
    queued, _ = _budget_second(settings, monkeypatch, per_s=3)
    flood = [step(0, 1, group=f"new-{i:03d}") for i in range(30)]
    assert post_batch(make_batch(flood, node="evil")).status_code == 202
    assert len([g for g in queued if g.startswith("new-")]) == 3
    job = [transition("running", group="newjob"), process(0, "started", group="newjob")]
    assert post_batch(make_batch(job, node="good")).status_code == 202
    assert "newjob" in queued
    # A group refused by its node's budget is not held off until its debounce key expires:
    # the next batch (or the sweep) may queue it once the budget is back.
    refused = sorted({f"new-{i:03d}" for i in range(30)} - set(queued))
    assert refused and all(cache.get(scheduling.pending_key(g)) is None for g in refused)


def test_a_nodes_idle_young_groups_swept_every_second_leave_its_new_job_its_budget(
    post_batch, settings, monkeypatch
):
    """A node's twelve earlier jobs of the last ten minutes, idle now (still `running`: no
    scheduler said they ended), are swept every second. Sharing one budget, the sweep spent
    all of it at the top of each second and the node's newest job was never diagnosed
    (the drill's 22nd row: its partition not named in 25 s, "active findings: none")."""
    from console import scheduling
    from console.tasks import sweep

    queued, clock = _budget_second(settings, monkeypatch, per_s=10)
    old = [transition("running", group=f"old-{i:02d}") for i in range(12)]
    assert post_batch(make_batch(old, node="busy")).status_code == 202
    from django.core.cache import cache

    for g in {f"old-{i:02d}" for i in range(12)}:
        cache.delete(scheduling.pending_key(g))  # their runs started
    queued.clear()
    clock.time = lambda: 1_000_001.0  # the next second: the sweep goes first
    scheduling.forget_recent()
    sweep()
    swept = [g for g in queued if g.startswith("old-")]
    assert len(swept) == 5  # the sweep's own budget: half the node's
    job = [transition("running", group="newest"), process(0, "started", group="newest")]
    assert post_batch(make_batch(job, node="busy")).status_code == 202
    assert "newest" in queued


def test_the_sweep_judges_the_most_recently_active_groups_first() -> None:
    """The sweep's young budget is spent in this order: in table order a node's long idle
    jobs spent it every second and its newest job's hang (silence: only the sweep judges
    it) was never diagnosed (the drill's long_kernel row, in every whole-matrix run)."""
    import random
    from datetime import UTC, datetime, timedelta

    from console import pipeline

    now = datetime.now(UTC)
    ages = list(range(12))
    random.Random(5).shuffle(ages)  # created in one order, active in another
    for i, age in enumerate(ages):
        ConsistencyGroup.objects.create(
            name=f"sw-{i:02d}", generation=1, last_activity=now - timedelta(seconds=10 + age)
        )
    got = pipeline.groups_to_sweep(now=now, window=timedelta(minutes=30))
    want = [f"sw-{i:02d}" for i in sorted(range(12), key=lambda i: ages[i])]
    assert got == want


class _Captured:
    """The demo's fleet as seen by ingest: every record a rank's reporter sends, in order,
    with the node whose agent would ship it."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict]] = []
        self.spares = ["spare-1"]

    def reporter(self, node: str, **kwargs):
        from agents.reporter import Reporter

        sent = self.sent

        class Capture(Reporter):
            def _send(self, rec: dict) -> None:
                sent.append((node, dict(rec)))

        return Capture(socket_path="/nonexistent", **kwargs)

    def drain(self, post_batch) -> None:
        """Post what was sent, one batch per run of records from the same node."""
        while self.sent:
            node = self.sent[0][0]
            run = []
            while self.sent and self.sent[0][0] == node:
                run.append(self.sent.pop(0)[1])
            assert post_batch(make_batch(run, node=node)).status_code == 202


def test_the_demos_node_replacement_announces_its_new_generation_from_a_surviving_host(
    post_batch, monkeypatch
):
    """`faultline demo` replaced rank 0's node with a spare and announced the new
    generation from the spare, which hosted nothing yet: a false `unauthorized_transition`
    incident, and the new generation never started."""
    import random

    from faultline.demo import training
    from faultline.demo.scenario import Slot

    monkeypatch.setattr(training.time, "sleep", lambda s: None)
    fleet = _Captured()
    slots = [Slot("host-a", 0), Slot("host-a", 1), Slot("host-b", 0), Slot("host-b", 1)]
    job = training.TrainGroup("train-x", slots, fleet, random.Random(7))  # type: ignore[arg-type]  # the capture stands in for Fleet
    job.tick(0.0)
    fleet.drain(post_batch)
    assert ConsistencyGroup.objects.get(name="train-x").generation == 1
    job.restart("xid", without="host-a")  # rank 0's node
    job.tick(0.0)
    fleet.drain(post_batch)
    group = ConsistencyGroup.objects.get(name="train-x")
    assert (group.generation, group.state) == (2, "running")
    assert kinds() == []
    assert Rank.objects.get(group=group, rank=0).node.name == "spare-1"
    # Its next restart is announced by the spare, which now hosts rank 0.
    job.restart("again")
    fleet.drain(post_batch)
    assert ConsistencyGroup.objects.get(name="train-x").generation == 3
    assert kinds() == []


def test_a_job_announced_by_rank_0s_node_after_its_peers_placed_their_ranks_starts(post_batch):
    """`faultline demo` at every job start: the peers' agents delivered their ranks'
    `started` first, so rank 0's node (which starts rank 0 and announces the job in one
    batch) hosted nothing yet and its `running` (world size, job id, objectives) was
    refused as an `unauthorized_transition`."""
    assert post_batch(make_batch([process(1, "started")], node="peer")).status_code == 202
    announce = make_batch([process(0, "started"), transition("running")], node="rank0")
    assert post_batch(announce).status_code == 202
    assert ConsistencyGroup.objects.get(name="job").state == "running"
    assert kinds() == []
    # A stranger may not do the same by claiming a rank whose process still lives.
    fence = make_batch([process(1, "started"), transition("completed", gen=2)], node="evil")
    assert post_batch(fence).status_code == 202
    group = ConsistencyGroup.objects.get(name="job")
    assert (group.generation, group.state) == (1, "running")
    assert kinds() == ["rank_claim", "unauthorized_transition"]
