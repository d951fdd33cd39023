"""A checkpoint root every node mounts: one node per group reports and hashes it."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import agents.checkpoints as ck
from agents.agent import Agent, Config
from agents.checkpoints import FOLLOW, LEAD, SKIP, CheckpointWatcher, RootConfig
from agents.cli import ConfigError, _parser, build_config
from agents.reporter import Reporter

from .conftest import StubIngest, validate
from .test_actions_contract import shipped_configs


class CountingWatcher(CheckpointWatcher):
    """A watcher that counts the bytes it reads to hash shards."""

    hashed = 0

    def _hash(self, path: Path) -> str:
        self.hashed += path.stat().st_size
        return super()._hash(path)


class Node:
    """One node's watcher over the shared root, with its own state dir."""

    def __init__(self, tmp_path: Path, name: str, root: Path) -> None:
        self.got: list[dict[str, Any]] = []
        self.state = tmp_path / name
        self.root = root
        self.before = 0  # bytes hashed by this node's earlier watchers (agent restarts)
        self.watcher = self._watcher()

    def _watcher(self) -> CountingWatcher:
        return CountingWatcher(
            [RootConfig(self.root, shared=True)], self.got.append, state_dir=self.state
        )

    @property
    def hashed(self) -> int:
        return self.before + self.watcher.hashed

    def restart(self) -> None:
        """The agent process restarts: a new watcher on the same state dir."""
        self.before = self.hashed
        self.watcher = self._watcher()

    def scan(self) -> None:
        self.watcher.scan()
        self.watcher.drain_verification()


def _dcp(root: Path, step: int, generation: int, shards: int = 2) -> Path:
    """A torch DCP checkpoint mid-write: shards, no .metadata yet (staging)."""
    ckpt = root / f"step_{step:06d}"
    ckpt.mkdir(parents=True)
    meta = {"group": "llama", "generation": generation, "step": step}
    (ckpt / "faultline.json").write_text(json.dumps(meta))
    for i in range(shards):
        (ckpt / f"__{i}_0.distcp").write_bytes(bytes([i]) * 1000)
    return ckpt


def _committed(root: Path, step: int, generation: int) -> Path:
    ckpt = _dcp(root, step, generation)
    (ckpt / ".metadata").write_bytes(b"meta")
    (ckpt / "COMMITTED").touch()
    return ckpt


def _phases(node: Node) -> list[tuple[int, str]]:
    return [(r["step"], r["phase"]) for r in node.got]


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranks that are not rank 0 follow at once (no wait for rank 0 to speak)."""
    monkeypatch.setattr(ck, "SETTLE_S", 0.0)


def test_only_the_node_of_rank_0_reports_and_hashes_a_shared_checkpoint(
    tmp_path: Path, settled: None
) -> None:
    root = tmp_path / "lustre"
    lead, follower, bystander = (Node(tmp_path, n, root) for n in ("a", "b", "c"))
    lead.watcher.saw("llama", 3, 0)
    lead.watcher.saw("llama", 3, 1)
    follower.watcher.saw("llama", 3, 8)
    bystander.watcher.saw("other-job", 1, 0)  # rank 0 of another group only
    nodes = (lead, follower, bystander)
    assert [n.watcher.role("llama") for n in nodes] == [LEAD, FOLLOW, SKIP]
    ckpt = _dcp(root, 100, 3)
    for n in nodes:
        n.scan()
    (ckpt / ".metadata").write_bytes(b"meta")
    for _ in range(2):  # written, then committed once sizes held still for a scan
        for n in nodes:
            n.scan()
    assert _phases(lead) == [(100, "staging"), (100, "written"), (100, "committed"),
                             (100, "verified")]  # fmt: skip
    validate(lead.got)
    assert follower.got == [] and bystander.got == []
    assert lead.hashed == 2004 and follower.hashed == 0 and bystander.hashed == 0
    # The follower followed it (a takeover must not report it again); the bystander did
    # not even list its files.
    assert follower.watcher._seen[str(ckpt)].phase == "committed"
    assert follower.watcher._seen[str(ckpt)].elsewhere
    assert bystander.watcher._seen == {}


def test_after_a_restart_moves_rank_0_its_new_node_reports_only_what_changes(
    tmp_path: Path, settled: None
) -> None:
    root = tmp_path / "lustre"
    old, new = Node(tmp_path, "a", root), Node(tmp_path, "b", root)
    old.watcher.saw("llama", 3, 0)
    new.watcher.saw("llama", 3, 8)
    _committed(root, 100, 3)
    old.scan()
    new.scan()
    assert _phases(old) == [(100, "committed"), (100, "verified")] and new.got == []
    # Generation 4 restarts with rank 0 on the other node (the agents restart too).
    new.restart()
    old.restart()
    new.watcher.saw("llama", 4, 0)
    old.watcher.saw("llama", 4, 8)
    assert (old.watcher.role("llama"), new.watcher.role("llama")) == (FOLLOW, LEAD)
    hashed = new.hashed
    ckpt = _dcp(root, 200, 4)
    for n in (old, new):
        n.scan()
    (ckpt / "COMMITTED").touch()
    (ckpt / ".metadata").write_bytes(b"meta")
    for n in (old, new):
        n.scan()
    # step 100 is neither reported again nor hashed again by the new lead
    assert _phases(new) == [(200, "staging"), (200, "committed"), (200, "verified")]
    assert new.hashed - hashed == 2004
    assert _phases(old) == [(100, "committed"), (100, "verified")]
    validate(new.got)


def test_a_new_generation_waits_for_rank_0_to_speak_before_following(tmp_path: Path) -> None:
    """Ranks of a restart start one by one: a node whose rank 3 spoke first must not
    follow (and so swallow) a phase that its rank 0, a moment later, makes its to report."""
    root = tmp_path / "lustre"
    node = Node(tmp_path, "a", root)
    node.watcher.saw("llama", 4, 3)
    assert node.watcher.role("llama") == SKIP
    _committed(root, 300, 4)
    node.scan()
    assert node.got == [] and node.watcher._seen == {}
    node.watcher.saw("llama", 4, 0)
    node.scan()
    assert _phases(node) == [(300, "committed"), (300, "verified")]


def test_roles_change_with_generations_and_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = Node(tmp_path, "a", tmp_path / "lustre")
    w = node.watcher
    w.saw("llama", 5, 0)
    assert w.role("llama") == LEAD
    w.saw("llama", 4, 2)  # a late record of an older generation changes nothing
    assert w.role("llama") == LEAD
    w.saw("llama", 6, 2)  # the next generation, rank 0 elsewhere so far
    assert w.role("llama") == SKIP
    monkeypatch.setattr(ck, "SETTLE_S", 0.0)
    assert w.role("llama") == FOLLOW
    for bad in ((None, 6, 0), ("llama", "6", 0), ("llama", 6, True), ("", 6, 0), (3, 6, 0)):
        w.saw(*bad)
    assert w.role("llama") == FOLLOW
    assert w.role("never-here") == SKIP
    # A group not heard of for HOSTED_FOR_S is no longer hosted here.
    monkeypatch.setattr(ck, "HOSTED_FOR_S", 0.0)
    time.sleep(0.01)
    assert w.role("llama") == SKIP


def test_an_agent_restart_keeps_which_groups_it_leads(tmp_path: Path) -> None:
    root = tmp_path / "lustre"
    node = Node(tmp_path, "a", root)
    node.watcher.saw("llama", 3, 0)
    node.scan()  # saves its state
    node.restart()
    assert node.watcher.role("llama") == LEAD
    _committed(root, 100, 3)
    node.scan()
    assert _phases(node) == [(100, "committed"), (100, "verified")]


def test_an_unshared_root_is_reported_whatever_runs_here(tmp_path: Path) -> None:
    root = tmp_path / "local-nvme"
    got: list[dict[str, Any]] = []
    watcher = CheckpointWatcher([RootConfig(root)], got.append, state_dir=tmp_path / "st")
    _committed(root, 100, 3)
    watcher.scan()
    assert [r["phase"] for r in got] == ["committed"]


def test_the_shipped_daemonset_marks_its_root_shared_and_a_bad_value_is_refused(
    tmp_path: Path,
) -> None:
    daemonset = str(shipped_configs(tmp_path)["daemonset"])
    cfg = build_config(_parser().parse_args(["run", "--dry-run", "--config", daemonset]))
    assert [(str(r.path), r.shared) for r in cfg.checkpoint_roots] == [("/mnt/ckpt", True)]
    bad = tmp_path / "bad.toml"
    bad.write_text('checkpoint_roots = [{path = "/ckpt", shared = "yes"}]\n')
    with pytest.raises(ConfigError, match="shared must be true or false"):
        build_config(_parser().parse_args(["run", "--dry-run", "--config", str(bad)]))


def test_two_agents_on_one_shared_root_send_one_copy_through_the_reporter_s_ranks(
    short_dir: Path, stub: StubIngest
) -> None:
    """Through the whole agent: the workload's own records (rank 0 here, rank 8 there),
    over the reporter socket, decide which agent sends the checkpoint."""
    root = short_dir / "lustre"
    agents: list[Agent] = []
    threads = []
    for name in ("node-a", "node-b"):
        cfg = Config(
            server=stub.url, token="t", node=name, state_dir=short_dir / name, interval=0.2,
            fake_gpus=1, action_poll_s=0, checkpoint_roots=[RootConfig(root, shared=True)],
        )  # fmt: skip
        agent = Agent(cfg)
        agents.append(agent)
        threads.append(threading.Thread(target=agent.run, kwargs={"install_signals": False}))
        threads[-1].start()
    try:
        time.sleep(0.5)
        for name, rank in (("node-a", 0), ("node-b", 8)):
            rep = Reporter(socket_path=str(short_dir / name / "reporter.sock"), group="llama",
                           rank=rank, generation=3)  # fmt: skip
            rep.step(41, tokens=1000)
        deadline = time.monotonic() + 10
        lead = agents[0].watcher
        assert lead is not None
        while lead.role("llama") != LEAD and time.monotonic() < deadline:
            time.sleep(0.05)
        _committed(root, 100, 3)
        while time.monotonic() < deadline and not any(
            r["kind"] == "checkpoint" and r["phase"] == "verified" for r in stub.records()
        ):
            time.sleep(0.1)
        time.sleep(1.5)  # more scans of both agents: nothing more may come
    finally:
        for agent in agents:
            agent.stop_event.set()
        for thread in threads:
            thread.join(timeout=15)
    sent = [
        (b["agent"]["node"], r["phase"])
        for b in stub.batches
        for r in b["records"]
        if r["kind"] == "checkpoint"
    ]
    assert sent == [("node-a", "committed"), ("node-a", "verified")]
    assert stub.invalid == []
