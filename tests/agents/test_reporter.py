from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from agents import listener as listener_mod
from agents.listener import Listener, check
from agents.protocol import (
    Checkpoint,
    ContractError,
    Probe,
    Process,
    ProcessGroups,
    Serving,
    Step,
    Transition,
    decode_batch,
)
from agents.protocol import Collective as CollectiveRecord
from agents.reporter import Reporter, checksum, classify_exception, scrub

from .conftest import validate

ROOT = Path(__file__).resolve().parents[2]


def _listen(short_dir: Path) -> tuple[Listener, list[dict[str, Any]]]:
    got: list[dict[str, Any]] = []
    lis = Listener(got.append, socket_path=short_dir / "r.sock")
    lis.start()
    return lis, got


def _wait_for(got: list, n: int, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < end:
        time.sleep(0.01)


def test_it_never_raises_and_counts_drops_when_no_agent_listens(short_dir: Path) -> None:
    rep = Reporter(socket_path=str(short_dir / "nobody.sock"), group="g")
    rep.step(1, loss=1.0)
    rep.transition("running")
    rep.collective([{"seq": 1, "op": "all_reduce"}])
    rep.step(2, loss=object())  # not JSON-serialisable: dropped, not raised
    assert rep.dropped == 4 and rep.sent == 0


def test_it_delivers_every_workload_kind_as_valid_contract_records(short_dir: Path) -> None:
    lis, got = _listen(short_dir)
    rep = Reporter(socket_path=lis.socket_path, group="llama", generation=3, rank=5)
    rep.step(
        10,
        tokens=4096,
        loss=math.nan,
        duration_ms=812.5,
        phases={"compute": 600.0, "collective": 200.0},
    )
    rep.collective(
        [
            {
                "seq": 7,
                "pg": "default",
                "op": "all_reduce",
                "numel": 1024,
                "dtype": "bfloat16",
                "state": "started",
            }
        ]
    )
    rep.checkpoint("ckpt-10", "committed", step=10, data_cursor=40960)
    rep.transition(
        "running",
        from_state="initializing",
        world_size=8,
        topology={"dp": 2, "tp": 4, "pp": 1, "ep": 1},
        objectives={"rpo_steps": 16, "rto_s": 120.0, "consistency": "allow_repeat"},
    )
    rep.serving_window("w0", {"seconds": 10.0, "requests": 0}, ready=True)
    rep.process("started")
    _wait_for(got, 6)
    lis.stop()
    batch = validate(got)
    types = [type(r) for r in batch.records]
    assert types == [Step, CollectiveRecord, Checkpoint, Transition, Serving, Process]
    assert got[0]["loss"] == "NaN" and got[0]["rank"] == 5 and got[0]["generation"] == 3
    assert batch.records[2].data_cursor == 40960  # where a restore resumes
    objectives = batch.records[3].objectives
    assert objectives is not None and objectives.rpo_steps == 16
    assert objectives.consistency == "allow_repeat"
    assert rep.dropped == 0


def test_it_rejects_device_kinds_and_unknown_fields_from_workloads() -> None:
    assert check(b'{"kind":"device_event","gpu":"GPU-1","event":"xid","code":79}')[0] is None
    assert check(b'{"kind":"step","group":"g","generation":1,"rank":0,"step":1,"x":1}')[0] is None
    assert check(b'{"kind":"step","group":"g","generation":1}')[0] is None
    assert check(b"not json")[0] is None
    ok, _ = check(b'{"kind":"step","group":"g","generation":1,"rank":0,"step":1}')
    assert ok is not None and ok["ts"].endswith("Z")  # only a missing ts is stamped


def test_it_turns_a_bare_nan_from_a_foreign_sender_into_the_contract_string() -> None:
    rec, _ = check(b'{"kind":"step","group":"g","generation":1,"rank":0,"step":1,"loss":NaN}')
    assert rec is not None and rec["loss"] == "NaN"
    validate([rec])


def test_its_listener_fields_match_the_contract_structs() -> None:
    structs = {
        "process": Process,
        "step": Step,
        "collective": CollectiveRecord,
        "checkpoint": Checkpoint,
        "transition": Transition,
        "serving": Serving,
        "probe": Probe,
        "process_groups": ProcessGroups,
    }
    for kind, struct in structs.items():
        contract = set(struct.__struct_fields__) - {"ts"}
        assert listener_mod.FIELDS[kind] == contract, kind


def test_it_classifies_oom_by_exception_type_name() -> None:
    class OutOfMemoryError(RuntimeError):  # torch.OutOfMemoryError's shape, without torch
        pass

    assert classify_exception(OutOfMemoryError("CUDA out of memory")) == "oom"
    assert classify_exception(MemoryError()) == "oom"
    assert classify_exception(ValueError("x")) == "exception"
    assert classify_exception(KeyboardInterrupt()) == "interrupted"


def test_it_scrubs_paths_and_long_numbers_and_truncates_messages() -> None:
    text = scrub("cannot open /home/alice/data/shard_000123.bin for sample 9876543210 " * 10)
    assert "alice" not in text and "9876543210" not in text
    assert "<path>" in text and "<n>" in text
    assert len(text) <= 200


def _run_child(
    short_dir: Path, body: str, *, kill_after: float | None = None
) -> list[dict[str, Any]]:
    lis, got = _listen(short_dir)
    code = textwrap.dedent(f"""
        import time
        from agents import reporter
        reporter.init(group="g", generation=2, rank=1, socket_path={lis.socket_path!r})
        {body}
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stderr=subprocess.PIPE,
    )
    if kill_after is not None:
        time.sleep(kill_after)
        proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=20)
    _wait_for(got, 2)
    lis.stop()
    validate(got)
    return got


def test_it_reports_started_and_a_clean_exit(short_dir: Path) -> None:
    got = _run_child(short_dir, "reporter.step(1)")
    events = [
        (r.get("event"), r.get("reason"), r.get("exit_code")) for r in got if r["kind"] == "process"
    ]
    assert events == [("started", None, None), ("exited", "clean", 0)]


def test_it_reports_an_uncaught_oom_with_its_type(short_dir: Path) -> None:
    got = _run_child(
        short_dir,
        textwrap.dedent("""
        class OutOfMemoryError(RuntimeError):
            pass
        raise OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
    """).replace("\n", "\n        "),
    )
    exited = [r for r in got if r.get("event") == "exited"]
    assert len(exited) == 1
    assert exited[0]["reason"] == "oom"
    assert exited[0]["error_type"] == "OutOfMemoryError"
    # Bounded and scrubbed here (the service scrubs it again as it stores it).
    assert exited[0]["message"] == "CUDA out of memory. Tried to allocate 20.00 GiB"


def test_it_reports_a_sigterm_and_still_dies_of_it(short_dir: Path) -> None:
    got = _run_child(short_dir, "time.sleep(30)", kill_after=1.0)
    exited = [r for r in got if r.get("event") == "exited"]
    assert [(r["reason"], r["signal"]) for r in exited] == [("killed", signal.SIGTERM)]


def test_it_reports_the_exit_code_given_to_sys_exit(short_dir: Path) -> None:
    got = _run_child(short_dir, "import sys; sys.exit(3)")
    exited = [r for r in got if r.get("event") == "exited"]
    assert [(r["exit_code"], r["reason"]) for r in exited] == [(3, "exit_code")]


def test_it_falls_back_to_loopback_udp_when_configured(short_dir: Path) -> None:
    got: list[dict[str, Any]] = []
    lis = Listener(got.append, socket_path=short_dir / "r.sock", udp_port=0)
    lis.start()
    rep = Reporter(
        socket_path=str(short_dir / "absent.sock"), udp=("127.0.0.1", lis.udp_port), group="g"
    )
    rep.step(5)
    _wait_for(got, 1)
    lis.stop()
    assert [r["step"] for r in got] == [5] and rep.sent == 1


def test_it_never_blocks_when_the_agent_stops_reading(short_dir: Path) -> None:
    import socket

    stuck = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    stuck.bind(str(short_dir / "stuck.sock"))  # bound, never read: its queue fills up
    rep = Reporter(socket_path=str(short_dir / "stuck.sock"), group="g")
    started = time.monotonic()
    for n in range(2000):
        rep.step(n)
    elapsed = time.monotonic() - started
    stuck.close()
    assert rep.dropped > 0 and rep.sent + rep.dropped == 2000
    assert elapsed < 1.0


# -- correctness probes and correlation -----------------------------------------
GOLDEN = Path(__file__).parent / "golden"


def test_it_accepts_every_golden_v1_batch_forever() -> None:
    for path in sorted(GOLDEN.glob("v1_*.json")):
        assert decode_batch(path.read_bytes()).records, path
    batch = decode_batch((GOLDEN / "v1_probe_and_correlation.json").read_bytes())
    assert "probe" in [r.__struct_config__.tag for r in batch.records]


def test_it_refuses_a_probe_checksum_that_is_not_hex() -> None:
    body = json.loads((GOLDEN / "v1_probe_and_correlation.json").read_text())
    body["records"][2]["checksum"] = "not hex!"
    with pytest.raises(ContractError, match="checksum"):
        decode_batch(json.dumps(body).encode())


def test_it_runs_the_registered_probe_every_n_steps(short_dir: Path) -> None:
    lis, got = _listen(short_dir)
    rep = Reporter(socket_path=lis.socket_path, group="llama", generation=2, rank=1)
    calls: list[int] = []
    rep.set_probe(lambda: calls.append(1) or 0.5, every=3, name="fixed_batch_loss")
    for n in range(1, 8):
        rep.step(n)
    _wait_for(got, 9)
    lis.stop()
    probes = [r for r in got if r["kind"] == "probe"]
    assert [p["step"] for p in probes] == [3, 6] and len(calls) == 2
    assert probes[0]["value"] == 0.5 and probes[0]["step_id"] == "g2:s3"
    assert probes[0]["rank"] == 1 and probes[0]["probe"] == "fixed_batch_loss"
    steps = [r for r in got if r["kind"] == "step"]
    assert [s["step_id"] for s in steps][:2] == ["g2:s1", "g2:s2"]
    validate(got)


def test_it_reports_a_checksum_probe_and_a_serving_probe(short_dir: Path) -> None:
    lis, got = _listen(short_dir)
    rep = Reporter(socket_path=lis.socket_path, group="chat")
    rep.set_probe(lambda: b"\x00\x01logits", every=1, name="forward")
    rep.step(1)
    rep.probe("fixed_request", checksum=checksum([17, 4, 99]), worker="w0", model_version="m1")
    _wait_for(got, 3)
    lis.stop()
    forward, serving = (r for r in got if r["kind"] == "probe")
    assert forward["checksum"] == checksum(b"\x00\x01logits") and "value" not in forward
    assert serving["worker"] == "w0" and "rank" not in serving and "generation" not in serving
    assert checksum([0.1, 0.2]) != checksum([0.1, 0.2000000001])
    validate(got)


def test_it_swallows_a_probe_that_raises_and_counts_it(short_dir: Path) -> None:
    rep = Reporter(socket_path=str(short_dir / "nobody.sock"), group="g")
    rep.set_probe(lambda: 1 / 0, every=1)
    rep.step(1)
    rep.step(2)
    assert rep.probe_errors == 2


def test_a_launcher_reports_a_serving_workers_exit_in_the_contract(short_dir: Path) -> None:
    lis, got = _listen(short_dir)
    rep = Reporter(socket_path=lis.socket_path, group="chat")
    rep.serving_exit("w1", active=2, queued=1, exit_code=137)
    _wait_for(got, 1)
    lis.stop()
    (rec,) = got
    assert rec["kind"] == "serving" and rec["worker"] == "w1" and rec["ready"] is False
    assert rec["window"] == {"seconds": 1.0, "active": 2, "queued": 1, "exited": True,
                             "exit_code": 137}  # fmt: skip
    assert rep.dropped == 0
    validate(got)


def test_a_socket_path_too_long_to_bind_says_which_path_and_what_to_do(short_dir: Path) -> None:
    """The drill's agent under pytest's tmp_path died with "AF_UNIX path too long", which
    named neither the path nor the fix, and the drill waited 30 s for its socket."""
    deep = short_dir / ("d" * 120) / "reporter.sock"
    with pytest.raises(ValueError, match=r"over the 107 a Unix socket allows: .*--state-dir"):
        Listener(lambda rec: None, socket_path=deep).start()


def test_process_groups_say_whether_they_left_and_are_sent_again_until_they_do(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Membership is sent once a minute: one datagram the agent's full buffer dropped hid a
    rank's process groups for that long (rank 2 and 4 of six, in CI). The reporter says
    whether the record left; the recorder tries again on the next step until it does."""
    import socket

    from agents.torch import Recorder

    stuck = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    stuck.bind(str(short_dir / "stuck.sock"))
    stuck.setblocking(False)
    rep = Reporter(socket_path=str(short_dir / "stuck.sock"), group="g")
    groups = [{"pg": "default", "size": 2}]
    while rep.dropped == 0:
        rep.step(1)  # until its queue is full
    rec = Recorder(rep)
    monkeypatch.setattr(rec, "process_groups", lambda: groups)
    rec._send_groups()
    assert rec._groups_sent is None  # dropped: not taken as sent
    with contextlib.suppress(BlockingIOError):
        while True:
            stuck.recv(65536)  # the agent catches up
    rec._send_groups()
    assert rec._groups_sent == groups
    sent = rep.sent
    rec._send_groups()
    assert rep.sent == sent  # sent, unchanged and fresh: not again
    received = []
    with contextlib.suppress(BlockingIOError):
        while True:
            received.append(json.loads(stuck.recv(65536)))
    stuck.close()
    assert [r["kind"] for r in received] == ["process_groups"]
    assert received[0]["groups"] == groups
