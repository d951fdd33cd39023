"""Every kernel-log format the agent reads, from the fixtures under tests/agents/fixtures/kmsg/.

Each fixture holds records as the agent reads them (`*.kmsg`: /dev/kmsg records;
`*.jsonl`: `journalctl -k -o json` entries), cites where each format comes from, and
follows every record with a `#=>` line naming what it must become: `nothing`, or an event
code and its fields (`device=`, `code=`, `pid=`, `comm=`, `severity=`, `recovery_action=`,
`detail=`, and `detail~=` for a part of the detail). The test reads each record through the
agent's own parser and compares.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from agents import kmsg

FIXTURES = Path(__file__).parent / "fixtures" / "kmsg"
BOOT = 1_764_500_000.0


@dataclass
class Case:
    file: str
    line_no: int
    record: str
    expect: str

    @property
    def fmt(self) -> str:
        return "kmsg" if self.file.endswith(".kmsg") else "journal"

    def __str__(self) -> str:
        return f"{self.file}:{self.line_no}"


def _cases() -> list[Case]:
    out: list[Case] = []
    for path in sorted(FIXTURES.glob("*")):
        if path.suffix not in (".kmsg", ".jsonl") or path.name == "journal.jsonl":
            continue
        record: tuple[int, str] | None = None
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.startswith("#=> "):
                assert record is not None, f"{path.name}:{n}: an expectation with no record"
                out.append(Case(path.name, record[0], record[1], line[4:]))
                record = None
            elif line.startswith(" "):
                continue  # a /dev/kmsg dictionary line belongs to the record above it
            elif line and not line.startswith("#"):
                assert record is None, f"{path.name}:{record[0]}: a record with no expectation"
                record = (n, line)
        assert record is None, f"{path.name}:{record[0]}: a record with no expectation"
    return out


CASES = _cases()


def _expected(spec: str) -> tuple[str | None, dict[str, Any], list[str]]:
    words = shlex.split(spec)
    if words == ["nothing"]:
        return None, {}, []
    fields: dict[str, Any] = {}
    parts: list[str] = []
    for word in words[1:]:
        key, _, value = word.partition("=")
        if key.endswith("~"):
            parts.append(value)
        else:
            fields[key] = None if value == "None" else value
    return words[0], fields, parts


def test_it_has_fixtures_for_every_class() -> None:
    events = {_expected(c.expect)[0] for c in CASES}
    assert {"xid", "gpu_off_bus", "aer_corrected", "aer_nonfatal", "aer_fatal", "oom_kill",
            "hung_task", "io_error", None} <= events  # fmt: skip
    assert {c.file for c in CASES} >= {"aer.kmsg", "gpu_off_bus.kmsg", "gpu_off_bus.journal.jsonl",
        "xid154.kmsg", "nvlink5.kmsg", "xid.kmsg", "oom.kmsg", "untrusted.kmsg",
        "untrusted.journal.jsonl", "classes.journal.jsonl"}  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=str)
def test_it_reads_each_record_as_its_fixture_says(case: Case) -> None:
    event = kmsg.parse_record(case.record, fmt=case.fmt, boot_epoch=BOOT)
    code, fields, parts = _expected(case.expect)
    if code is None:
        assert event is None, f"{case}: {event}"
        return
    assert event is not None, f"{case}: nothing read from {case.record!r}"
    assert event.event == code, case
    for key, value in fields.items():
        got = getattr(event, key)
        assert (None if got is None else str(got)) == value, f"{case}: {key}={got!r}"
    for part in parts:
        assert part in (event.detail or ""), f"{case}: {part!r} not in {event.detail!r}"


def test_it_reads_no_record_from_the_fixtures_comment_and_expectation_lines() -> None:
    for path in FIXTURES.glob("*"):
        for line in path.read_text().splitlines():
            if line.startswith("#"):
                fmt = "kmsg" if path.suffix == ".kmsg" else "journal"
                assert kmsg.parse_record(line, fmt=fmt, boot_epoch=BOOT) is None, line


def test_it_stamps_records_with_their_own_time() -> None:
    kmsg_case = next(c for c in CASES if c.fmt == "kmsg" and _expected(c.expect)[0])
    event = kmsg.parse_record(kmsg_case.record, fmt="kmsg", boot_epoch=BOOT)
    usec = int(kmsg_case.record.split(",")[2])
    assert event is not None and event.ts == datetime.fromtimestamp(BOOT + usec / 1e6, UTC)
    journal_case = next(c for c in CASES if c.fmt == "journal" and _expected(c.expect)[0])
    event = kmsg.parse_record(journal_case.record, fmt="journal")
    assert event is not None and event.ts.year == 2025


@pytest.mark.parametrize(
    "prefix", ["8", "12", "14", "30", "86", "191", "-4", "x", "", "0x4", "٤", "4" * 30]
)
def test_it_refuses_a_kmsg_record_of_any_facility_but_the_kernels(prefix: str) -> None:
    record = f"{prefix},1,100,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, msg"
    assert kmsg.parse_record(record, fmt="kmsg", boot_epoch=BOOT) is None


@pytest.mark.parametrize("level", range(8))
def test_it_reads_the_kernels_records_at_every_level(level: int) -> None:
    record = f"{level},1,100,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, msg"
    event = kmsg.parse_record(record, fmt="kmsg", boot_epoch=BOOT)
    assert event is not None and event.code == 79


@pytest.mark.parametrize(
    "prefix",
    ["", " ", "[  123.456789] ", "kernel: ", "<4>", "Dec 07 01:00:00 node-0 kernel: ", "x: "],
)
def test_it_matches_driver_lines_only_at_the_start_of_the_message(prefix: str) -> None:
    for message in (
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.",
        "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.",
        "nvidia-nvswitch0: SXid (PCI:0000:87:00.0): 12028, Non-fatal, Link 61",
        "pcieport 0000:80:01.0: AER: Uncorrectable (Fatal) error message received from "
        "0000:81:00.0",
        "Out of memory: Killed process 102 (python) total-vm:1kB, anon-rss:1kB",
    ):
        event = kmsg.parse_message(prefix + message, datetime.now(UTC))
        assert (event is not None) == (prefix == ""), (prefix, message)
