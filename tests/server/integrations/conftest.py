"""Fixtures for the framework jobs: a socket directory short enough for AF_UNIX."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="fl-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
