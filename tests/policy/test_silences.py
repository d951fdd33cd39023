from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from console.policy.escalation import Silence, SilenceError, is_silenced, validate_silence
from tests.policy.factories import NOW

WINDOW = Silence(
    id="s-1",
    matchers={"subject": "node:a100-*", "pool": "a100"},
    starts_at=NOW,
    ends_at=NOW + timedelta(hours=4),
    reason="NIC firmware upgrade",
    created_by="ada",
)


def test_it_accepts_a_bounded_explained_silence() -> None:
    validate_silence(WINDOW, now=NOW)


@pytest.mark.parametrize("reason", ["", "  ", "x"])
def test_it_requires_a_reason(reason: str) -> None:
    with pytest.raises(SilenceError, match="needs a reason"):
        validate_silence(replace(WINDOW, reason=reason), now=NOW)


def test_it_refuses_a_silence_without_matchers() -> None:
    with pytest.raises(SilenceError, match="at least one matcher"):
        validate_silence(replace(WINDOW, matchers={}), now=NOW)


def test_it_refuses_a_silence_that_matches_everything() -> None:
    with pytest.raises(SilenceError, match="silences everything"):
        validate_silence(replace(WINDOW, matchers={"subject": "*"}), now=NOW)


def test_it_refuses_a_silence_longer_than_the_maximum() -> None:
    long = replace(WINDOW, ends_at=NOW + timedelta(days=4))
    with pytest.raises(SilenceError, match="at most 72 h"):
        validate_silence(long, now=NOW)


def test_it_refuses_a_silence_that_ends_before_it_starts() -> None:
    with pytest.raises(SilenceError, match="end after it starts"):
        validate_silence(replace(WINDOW, ends_at=NOW - timedelta(hours=1)), now=NOW)


def test_it_refuses_naive_times() -> None:
    naive = replace(WINDOW, starts_at=datetime(2026, 11, 29, 10, 0))
    with pytest.raises(SilenceError, match="timezone"):
        validate_silence(naive, now=NOW)


def test_it_returns_the_silence_covering_a_subject() -> None:
    found = is_silenced("node:a100-07", {"pool": "a100"}, [WINDOW], NOW + timedelta(hours=1))
    assert found is WINDOW


def test_it_needs_every_matcher_to_match() -> None:
    assert is_silenced("node:a100-07", {"pool": "h100"}, [WINDOW], NOW) is None
    assert is_silenced("node:a100-07", {}, [WINDOW], NOW) is None


def test_it_ignores_a_silence_outside_its_window() -> None:
    assert is_silenced("node:a100-07", {"pool": "a100"}, [WINDOW], NOW + timedelta(hours=4)) is None
    assert (
        is_silenced("node:a100-07", {"pool": "a100"}, [WINDOW], NOW - timedelta(seconds=1)) is None
    )
