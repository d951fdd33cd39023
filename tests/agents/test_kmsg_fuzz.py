"""The kernel-log reader never raises and stays bounded, whatever the log holds.

Random and truncated records (hypothesis) go through the record parsers; a log of several
megabytes built from the fixtures and random records goes through the reader thread (the
journal path, fed by a fake `journalctl`) and through the captured-log iterator, while
tracemalloc watches the peak.
"""

from __future__ import annotations

import json
import random
import stat
import threading
import tracemalloc
from datetime import UTC, datetime
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents import kmsg

FIXTURES = Path(__file__).parent / "fixtures" / "kmsg"
BOOT = 1_764_500_000.0


def _fixture_lines(suffix: str) -> list[str]:
    return [
        line
        for path in sorted(FIXTURES.glob(f"*{suffix}"))
        for line in path.read_text().splitlines()
        if line and not line.startswith("#")
    ]


KMSG_LINES = _fixture_lines(".kmsg") + _fixture_lines(".txt")
JOURNAL_LINES = _fixture_lines(".jsonl")
MESSAGES = [line.partition(";")[2] for line in KMSG_LINES if ";" in line]


def _check(event: kmsg.KernelEvent | None) -> None:
    """What any event may hold: codes and bounded fields, never the line."""
    if event is None:
        return
    assert event.event in (kmsg.XID, kmsg.GPU_OFF_BUS, *kmsg.HOST_EVENTS)
    assert event.comm is None or len(event.comm) <= 16
    assert event.device is None or len(event.device) <= 32
    assert event.detail is None or len(event.detail) <= 256
    assert isinstance(event.ts, datetime) and event.ts.tzinfo is UTC
    assert 2000 <= event.ts.year < 2100  # the contract's range: never a batch ingest refuses


def _both(line: str) -> None:
    for fmt in ("kmsg", "journal"):
        _check(kmsg.parse_record(line, fmt=fmt, boot_epoch=BOOT))


# -- random and truncated records ---------------------------------------------------------
_number = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.text(alphabet="0123456789٤²x-", max_size=40),
)
_fragment = st.one_of(
    st.sampled_from(MESSAGES),
    st.sampled_from(MESSAGES).flatmap(
        lambda m: st.integers(0, len(m)).map(lambda n: m[:n])  # a record cut short
    ),
    st.text(max_size=300),
    st.sampled_from(["\\x0a", "\\x5c", "\\xff", "\\x", "\\x0", "\n", " KEY=value", "(", ")"]),
)
_message = st.lists(_fragment, max_size=6).map("".join)
_kmsg_record = st.builds(
    lambda p, s, u, f, m: f"{p},{s},{u},{f};{m}", _number, _number, _number,
    st.sampled_from(["-", "c", "+", "", "-,caller=T1"]), _message,
)  # fmt: skip
_json_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=50),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
_journal_entry = st.fixed_dictionaries(
    {},
    optional={
        "_TRANSPORT": st.sampled_from(["kernel", "syslog", "stdout", "journal"]) | _json_value,
        "SYSLOG_FACILITY": st.sampled_from(["0", "1", 0, "00", ["0"]]) | _json_value,
        "__REALTIME_TIMESTAMP": _number | _json_value,
        "MESSAGE": _message | st.lists(st.integers(-300, 300), max_size=60) | _json_value,
    },
).map(json.dumps)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_kmsg_record)
def test_it_never_raises_on_a_random_kmsg_record(line: str) -> None:
    _both(line)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_journal_entry)
def test_it_never_raises_on_a_random_journal_entry(line: str) -> None:
    _both(line)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=2000))
def test_it_never_raises_on_any_text(line: str) -> None:
    _both(line)
    _check(kmsg.parse_message(line, datetime.now(UTC)))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(KMSG_LINES + JOURNAL_LINES), st.data())
def test_it_never_raises_on_a_fixture_record_cut_anywhere(line: str, data: st.DataObject) -> None:
    start = data.draw(st.integers(0, len(line)))
    end = data.draw(st.integers(start, len(line)))
    _both(line[start:end])
    _both(line[:end])


def test_it_never_raises_on_hostile_shapes() -> None:
    for line in (
        "[" * 100_000,  # json recursion
        '{"MESSAGE": ' * 50_000,
        '{"_TRANSPORT": "kernel", "SYSLOG_FACILITY": "0", "MESSAGE": "x", '
        '"__REALTIME_TIMESTAMP": "' + "9" * 5000 + '"}',  # int() of 5000 digits
        "0,1," + "9" * 5000 + ",-;NVRM: Xid (PCI:0000:3b:00): 79, x",
        "0,1,99999999999999999999,-;NVRM: Xid (PCI:0000:3b:00): 79, x",  # year 5000000
        "4,1,100,-;" + "NVRM: Xid (PCI:0000:3b:00): 149, " + "A" * 200_000,
        "4,1,100,-;Out of memory: Killed process 1 (" + ")" * 100_000,
        "4,1,100,-;INFO: task " + ":" * 100_000 + "1 blocked for more than 1 seconds",
        "4,1,100,-;" + "\\x0a" * 50_000,
    ):
        _both(line)


# -- a log of several megabytes -------------------------------------------------------------
LOG_BYTES = 6 * 1024 * 1024
PEAK_BYTES = 4 * 1024 * 1024  # what the reader may hold at once, whatever the log's size


def _big_log(path: Path, sources: list[str], *, fmt: str) -> int:
    """Fixture records and random ones (some cut short, a few over the reader's record
    limit) up to LOG_BYTES; returns how many of the fixture records written are events."""
    rng = random.Random(41)
    is_event = {line: kmsg.parse_record(line, fmt=fmt, boot_epoch=BOOT) is not None
                for line in sources}  # fmt: skip
    written = events = 0
    with path.open("w") as out:
        while written < LOG_BYTES:
            roll = rng.random()
            if roll < 0.7:
                line = rng.choice(sources)
                events += is_event[line]
            elif roll < 0.95:
                line = "".join(chr(rng.randrange(32, 0x3000)) for _ in range(rng.randrange(200)))
            elif roll < 0.999:
                line = rng.choice(sources)[: rng.randrange(80)]
            else:  # a runaway line: over the reader's record limit
                line = "x" * (kmsg.MAX_RECORD + rng.randrange(50_000))
            line = line.replace("\n", " ")
            out.write(line + "\n")
            written += len(line) + 1
    return events


def test_it_reads_a_multi_megabyte_captured_log_in_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "kmsg.log"
    expected = _big_log(path, KMSG_LINES, fmt="kmsg")
    tracemalloc.start()
    try:
        with path.open() as fh:
            count = sum(1 for _ in kmsg.iter_events(fh, fmt="kmsg", boot_epoch=BOOT))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert count >= expected > 10_000
    assert peak < PEAK_BYTES, f"peak {peak} bytes reading a {LOG_BYTES}-byte log"


def test_it_follows_a_multi_megabyte_journal_in_bounded_memory(tmp_path: Path) -> None:
    log = tmp_path / "journal.log"
    expected = _big_log(log, JOURNAL_LINES, fmt="journal")
    script = tmp_path / "journalctl"
    script.write_text(f"#!/bin/sh\nexec cat {log}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    seen = [0]
    lock = threading.Lock()

    def sink(event: kmsg.KernelEvent) -> None:
        _check(event)
        with lock:
            seen[0] += 1

    tracemalloc.start()
    try:
        reader = kmsg.KernelLog(sink, path=str(tmp_path / "no-kmsg"), journalctl=str(script))
        reader.start()
        assert reader._thread is not None
        reader._thread.join(timeout=120)
        alive = reader._thread.is_alive()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert not alive and reader.source == "journal"
    assert seen[0] >= expected > 5_000  # the reader went on past every bad and long line
    assert peak < PEAK_BYTES, f"peak {peak} bytes following a {LOG_BYTES}-byte journal"
