"""console.collector: no collections inside a live pass, what it kept frozen after, and a
release (at a full rebuild) that collects the cyclic garbage frozen meanwhile."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

from console import collector


@pytest.fixture(autouse=True)
def _restore() -> Iterator[None]:
    enabled = gc.isenabled()
    yield
    gc.unfreeze()
    if enabled:
        gc.enable()


def test_a_pass_runs_without_collections_and_freezes_what_it_kept() -> None:
    gc.unfreeze()
    gc.enable()
    with collector.paused():
        assert not gc.isenabled()
        kept = [[i] for i in range(1000)]
    assert gc.isenabled()
    assert gc.get_freeze_count() >= len(kept)
    assert gc.get_count()[0] < 100  # nothing left young for the next collection to walk


def test_release_collects_cyclic_garbage_frozen_by_passes() -> None:
    class Node:
        ref: Any = None

    gc.unfreeze()
    gc.collect()
    with collector.paused():
        a, b = Node(), Node()
        a.ref, b.ref = b, a  # a cycle: reference counting alone never frees it
        del a, b
    assert gc.collect() == 0  # frozen: an ordinary collection does not see it
    assert collector.release() >= 2
    assert gc.get_freeze_count() == 0


def test_a_paused_block_that_raises_restores_the_collector() -> None:
    gc.enable()
    with pytest.raises(RuntimeError), collector.paused():
        raise RuntimeError
    assert gc.isenabled()
    gc.disable()
    with collector.paused():
        pass
    assert not gc.isenabled()  # a caller's own disable is kept
