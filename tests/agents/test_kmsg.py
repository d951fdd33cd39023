"""The kernel-log parser and reader against captured lines (tests/agents/fixtures/kmsg/)."""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from agents import kmsg

FIXTURES = Path(__file__).parent / "fixtures" / "kmsg"
BOOT = 1_764_500_000.0  # the boot time the captured records are stamped against


def _events(name: str, fmt: str) -> list[kmsg.KernelEvent]:
    return kmsg.parse_lines((FIXTURES / name).read_text().splitlines(), fmt=fmt, boot_epoch=BOOT)


def test_it_finds_every_kind_of_evidence_in_the_captured_kmsg_records() -> None:
    got = [(e.event, e.device, e.code, e.pid, e.comm, e.severity)
           for e in _events("kmsg.txt", "kmsg")]  # fmt: skip
    assert got == [
        ("xid", "0000:3b:00", 79, 2817, "python", None),
        ("gpu_off_bus", "0000:3b:00", None, None, None, None),
        ("xid", "0000:5e:00", 13, None, None, None),  # pid='<unknown>', name=<unknown>
        ("xid", "0000:5e:00", 48, 3001, None, None),
        ("sxid", "0000:c8:00", 20034, None, None, "fatal"),
        ("sxid", "0000:87:00", 12028, None, None, "nonfatal"),
        ("aer_corrected", "0000:01:00", None, None, None, "corrected"),
        ("aer_corrected", "0000:01:00", None, None, None, "corrected"),  # its Bus Error line
        ("aer_nonfatal", "0000:81:00", None, None, None, "nonfatal"),
        ("aer_fatal", "0000:81:00", None, None, None, "fatal"),
        ("oom_kill", None, None, 4242, "python", None),
        ("oom_kill", None, None, 5151, "pt_main_thread", None),
        ("mce", None, None, None, None, None),
        ("mce", None, None, None, None, None),  # "Machine check events logged"
        ("hung_task", None, None, 4243, "python", None),
        ("io_error", "nvme1n1", None, None, None, None),
        ("io_error", "sdb", None, None, None, None),
    ]


def test_it_stamps_a_kmsg_record_at_boot_time_plus_its_microseconds() -> None:
    line = "4,1842,97312090,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=2817, name=python, x"
    message, ts = kmsg.parse_kmsg_record(line, BOOT) or ("", None)
    assert message.startswith("NVRM: Xid")
    assert ts == datetime.fromtimestamp(BOOT + 97.312090, UTC)


@pytest.mark.parametrize(
    "line", [" SUBSYSTEM=pci", " DEVICE=+pci:0000:5e:00.0", "no semicolon", "6,1,x,-;msg", ""]
)
def test_it_skips_continuation_and_malformed_kmsg_records(line: str) -> None:
    assert kmsg.parse_kmsg_record(line, BOOT) is None


def test_it_reads_the_journal_json_of_journalctl_k() -> None:
    got = [(e.event, e.pid, e.comm, e.ts) for e in _events("journal.jsonl", "journal")]
    assert got == [
        ("xid", 2817, "python", datetime.fromtimestamp(1764587000.123456, UTC)),
        ("oom_kill", 4242, "python", datetime.fromtimestamp(1764587001, UTC)),
        ("hung_task", 777, "pt_data_worker", datetime.fromtimestamp(1764587002, UTC)),
    ]


def test_it_normalises_every_spelling_of_a_pci_address() -> None:
    for spelling in ("PCI:0000:3b:00", "00000000:3B:00.0", "0000:3b:00.0", "0000:3b:00"):
        assert kmsg.pci_key(spelling) == "0000:3b:00"


def test_it_keeps_task_names_to_the_kernels_sixteen_characters() -> None:
    e = kmsg.parse_message("INFO: task a_very_long_task_name_indeed:9 blocked for more than "
                           "120 seconds.", datetime.now(UTC))  # fmt: skip
    assert e is not None and e.comm == "a_very_long_task" and e.pid == 9


def test_it_falls_back_to_journalctl_when_kmsg_cannot_be_opened(tmp_path: Path) -> None:
    script = tmp_path / "journalctl"
    script.write_text(f"#!/bin/sh\ncat {FIXTURES / 'journal.jsonl'}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    seen: list[kmsg.KernelEvent] = []
    reader = kmsg.KernelLog(seen.append, path=str(tmp_path / "no-kmsg"), journalctl=str(script))
    reader.start()
    assert reader._thread is not None
    reader._thread.join(timeout=10)
    assert reader.source == "journal"
    assert [e.event for e in seen] == ["xid", "oom_kill", "hung_task"]


def test_it_says_once_that_there_is_no_kernel_log_and_stops(tmp_path: Path, caplog) -> None:
    reader = kmsg.KernelLog(lambda e: None, path=str(tmp_path / "no-kmsg"), journalctl="")
    with caplog.at_level(logging.WARNING, logger="faultline.agent.kmsg"):
        reader.start()
        assert reader._thread is not None
        reader._thread.join(timeout=5)
    assert reader.source is None
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "CAP_SYSLOG" in warnings[0]


def test_it_follows_kmsg_records_as_they_arrive_and_stops_promptly(tmp_path: Path) -> None:
    fifo = tmp_path / "kmsg"
    os.mkfifo(fifo)
    seen: list[kmsg.KernelEvent] = []
    got = threading.Event()

    def sink(event: kmsg.KernelEvent) -> None:
        seen.append(event)
        got.set()

    reader = kmsg.KernelLog(sink, path=str(fifo), journalctl="")
    reader.start()
    writer = os.open(fifo, os.O_WRONLY)  # blocks until the reader has opened it
    try:
        lines = (
            "6,1,100,-;eth0: renamed from veth1\n",
            "3,2,200,-;Out of memory: Killed process 9 (python) total-vm:1kB\n",
            "0,3,300,-;mce: [Hardware Error]: CPU 1: Machine Check: 0 Bank 4: b2\n",
        )
        for line in lines:
            got.clear()
            os.write(writer, line.encode())
            if "eth0" not in line:
                assert got.wait(5), line
            else:
                time.sleep(0.2)
        assert [e.event for e in seen] == ["oom_kill", "mce"]
        assert reader.source == "kmsg"
        started = time.monotonic()
        reader.stop()
        assert time.monotonic() - started < 1.5  # a quiet kernel log never holds shutdown
    finally:
        os.close(writer)


def test_it_reads_one_whole_kmsg_read_as_its_record_without_the_dictionary() -> None:
    # What one read(2) of /dev/kmsg returns: the record, then its dictionary lines.
    data = ("4,3001,8000000,-;NVRM: The NVIDIA GPU 0000:3b:00.0\\x0aNVRM: (PCI ID: 10de:2330) "
            "installed in this system has\\x0aNVRM: fallen off the bus and is not responding to "
            "commands.\n SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n")  # fmt: skip
    message, _ = kmsg.parse_kmsg_record(data, BOOT) or ("", None)
    assert message.split("\n") == [
        "NVRM: The NVIDIA GPU 0000:3b:00.0",
        "NVRM: (PCI ID: 10de:2330) installed in this system has",
        "NVRM: fallen off the bus and is not responding to commands.",
    ]
    event = kmsg.parse_message(message, datetime.now(UTC))
    assert event is not None and (event.event, event.device) == ("gpu_off_bus", "0000:3b:00")
