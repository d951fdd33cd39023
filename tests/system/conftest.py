"""A real `faultline up` (embedded Postgres + Valkey, gunicorn, uvicorn, Celery) on free ports.

These tests drive the service only from outside: HTTP, websockets, a browser and real agent
processes, exactly as a user would after the README's run command.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from faultline.testing.service import (  # noqa: F401 - re-exported for the tests
    ADMIN,
    BIN,
    Service,
    service_env,
    start_service,
    stop_service,
    wait_for,
)


@pytest.fixture(scope="session")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    data_dir = tmp_path_factory.mktemp("faultline-up")
    svc = start_service(data_dir)
    yield svc
    stop_service(svc)
    artifacts = Path("test-artifacts")
    artifacts.mkdir(exist_ok=True)
    shutil.copy(svc.log, artifacts / "faultline-up.log")
