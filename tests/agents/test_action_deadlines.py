"""What a node refuses without running it, and never leaves "running": an action past the
deadline it carries, a parameter the backend cannot use, a hook or backend that raises."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents import actions_contract as contract
from agents import schedulers, signing
from agents.executor import Executor

from .conftest import StubIngest
from .fake_schedulers import FakeSchedulers
from .test_executor import KEY, TOKEN, _action, _executor

NOW = datetime(2026, 12, 3, 10, 0, tzinfo=UTC)


@pytest.fixture
def fakes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSchedulers:
    """A fake kubectl first on PATH (tests/agents/fake_schedulers.py)."""
    fake = FakeSchedulers(tmp_path / "sched")
    for key, value in fake.env().items():
        monkeypatch.setenv(key, value)
    return fake


def _at(now: datetime):
    return lambda: now


def _ran(tmp_path: Path) -> bool:
    return (tmp_path / "ran.txt").exists()


# -- deadlines ------------------------------------------------------------------------------


def test_it_refuses_and_reports_an_action_past_its_deadline(
    tmp_path: Path, stub: StubIngest
) -> None:
    action = _action(deadline=contract.deadline_text(NOW - timedelta(seconds=1)))
    executor = _executor(tmp_path, server=stub.url, clock=_at(NOW))
    result = executor.handle(action)
    assert result is not None and result["status"] == "failed"
    assert "deadline 2026-12-03T09:59:59Z has passed" in result["output"]
    assert not _ran(tmp_path)
    # Reported, so the service hears why (it may have failed the action already: 409 is fine).
    assert stub.results["a1"]["status"] == "failed"
    assert executor.done["a1"]["reported"] is True


def test_it_refuses_a_replay_after_the_deadline_even_with_its_state_lost(tmp_path: Path) -> None:
    action = _action(deadline=contract.deadline_text(NOW + timedelta(minutes=15)))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert _executor(tmp_path / "a", clock=_at(NOW)).handle(action)["status"] == "succeeded"
    # executor.json gone (a reinstalled node): the id is unknown, the deadline still holds.
    later = _executor(tmp_path / "b", clock=_at(NOW + timedelta(minutes=16)))
    assert "has passed" in later.handle(action)["output"]


@settings(max_examples=60, deadline=None)
@given(offset=st.integers(min_value=-(10**6), max_value=10**6))
def test_it_runs_an_action_exactly_while_its_deadline_is_ahead(
    tmp_path_factory: pytest.TempPathFactory, offset: int
) -> None:
    state = tmp_path_factory.mktemp("deadline")
    deadline = NOW + timedelta(milliseconds=offset)
    action = _action(deadline=contract.deadline_text(deadline))
    result = _executor(state, clock=_at(NOW)).handle(action)
    assert (result["status"] == "succeeded") == (offset > 0), (offset, result["output"])
    assert _ran(state) == (offset > 0)


@pytest.mark.parametrize(
    "deadline", ["tomorrow", "2026-12-03T11:00:00", 1796000000, None, "", ["2026-12-03T11:00Z"]]
)
def test_it_refuses_a_deadline_it_cannot_read(tmp_path: Path, deadline: Any) -> None:
    result = _executor(tmp_path, clock=_at(NOW)).handle(_action(deadline=deadline))
    assert result["status"] == "failed"
    assert "is not an ISO 8601 time with a zone" in result["output"]
    assert not _ran(tmp_path)


def test_it_still_runs_an_action_from_a_service_that_sends_no_deadline(tmp_path: Path) -> None:
    assert _executor(tmp_path, clock=_at(NOW)).handle(_action())["status"] == "succeeded"


def test_the_deadline_is_signed_so_it_cannot_be_moved_or_removed(tmp_path: Path) -> None:
    action = _action(deadline=contract.deadline_text(NOW - timedelta(minutes=1)))
    moved = {**action, "deadline": contract.deadline_text(NOW + timedelta(days=1))}
    removed = {k: v for k, v in action.items() if k != "deadline"}
    executor = _executor(tmp_path, clock=_at(NOW))
    assert executor.handle(moved)["output"] == "dropped: bad signature"
    assert executor.handle(removed)["output"] == "dropped: bad signature"
    assert not _ran(tmp_path)


# -- a parameter the backend cannot use -----------------------------------------------------

NODE = "gpu-node-017"


def _k8s_action(n: int, **params: Any) -> dict[str, Any]:
    params = {"reason": "xid 79", "dry_run": False, **params}
    body = {"id": n, "kind": contract.DRAIN_NODE, "target": f"node:{NODE}", "group": None,
            "generation": None, "params": params}  # fmt: skip
    return signing.sign(body, KEY)


@pytest.mark.parametrize(
    "timeout", ["5m", 1.5, True, 0, -1, 86_401, [300], "\uff13\uff10\uff10", "300s", " 300"]
)
def test_it_refuses_a_drain_timeout_that_is_not_whole_seconds_and_reports_it(
    tmp_path: Path, fakes: FakeSchedulers, stub: StubIngest, timeout: Any
) -> None:
    executor = Executor(tmp_path, node=NODE, hooks={}, scheduler="kubernetes", token=TOKEN,
                        server=stub.url)  # fmt: skip
    result = executor.handle(_k8s_action(1, drain_timeout_s=timeout))
    assert result is not None and result["status"] == "failed"
    assert "drain_timeout_s must be whole seconds from 1 to 86400" in result["output"]
    assert fakes.calls() == []  # nothing ran, not even the read
    assert executor.done["1"]["status"] == "failed" and executor.done["1"]["reported"] is True
    assert stub.results["1"]["status"] == "failed"


@pytest.mark.parametrize(("timeout", "flag"), [(600, "--timeout=600s"), ("45", "--timeout=45s"),
                                               (None, "--timeout=300s")])  # fmt: skip
def test_it_drains_with_a_whole_second_timeout(
    tmp_path: Path, fakes: FakeSchedulers, timeout: Any, flag: str
) -> None:
    executor = Executor(tmp_path, node=NODE, hooks={}, scheduler="kubernetes", token=TOKEN)
    params = {} if timeout is None else {"drain_timeout_s": timeout}
    result = executor.handle(_k8s_action(1, **params))
    assert result is not None and result["outcome"]["state"] == "applied", result["output"]
    drain = next(c for c in fakes.calls() if c[1] == "drain")
    assert drain[-1] == flag


def test_an_action_whose_backend_raises_is_failed_and_reported_not_left_running(
    tmp_path: Path, stub: StubIngest, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("kubectl printed something nobody expected")

    monkeypatch.setattr(schedulers, "execute", boom)
    executor = Executor(tmp_path, node=NODE, hooks={}, scheduler="kubernetes", token=TOKEN,
                        server=stub.url)  # fmt: skip
    result = executor.handle(_k8s_action(1))
    assert result is not None and result["status"] == "failed"
    assert "RuntimeError: kubectl printed something" in result["output"]
    saved = json.loads((tmp_path / "executor.json").read_text())
    assert saved["done"]["1"]["status"] == "failed"
    assert stub.results["1"]["status"] == "failed"
