from __future__ import annotations

import gzip
import json
import math
import threading
import time
from pathlib import Path

import pytest

from agents.sender import AgentInfo, AuthError, Sender, retry_after_seconds
from agents.spool import Identity, Spool
from agents.wire import real, record

from .conftest import StubIngest


def _sender(tmp_path: Path, stub: StubIngest, **kw) -> Sender:
    identity = Identity(tmp_path)
    spool = Spool(tmp_path)
    info = AgentInfo(identity.agent_id, "node-1", "0.1.0", "boot-1")
    kw.setdefault("backoff_base", 0.05)
    kw.setdefault("backoff_cap", 0.3)
    return Sender(
        spool,
        identity,
        info,
        server=stub.url,
        token="tok-1",
        state_dir=tmp_path,
        interval=0.05,
        **kw,
    )


def _step(n: int, **extra) -> dict:
    return record("step", group="g", generation=1, rank=0, step=n, **extra)


def test_it_posts_gzip_with_the_bearer_token_and_the_exact_envelope(
    tmp_path: Path, stub: StubIngest
) -> None:
    sender = _sender(tmp_path, stub)
    sender.spool.append(_step(1))
    assert sender.send_once()[0] == "acked"
    seq, headers = stub.attempts[0]
    assert headers["Content-Encoding"] == "gzip"
    assert headers["Authorization"] == "Bearer tok-1"
    envelope = stub.batches[0]
    assert set(envelope) == {"agent", "seq", "sent_at", "records"}
    assert set(envelope["agent"]) == {"id", "node", "version", "boot_id"}
    assert envelope["seq"] == seq == 1


def test_it_sends_a_nan_loss_as_the_contract_string(tmp_path: Path, stub: StubIngest) -> None:
    sender = _sender(tmp_path, stub)
    sender.spool.append(_step(1, loss=real(math.nan), grad_norm=real(-math.inf)))
    sender.send_once()
    (rec,) = stub.records()
    assert rec["loss"] == "NaN" and rec["grad_norm"] == "-Infinity"
    assert stub.invalid == []


def test_it_delivers_every_record_exactly_once_across_a_server_outage(
    tmp_path: Path, stub: StubIngest
) -> None:
    sender = _sender(tmp_path, stub, max_records=7)
    stop = threading.Event()
    thread = threading.Thread(target=sender.run, args=(stop,), daemon=True)
    thread.start()
    stub.drop_response_once_for = 2  # stored, ack lost: the same seq must come again
    total = 300
    for n in range(total):
        sender.spool.append(_step(n))
        if n == 100:
            stub.stop()  # the service goes away for a few seconds mid-stream
        if n == 200:
            time.sleep(2.5)
            stub.start()
        time.sleep(0.005)
    deadline = time.monotonic() + 20
    while len(stub.records()) < total and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    sender.stop()
    thread.join(timeout=5)
    steps = [r["step"] for r in stub.records()]
    assert sorted(steps) == list(range(total))  # all there, none twice
    assert stub.duplicates >= 1  # the lost ack was retried with the same seq
    seqs = [seq for seq, _ in stub.attempts]
    assert seqs.count(2) >= 2
    assert stub.invalid == []


def test_it_dead_letters_a_rejected_batch_and_moves_on(tmp_path: Path, stub: StubIngest) -> None:
    sender = _sender(tmp_path, stub)
    bad = _step(1)
    bad["temperature"] = "hot"  # not a contract field: the stub answers 400
    sender.spool.append(bad)
    assert sender.send_once()[0] == "quarantined"
    sender.spool.append(_step(2))
    assert sender.send_once()[0] == "acked"
    dead = json.loads((tmp_path / "deadletter" / "batch-1.json").read_text())
    assert "temperature" in dead["error"]["error"]
    assert dead["batch"]["records"][0]["temperature"] == "hot"
    assert [seq for seq, _ in stub.attempts] == [1, 2]  # never retried


def test_it_stops_with_a_clear_message_on_401(tmp_path: Path, stub: StubIngest) -> None:
    stub.script.append((401, {}, b'{"error": "bad token"}'))
    sender = _sender(tmp_path, stub)
    sender.spool.append(_step(1))
    with pytest.raises(AuthError, match="refused this agent's token"):
        sender.send_once()
    assert sender.spool.pending_batch() is not None  # kept for when the token is fixed


def test_it_honours_retry_after_on_503_and_keeps_the_seq(tmp_path: Path, stub: StubIngest) -> None:
    stub.script.append((503, {"Retry-After": "7"}, b""))
    sender = _sender(tmp_path, stub)
    sender.spool.append(_step(1))
    outcome, wait = sender.send_once()
    assert outcome == "retry" and 7.0 <= wait <= 10.5
    sender.spool.append(_step(2))
    assert sender.send_once()[0] == "acked"
    assert [seq for seq, _ in stub.attempts] == [1, 1]
    assert [r["step"] for r in stub.records()] == [1]


def test_it_backs_off_exponentially_with_jitter_while_unreachable(
    tmp_path: Path, stub: StubIngest
) -> None:
    stub.stop()
    sender = _sender(tmp_path, stub, backoff_base=0.1, backoff_cap=100.0)
    sender.spool.append(_step(1))
    waits = [sender.send_once()[1] for _ in range(6)]
    assert all(w <= 0.1 * 2 ** (i + 1) for i, w in enumerate(waits))
    assert max(waits[3:]) > max(waits[:2])


def test_agents_turned_away_together_do_not_come_back_together(
    tmp_path: Path, stub: StubIngest
) -> None:
    waits = []
    for i in range(40):
        stub.script.append((503, {"Retry-After": "5"}, b""))
        sender = _sender(tmp_path / str(i), stub)
        sender.spool.append(_step(1))
        outcome, wait = sender.send_once()
        assert outcome == "retry" and 5.0 <= wait <= 7.5
        waits.append(wait)
    assert len({int(w * 2) for w in waits}) >= 4  # spread over the half seconds after 5 s


def test_it_reads_retry_after_as_seconds_or_http_date() -> None:
    assert retry_after_seconds("12", 1.0) == 12.0
    assert retry_after_seconds(None, 3.0) == 3.0
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", 5.0) == 0.0
    assert retry_after_seconds("soon", 5.0) == 5.0


def test_it_hands_actions_from_the_ingest_response_to_the_executor(
    tmp_path: Path, stub: StubIngest
) -> None:
    got: list = []
    stub.actions = [
        {
            "id": "a1",
            "kind": "cordon",
            "target": "node-1",
            "group": "g",
            "generation": 1,
            "params": {},
        }
    ]
    sender = _sender(tmp_path, stub, on_actions=got.extend)
    sender.spool.append(_step(1))
    sender.send_once()
    assert [a["id"] for a in got] == ["a1"]


def test_it_compresses_batches(tmp_path: Path, stub: StubIngest) -> None:
    sender = _sender(tmp_path, stub)
    for n in range(200):
        sender.spool.append(_step(n))
    batch = sender.spool.build_batch(sender.identity)
    raw = json.dumps(sender.envelope(batch)).encode()
    assert len(gzip.compress(raw)) < len(raw) / 5


def test_it_splits_a_batch_the_service_finds_too_large_instead_of_dropping_it(
    tmp_path: Path, stub: StubIngest
) -> None:
    sender = _sender(tmp_path, stub)
    for n in range(1, 5):
        sender.spool.append(_step(n))
    stub.script.append((413, {}, b'{"error": "batch is too large"}'))
    assert sender.send_once()[0] == "split"
    assert sender.send_once()[0] == "acked"
    assert sender.send_once()[0] == "acked"
    assert sorted(r["step"] for r in stub.records()) == [1, 2, 3, 4]
    assert [seq for seq, _ in stub.attempts] == [1, 2, 3]  # fresh seqs for the halves
    assert not (tmp_path / "deadletter").exists()


def test_it_dead_letters_a_single_record_over_the_limit(tmp_path: Path, stub: StubIngest) -> None:
    sender = _sender(tmp_path, stub)
    sender.spool.append(_step(1))
    stub.script.append((413, {}, b'{"error": "batch is too large"}'))
    assert sender.send_once()[0] == "quarantined"
    assert (tmp_path / "deadletter" / "batch-1.json").exists()


def test_it_builds_batches_under_the_services_body_limit(tmp_path: Path, stub: StubIngest) -> None:
    from agents import protocol, wire

    assert protocol.MAX_BATCH_BYTES == wire.MAX_BATCH_BYTES  # one constant, both sides
    sender = _sender(tmp_path, stub)
    shards = [{"path": f"shard-{i:05d}-" + "p" * 480, "bytes": 1} for i in range(3000)]
    for n in range(8):  # ~1.5 MB a record, ~12 MB in all: more than one batch may carry
        sender.spool.append(
            record("checkpoint", group="g", generation=1, checkpoint_id=f"c{n}",
                   phase="written", manifest={"shards": shards})
        )  # fmt: skip
    while sender.send_once()[0] == "acked":
        pass
    sizes = [len(json.dumps(b, separators=(",", ":"))) for b in stub.batches]
    assert sum(len(b["records"]) for b in stub.batches) == 8 and len(sizes) >= 2
    assert all(size <= wire.MAX_BATCH_BYTES for size in sizes), sizes
    assert stub.invalid == []


def test_it_sends_every_batch_on_one_kept_alive_connection(
    tmp_path: Path, stub: StubIngest
) -> None:
    # The sender keeps one connection open between batches (docs/agent.md).
    sender = _sender(tmp_path, stub)
    for n in range(3):
        sender.spool.append(_step(n))
        assert sender.send_once()[0] == "acked"
    assert stub.connections == 1
    assert [seq for seq, _ in stub.attempts] == [1, 2, 3]


def test_it_reconnects_at_once_when_the_server_closed_the_idle_connection(
    tmp_path: Path, stub: StubIngest
) -> None:
    sender = _sender(tmp_path, stub)
    sender.spool.append(_step(1))
    assert sender.send_once()[0] == "acked"
    stub.close_idle()  # the server's keep-alive timeout ran out between batches
    time.sleep(0.1)
    sender.spool.append(_step(2))
    assert sender.send_once()[0] == "acked"  # no failure, no backoff
    assert sender.failures == 0
    assert stub.connections == 2
    assert [r["step"] for r in stub.records()] == [1, 2]
    assert [seq for seq, _ in stub.attempts] == [1, 2] and stub.duplicates == 0


def test_it_resends_a_batch_the_server_dropped_as_it_closed_a_kept_alive_connection(
    tmp_path: Path, stub: StubIngest
) -> None:
    # The race the idle check cannot see: the request went out on the kept-alive
    # connection just as the server closed it, unread. One fresh try, same seq.
    sender = _sender(tmp_path, stub)
    sender.spool.append(_step(1))
    assert sender.send_once()[0] == "acked"
    stub.close_next_reused = True
    sender.spool.append(_step(2))
    assert sender.send_once()[0] == "acked"
    assert sender.failures == 0
    assert [r["step"] for r in stub.records()] == [1, 2]
    assert [seq for seq, _ in stub.attempts] == [1, 2]  # the dropped one was never read
    assert stub.connections == 2


def test_a_batch_stored_but_unanswered_on_a_kept_alive_connection_is_stored_once(
    tmp_path: Path, stub: StubIngest
) -> None:
    # The service stored the batch, then the connection broke before the answer: the
    # fresh try carries the same seq and the service's receipt makes it a duplicate.
    sender = _sender(tmp_path, stub)
    sender.spool.append(_step(1))
    assert sender.send_once()[0] == "acked"
    stub.drop_response_once_for = 2
    sender.spool.append(_step(2))
    assert sender.send_once()[0] == "acked"
    sender.spool.append(_step(3))
    assert sender.send_once()[0] == "acked"
    assert [r["step"] for r in stub.records()] == [1, 2, 3]
    assert [seq for seq, _ in stub.attempts] == [1, 2, 2, 3]
    assert stub.duplicates == 1
    assert sender.spool.pending_batch() is None


def test_it_sends_through_the_http_proxy_the_environment_names(
    tmp_path: Path, stub: StubIngest, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As urllib did: *_proxy variables apply to a non-loopback server; the stub plays the
    # forward proxy and sees the absolute URL as the request target.
    for name in ("no_proxy", "NO_PROXY", "HTTP_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", stub.url)
    identity, spool = Identity(tmp_path), Spool(tmp_path)
    sender = Sender(
        spool, identity, AgentInfo(identity.agent_id, "node-1", "0.1.0"),
        server="http://ingest.invalid:8000", token="tok-1", state_dir=tmp_path,
    )  # fmt: skip
    for n in range(2):
        spool.append(_step(n))
        assert sender.send_once()[0] == "acked"
    assert [r["step"] for r in stub.records()] == [0, 1]
    assert stub.paths == ["http://ingest.invalid:8000/api/v1/ingest"] * 2
    assert stub.connections == 1
