from __future__ import annotations

import json
from pathlib import Path

from agents.spool import Identity, Spool
from agents.wire import record


def _step(n: int) -> dict:
    return record("step", group="g", generation=1, rank=0, step=n)


def _sample(n: int) -> dict:
    return record("device_sample", gpu="GPU-x", index=0, temp_c=float(n))


def test_it_keeps_unsent_records_across_a_restart(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    for n in range(5):
        spool.append(_step(n))
    spool.close()
    again = Spool(tmp_path)
    assert again.depth == 5
    batch = again.build_batch(Identity(tmp_path))
    assert batch is not None
    assert [r["step"] for r in batch["records"]] == [0, 1, 2, 3, 4]


def test_it_continues_seq_after_a_restart_and_never_reuses_one(tmp_path: Path) -> None:
    identity = Identity(tmp_path)
    used = [identity.allocate_seq() for _ in range(3)]
    again = Identity(tmp_path)
    assert again.agent_id == identity.agent_id
    assert again.allocate_seq() == used[-1] + 1


def test_it_resends_the_unacknowledged_batch_with_the_same_seq_after_restart(
    tmp_path: Path,
) -> None:
    spool = Spool(tmp_path)
    spool.append(_step(1))
    built = spool.build_batch(Identity(tmp_path))
    spool.close()
    again = Spool(tmp_path)
    pending = again.pending_batch()
    assert pending == built
    again.ack(built["seq"])
    assert again.pending_batch() is None
    assert again.depth == 0


def test_it_drops_oldest_samples_first_and_never_events_while_samples_remain(
    tmp_path: Path,
) -> None:
    spool = Spool(tmp_path, max_bytes=64 * 1024, segment_bytes=4096)
    for n in range(50):
        spool.append(_step(n))
    for n in range(2000):
        spool.append(_sample(n))
    assert spool.bytes <= 64 * 1024
    assert spool.dropped > 0
    assert spool.dropped_events == 0
    records = []
    while (batch := spool.build_batch(Identity(tmp_path), max_records=5000)) is not None:
        records += batch["records"]
        spool.ack(batch["seq"])
    steps = [r["step"] for r in records if r["kind"] == "step"]
    temps = [r["temp_c"] for r in records if r["kind"] == "device_sample"]
    assert steps == list(range(50))
    assert temps[-1] == 1999.0 and temps[0] > 0  # the newest kept, the oldest dropped
    assert len(temps) + spool.dropped == 2000


def test_it_drops_events_only_when_no_sample_is_left(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=16 * 1024, segment_bytes=2048)
    for n in range(1000):
        spool.append(_step(n))
    assert spool.dropped_events > 0
    assert spool.bytes <= 16 * 1024


def test_it_persists_the_drop_count_across_a_restart(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=16 * 1024, segment_bytes=2048)
    for n in range(1000):
        spool.append(_sample(n))
    dropped = spool.dropped
    spool.close()
    assert dropped > 0
    assert Spool(tmp_path, max_bytes=16 * 1024, segment_bytes=2048).dropped == dropped


def test_it_cuts_a_torn_last_line_left_by_a_crash(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.append(_step(1))
    spool.close()
    segment = next((tmp_path / "spool" / "events").glob("*.seg"))
    with open(segment, "ab") as fh:
        fh.write(b'{"kind":"step","ts":')  # the agent died mid-append
    again = Spool(tmp_path)
    batch = again.build_batch(Identity(tmp_path))
    assert [r["step"] for r in batch["records"]] == [1]
    json.dumps(batch)


def test_its_depth_read_while_a_batch_is_built_never_counts_a_record_twice(
    tmp_path: Path,
) -> None:
    import threading

    spool, identity = Spool(tmp_path), Identity(tmp_path)
    done = threading.Event()
    seen: list[int] = []

    def read() -> None:
        while not done.is_set():
            seen.append(spool.depth)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for _ in range(150):
            for n in range(40):
                spool.append(_sample(n))
            batch = spool.build_batch(identity)
            assert batch is not None
            spool.ack(batch["seq"])
    finally:
        done.set()
        reader.join()
    assert max(seen) <= 40, max(seen)  # the heartbeat's spool_depth, read mid-build
