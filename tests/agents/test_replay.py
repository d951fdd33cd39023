"""The replay window: acknowledged batches a database failover lost are sent again, once.

The service here is a model of ingest/store/receipts.py (receipt per seq, high-water mark,
gap ranges opened by a jump and closed by a late seq) whose state can be rolled back to an
earlier copy: a promoted standby that had not received the newest commits.
"""

from __future__ import annotations

import copy
import gzip
import json
import random
from pathlib import Path
from typing import Any

import pytest

from agents.replay import ReplayWindow, lost
from agents.sender import AgentInfo, Sender
from agents.spool import Identity, Spool
from agents.wire import record


@pytest.fixture(autouse=True)
def _no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """Durability is the spool's tests' business; here it would only cost seconds."""
    monkeypatch.setattr("os.fsync", lambda fd: None)


class Receipts:
    """The service's side: what is stored, and the receipts a 202 reports."""

    def __init__(self) -> None:
        self.stored: dict[int, list[dict[str, Any]]] = {}
        self.high_water: int | None = None
        self.gaps: list[list[int]] = []
        self.gap_count = 0
        self.down = False  # answers 503 (the primary is gone, the standby not promoted yet)
        self.reject: set[int] = set()  # seqs answered 400
        self.lose_reply_of: set[int] = set()  # stored, then the connection breaks

    def snapshot(self) -> Receipts:
        return copy.deepcopy(self)

    def fail_over_to(self, standby: Receipts) -> None:
        """The standby (an earlier copy) becomes the service's database."""
        self.stored, self.high_water = standby.stored, standby.high_water
        self.gaps, self.gap_count = standby.gaps, standby.gap_count

    def post(self, body: bytes) -> tuple[int, dict[str, str], bytes]:
        if self.down:
            return 503, {"Retry-After": "0"}, b'{"error": "database unavailable"}'
        batch = json.loads(gzip.decompress(body))
        seq = batch["seq"]
        if seq in self.reject:
            return 400, {}, b'{"error": "bad record"}'
        found = (self.high_water, [tuple(g) for g in self.gaps])
        duplicate = seq in self.stored
        if not duplicate:
            self.stored[seq] = batch["records"]
            hw = self.high_water
            if hw is not None and seq > hw + 1:
                self.gaps.append([hw + 1, seq - 1])
                self.gap_count += seq - hw - 1
            elif hw is not None and seq < hw:
                for i, (a, b) in enumerate(self.gaps):
                    if a <= seq <= b:
                        self.gaps[i : i + 1] = [
                            r for r in ([a, seq - 1], [seq + 1, b]) if r[0] <= r[1]
                        ]
                        self.gap_count -= 1
                        break
            self.high_water = seq if hw is None else max(hw, seq)
        if seq in self.lose_reply_of:
            self.lose_reply_of.discard(seq)
            raise ConnectionResetError("reply lost")
        reply = {
            "ack_seq": seq,
            "duplicate": duplicate,
            "actions": [],
            "high_water": found[0],
            "gaps": found[1],
        }
        return 202, {}, json.dumps(reply).encode()

    def steps(self) -> list[int]:
        return [r["step"] for recs in self.stored.values() for r in recs]


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _agent(tmp_path: Path, service: Receipts, clock: Clock, window_s: float = 30.0) -> Sender:
    identity = Identity(tmp_path)
    spool = Spool(tmp_path, replay_window_s=window_s)
    spool.replay.clock = clock
    sender = Sender(
        spool,
        identity,
        AgentInfo(identity.agent_id, "node-1", "0.1.0", "boot-1"),
        server="http://127.0.0.1:9",
        token="tok",
        state_dir=tmp_path,
        max_records=3,
    )

    def post(body: bytes) -> tuple[int, Any, bytes]:
        try:
            return service.post(body)
        except ConnectionResetError as exc:
            raise OSError(str(exc)) from exc

    sender._post = post  # type: ignore[method-assign]  # the service stub stands in for HTTP
    return sender


class Feed:
    """Steps into the agent's spool, one per `send` call, each sent and (maybe) acked."""

    def __init__(self, sender: Sender, clock: Clock) -> None:
        self.sender, self.clock, self.next = sender, clock, 0
        self.acked: set[int] = set()  # steps whose batch got a 202

    def send(self, n: int = 1, *, dt: float = 1.0) -> None:
        for _ in range(n):
            self.sender.spool.append(
                record("step", group="g", generation=1, rank=0, step=self.next)
            )
            self.next += 1
            self.clock.now += dt
            self.drain()

    def drain(self) -> None:
        for _ in range(1000):
            batch = self.sender.spool.pending_batch() or self.sender.spool.build_batch(
                self.sender.identity, max_records=3
            )
            if batch is None:
                return
            outcome, _ = self.sender.send_once()
            if outcome == "acked":
                self.acked.update(r["step"] for r in batch["records"])
            if outcome == "retry":
                return
        raise AssertionError("the agent never drained")


def _exactly_once(service: Receipts, acked: set[int]) -> None:
    steps = service.steps()
    assert len(steps) == len(set(steps)), "a step stored twice"
    assert acked <= set(steps), f"acknowledged but lost: {sorted(acked - set(steps))}"


@pytest.mark.parametrize("lag", [0, 1, 5])
@pytest.mark.parametrize("outage", [True, False])
def test_every_acknowledged_batch_survives_a_failover_to_a_lagging_standby(
    tmp_path: Path, lag: int, outage: bool
) -> None:
    service, clock = Receipts(), Clock()
    sender = _agent(tmp_path, service, clock)
    feed = Feed(sender, clock)
    feed.send(6)
    standby = service.snapshot()  # the standby stops receiving here
    feed.send(lag)  # acknowledged by the primary only
    if outage:
        service.down = True
        feed.send(3)  # spooled, answered 503
        service.down = False
    service.fail_over_to(standby)
    feed.send(3)
    _exactly_once(service, feed.acked)
    assert set(service.steps()) == set(range(feed.next))
    # The gap that the newer seqs opened was closed by the replayed ones.
    assert (service.gap_count, service.gaps) == (0, [])
    assert sender.replayed == lag


def test_an_agent_the_standby_never_heard_of_sends_its_whole_window_again(tmp_path: Path) -> None:
    service, clock = Receipts(), Clock()
    sender = _agent(tmp_path, service, clock)
    feed = Feed(sender, clock)
    standby = service.snapshot()  # before the agent's first batch
    feed.send(5)
    service.fail_over_to(standby)
    feed.send(2)
    _exactly_once(service, feed.acked)
    assert set(service.steps()) == set(range(feed.next))


def test_a_lost_reply_on_the_new_primary_still_finds_the_gap(tmp_path: Path) -> None:
    service, clock = Receipts(), Clock()
    sender = _agent(tmp_path, service, clock)
    feed = Feed(sender, clock)
    feed.send(6)
    standby = service.snapshot()
    feed.send(6)
    service.fail_over_to(standby)
    next_seq = sender.identity.next_seq
    service.lose_reply_of.add(next_seq)  # the first batch on the new primary: stored, no 202
    feed.send(1)  # answered by the duplicate of its retry, which reports the gap
    feed.send(3)
    _exactly_once(service, feed.acked)
    assert set(service.steps()) == set(range(feed.next)) and service.gap_count == 0


def test_without_a_window_the_failover_loses_acknowledged_batches(tmp_path: Path) -> None:
    service, clock = Receipts(), Clock()
    sender = _agent(tmp_path, service, clock, window_s=0)
    feed = Feed(sender, clock)
    feed.send(5)
    standby = service.snapshot()
    feed.send(4)
    service.fail_over_to(standby)
    feed.send(3)
    assert not feed.acked <= set(service.steps())
    assert service.gap_count > 0  # the service counts what it lost
    assert list((tmp_path / "spool" / "window").iterdir()) == []


def test_batches_older_than_the_window_stay_lost_and_the_gap_counts_them(tmp_path: Path) -> None:
    """A standby that lagged more than the window: the newest acknowledged batches come
    back, the older ones cannot, and the service's gap count is exactly what was lost."""
    service, clock = Receipts(), Clock()
    sender = _agent(tmp_path, service, clock, window_s=10)
    feed = Feed(sender, clock)
    feed.send(6)
    standby = service.snapshot()
    feed.send(15, dt=1.0)  # 15 batches over 15 s; the window keeps the last 10 s
    service.fail_over_to(standby)
    feed.send(2)
    steps = service.steps()
    assert len(steps) == len(set(steps))
    missing = set(range(feed.next)) - set(steps)
    assert 0 < len(missing) < 15
    assert service.gap_count == len(missing)  # one record per batch here: batches = steps
    assert missing == set(range(6, 6 + len(missing)))  # the oldest of them


def test_a_dead_lettered_batch_is_never_replayed_though_its_seq_is_a_gap(tmp_path: Path) -> None:
    service, clock = Receipts(), Clock()
    sender = _agent(tmp_path, service, clock)
    feed = Feed(sender, clock)
    feed.send(3)
    service.reject.add(sender.identity.next_seq)
    feed.send(1)  # 400: dead-lettered
    feed.send(5)
    assert sender.quarantined == 1 and sender.replayed == 0
    assert service.gap_count == 1  # the service's gap list names it on every 202
    assert len(list((tmp_path / "deadletter").iterdir())) == 1


def test_a_restarted_agent_keeps_its_window(tmp_path: Path) -> None:
    service, clock = Receipts(), Clock()
    sender = _agent(tmp_path, service, clock)
    feed = Feed(sender, clock)
    feed.send(4)
    standby = service.snapshot()
    feed.send(3)
    sender.spool.close()
    service.fail_over_to(standby)
    restarted = _agent(tmp_path, service, clock)  # same state dir
    feed.sender = restarted
    feed.send(2)
    _exactly_once(service, feed.acked)
    assert restarted.replayed == 3


@pytest.mark.parametrize("seed", range(40))
def test_lost_names_exactly_the_acknowledged_seqs_the_service_lacks(seed: int) -> None:
    rng = random.Random(seed)
    stored = {s for s in range(1, 60) if rng.random() < 0.7}
    window = set(rng.sample(range(1, 70), rng.randint(0, 25)))
    ack = rng.randint(1, 70)
    high = max(stored) if stored else None
    gaps = []
    if high is not None:
        run: list[int] = []
        for s in range(1, high + 1):
            if s not in stored:
                if run and run[1] == s - 1:
                    run[1] = s
                else:
                    run = [s, s]
                    gaps.append(run)
    rng.shuffle(gaps)  # the service keeps them in the order they opened, not sorted
    assert lost(window, ack, high, gaps) == sorted(window - stored - {ack})


def test_the_window_forgets_by_time_and_by_bytes(tmp_path: Path) -> None:
    clock = Clock()
    inflight = tmp_path / "inflight"
    inflight.mkdir()
    window = ReplayWindow(tmp_path / "window", window_s=10, max_bytes=2500, clock=clock)

    def ack(seq: int, size: int = 500) -> None:
        (inflight / f"{seq}.json").write_bytes(b"x" * size)
        window.keep(seq, inflight / f"{seq}.json")

    for seq in range(1, 5):
        ack(seq)
        clock.now += 4
    assert window.seqs == [1, 2, 3, 4] and window.bytes == 2000
    assert window.expire() == 2  # acknowledged 16 and 12 s ago
    assert window.seqs == [3, 4]
    ack(5, 2100)  # over the byte bound: the oldest go first, counted
    assert window.seqs == [5] and window.evicted == 2 and window.bytes == 2100
    assert sorted(p.name for p in (tmp_path / "window").iterdir()) == ["5.json"]
    again = ReplayWindow(tmp_path / "window", window_s=10, clock=clock)  # a restart
    assert again.seqs == [5] and again.bytes == 2100
    assert again.take([5, 99], inflight) == [5]
    assert (inflight / "5.json").stat().st_size == 2100 and len(again) == 0
