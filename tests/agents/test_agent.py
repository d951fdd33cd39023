from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

import agents
from agents.agent import Agent, Config
from agents.cli import ConfigError, _parser, build_config
from agents.reporter import Reporter
from agents.spool import Identity
from faultline.testing.service import wait_for

from .conftest import StubIngest

ROOT = Path(__file__).resolve().parents[2]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAULTLINE_")}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def _run_until_shipped(args: list[str], env: dict[str, str], stub: StubIngest) -> str:
    """Start the agent, let it ship a batch, SIGTERM it; its stderr. It must exit 0.

    Not after a fixed sleep: on a loaded CI box a SIGTERM that landed before the agent had
    installed its handler ended it with -15, having shipped nothing to look at."""
    before = len(stub.batches)
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: len(stub.batches) > before, 30, "a batch from this run")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    return err


def test_it_loads_no_service_or_msgspec_module_at_runtime() -> None:
    # The integrations too: they import their framework (torch, torchft) only when called.
    code = (
        "import sys, agents.agent, agents.reporter, agents.cli, agents.listener, agents.launch,"
        " agents.torchrun, agents.launcher_env, agents.integrations.torchelastic,"
        " agents.integrations.torchft;"
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('django', 'msgspec', 'celery', 'channels', 'console', 'ingest', 'rest_framework',"
        " 'torch', 'torchft', 'numpy')"
        " or m == 'agents.protocol'];"
        "print(bad)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "[]"


def test_it_ships_samples_heartbeats_events_and_reporter_records(
    short_dir: Path, stub: StubIngest
) -> None:
    cfg = Config(
        server=stub.url,
        token="t",
        node="node-1",
        state_dir=short_dir / "s",
        interval=0.2,
        fake_gpus=8,
        fake_scripts=["3:xid79"],
        action_poll_s=0,
    )
    agent = Agent(cfg)
    thread = threading.Thread(target=agent.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    sock = short_dir / "s" / "reporter.sock"
    wait_for(sock.exists, 30, "the reporter socket")
    rep = Reporter(socket_path=str(sock), group="g", rank=2)
    rep.step(41, tokens=1000, loss=2.5)
    wait_for(lambda: any(r["kind"] == "step" for r in stub.records()), 30, "the step")
    wait_for(lambda: sum(r["kind"] == "heartbeat" for r in stub.records()) >= 2, 30, "2 beats")
    agent.stop_event.set()
    thread.join(timeout=15)
    records = stub.records()
    kinds = {r["kind"] for r in records}
    assert {"heartbeat", "device_sample", "device_event", "step"} <= kinds
    samples = [r for r in records if r["kind"] == "device_sample"]
    assert {r["index"] for r in samples} == set(range(8))
    xids = [r for r in records if r["kind"] == "device_event" and r["event"] == "xid"]
    assert [x["code"] for x in xids] == [79]
    assert [r["step"] for r in records if r["kind"] == "step"] == [41]
    assert stub.invalid == [] and stub.duplicates == 0
    beats = [r for r in records if r["kind"] == "heartbeat"]
    assert beats[-1]["uptime_s"] > beats[0]["uptime_s"]


def test_it_flushes_and_exits_zero_on_sigterm_and_continues_seq_after_restart(
    short_dir: Path, stub: StubIngest
) -> None:
    state = short_dir / "state"
    args = [
        sys.executable,
        "-m",
        "agents.cli",
        "run",
        "--server",
        stub.url,
        "--node",
        "n1",
        "--fake-gpus",
        "2",
        "--interval",
        "0.2",
        "--state-dir",
        str(state),
    ]
    env = _env(FAULTLINE_AGENT_TOKEN="tok")
    for _ in range(2):
        _run_until_shipped(args, env, stub)
    seqs = [b["seq"] for b in stub.batches]
    assert seqs == list(range(1, len(seqs) + 1))  # the restart continued, never reused
    assert len({b["agent"]["id"] for b in stub.batches}) == 1
    assert Identity(state).next_seq == seqs[-1] + 1


def test_it_reports_the_boot_id_it_is_given_so_a_restart_can_simulate_a_reboot(
    short_dir: Path, stub: StubIngest
) -> None:
    state = short_dir / "state"
    args = [sys.executable, "-m", "agents.cli", "run", "--server", stub.url, "--node", "n1"]
    args += ["--fake-gpus", "1", "--interval", "0.2", "--state-dir", str(state)]
    runs = [
        (["--boot-id", "boot-a"], {}),
        ([], {"FAULTLINE_AGENT_BOOT_ID": "boot-b"}),
        (["--boot-id", "boot-c"], {"FAULTLINE_AGENT_BOOT_ID": "boot-b"}),  # flag wins
        ([], {}),
    ]
    seen: list[set[str | None]] = []
    for flags, extra in runs:
        before = len(stub.batches)
        _run_until_shipped(args + flags, _env(FAULTLINE_AGENT_TOKEN="tok", **extra), stub)
        seen.append({b["agent"].get("boot_id") for b in stub.batches[before:]})
    kernel = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert seen == [{"boot-a"}, {"boot-b"}, {"boot-c"}, {kernel}]
    assert len({b["agent"]["id"] for b in stub.batches}) == 1  # same agent, new boot


def test_it_stops_with_exit_2_and_a_clear_message_when_the_token_is_refused(
    short_dir: Path, stub: StubIngest
) -> None:
    stub.script = [(401, {}, b"{}")] * 5
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "agents.cli",
            "run",
            "--server",
            stub.url,
            "--token",
            "bad",
            "--fake-gpus",
            "1",
            "--interval",
            "0.2",
            "--state-dir",
            str(short_dir / "s"),
        ],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert "refused this agent's token" in proc.stderr


def test_it_takes_the_token_from_a_file_and_settings_from_toml(tmp_path: Path, monkeypatch) -> None:
    for key in list(os.environ):
        if key.startswith("FAULTLINE_"):
            monkeypatch.delenv(key)
    (tmp_path / "token").write_text("secret-from-file\n")
    (tmp_path / "agent.toml").write_text(
        'server = "https://fl.example"\ninterval = 5\nfake_gpus = 4\n'
        'checkpoint_roots = [{path = "/ckpt", group = "llama", generation = 3}]\n'
        '[hooks]\ncordon = "kubectl cordon {node}"\n'
    )
    monkeypatch.setenv("FAULTLINE_AGENT_TOKEN_FILE", str(tmp_path / "token"))
    args = _parser().parse_args(
        ["run", "--config", str(tmp_path / "agent.toml"), "--interval", "2"]
    )
    cfg = build_config(args)
    assert cfg.token == "secret-from-file"
    assert cfg.server == "https://fl.example"
    assert cfg.interval == 2.0  # the flag beats the file
    assert cfg.fake_gpus == 4
    assert cfg.checkpoint_roots[0].group == "llama"
    assert cfg.hooks == {"cordon": "kubectl cordon {node}"}
    assert cfg.send_interval is None  # a batch every sampling interval unless told otherwise


def test_it_batches_every_send_interval_and_refuses_one_the_service_would_call_silence(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("FAULTLINE_AGENT_SEND_INTERVAL", "4")
    cfg = build_config(_parser().parse_args(["run", "--dry-run", "--interval", "1"]))
    assert (cfg.interval, cfg.send_interval) == (1.0, 4.0)
    agent = Agent(replace(cfg, state_dir=tmp_path, dry_run=True), out=io.StringIO())
    assert agent.sender.interval == 4.0  # sampling stays at 1 s; sending every 4 s
    for bad in ("0", "6"):
        with pytest.raises(ConfigError, match=r"send_interval .* at most 5 seconds"):
            build_config(_parser().parse_args(["run", "--dry-run", "--send-interval", bad]))


def test_the_replay_window_is_set_by_flag_environment_or_file_and_bounded(
    tmp_path: Path, monkeypatch
) -> None:
    def window(*args: str) -> float:
        return build_config(_parser().parse_args(["run", "--dry-run", *args])).replay_window_s

    assert window() == 30.0
    (tmp_path / "agent.toml").write_text("replay_window_s = 45\nreplay_max_mb = 8\n")
    cfg = build_config(
        _parser().parse_args(["run", "--dry-run", "--config", str(tmp_path / "agent.toml")])
    )
    assert (cfg.replay_window_s, cfg.replay_max_bytes) == (45.0, 8 * 1024 * 1024)
    monkeypatch.setenv("FAULTLINE_AGENT_REPLAY_WINDOW_S", "60")
    assert window() == 60.0
    assert window("--replay-window", "0") == 0.0  # the flag wins; 0 keeps nothing
    agent = Agent(replace(cfg, state_dir=tmp_path, dry_run=True), out=io.StringIO())
    assert agent.spool.replay.window_s == 45.0
    for bad in ("-1", "3601"):
        with pytest.raises(ConfigError, match="replay_window_s"):
            window("--replay-window", bad)


def test_check_exits_nonzero_when_the_server_is_unreachable(short_dir: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "agents.cli",
            "check",
            "--server",
            "http://127.0.0.1:9",
            "--token",
            "t",
            "--fake-gpus",
            "2",
            "--state-dir",
            str(short_dir / "s"),
        ],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 1
    assert "unreachable" in proc.stdout
    assert "gpu 1: GPU-" in proc.stdout


def test_check_exits_zero_when_everything_works(short_dir: Path, stub: StubIngest) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "agents.cli",
            "check",
            "--server",
            stub.url,
            "--token",
            "t",
            "--fake-gpus",
            "2",
            "--state-dir",
            str(short_dir / "s"),
        ],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stdout
    assert "reachable (HTTP 200)" in proc.stdout


def test_version_prints_the_package_version() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "agents.cli", "version"],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout.strip() == f"faultline-agent {agents.__version__}"


def test_it_delivers_what_it_spooled_while_the_server_was_down_after_a_restart(
    short_dir: Path, stub: StubIngest
) -> None:
    stub.stop()
    cfg = Config(
        server=stub.url,
        token="t",
        node="n1",
        state_dir=short_dir / "s",
        interval=0.05,
        fake_gpus=2,
        action_poll_s=0,
    )
    Agent(cfg).run(install_signals=False, max_ticks=4)  # nothing gets through
    assert stub.batches == []
    stub.start()
    Agent(cfg).run(install_signals=False, max_ticks=1)
    beats = [r for r in stub.records() if r["kind"] == "heartbeat"]
    samples = [r for r in stub.records() if r["kind"] == "device_sample"]
    assert len(beats) == 5 and len(samples) == 10  # 4 ticks offline + 1 online
    assert stub.invalid == [] and stub.duplicates == 0
