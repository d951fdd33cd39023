"""pytest plugin (loaded with `-p faultline.testing.embedded`): real Postgres and Valkey.

pytest-django reads settings before any conftest runs, so the URLs must exist when this
plugin is imported. Without DATABASE_URL / REDIS_URL it starts the embedded servers under
FAULTLINE_TEST_DATA_DIR (default ./.faultline/test) and stops them when pytest ends.
"""

from __future__ import annotations

import os
from pathlib import Path

from faultline.embedded import Embedded, start_embedded

_embedded: Embedded | None = None

if not (os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL")):
    _data = Path(os.environ.get("FAULTLINE_TEST_DATA_DIR", Path.cwd() / ".faultline" / "test"))
    # Several pytest sessions may run at once (developers, helpers): they share the embedded
    # Postgres server but each gets its own Valkey and its own test database.
    _embedded = start_embedded(_data.resolve(), valkey_subdir=f"valkey-{os.getpid()}")
    if _embedded.database_url:
        os.environ["DATABASE_URL"] = _embedded.database_url
    if _embedded.redis_url:
        os.environ["REDIS_URL"] = _embedded.redis_url
    os.environ.setdefault("FAULTLINE_DATA_DIR", str(_data.resolve()))

# pytest-xdist's workers inherit the controller's URLs (its servers are up by then): each
# worker takes a Redis database of its own (pytest-django already gives each its own test
# database), or one worker's cache.clear() and rate or budget keys would be another's.
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _worker.startswith("gw") and _worker[2:].isdigit() and os.environ.get("REDIS_URL"):
    from urllib.parse import urlsplit, urlunsplit

    _url = urlsplit(os.environ["REDIS_URL"])
    os.environ["REDIS_URL"] = urlunsplit(_url._replace(path=f"/{int(_worker[2:]) + 1}"))

# Django's test database is created and dropped by the test run: a connection pool would
# hold connections open across that and block DROP DATABASE.
os.environ.setdefault("FAULTLINE_DB_POOL", "0")
# pytest-django holds each test inside one transaction, idle while the test waits on a
# subprocess or a browser: Postgres must not end it. Services the tests start run with the
# shipped default (faultline.testing.service.service_env).
os.environ.setdefault("FAULTLINE_DB_IDLE_IN_TRANSACTION_S", "0")
os.environ.setdefault("FAULTLINE_TEST_DB_NAME", f"test_faultline_{os.getpid()}")


def pytest_unconfigure(config: object) -> None:
    if _embedded is not None:
        _embedded.stop()
        import shutil

        shutil.rmtree(_data / f"valkey-{os.getpid()}", ignore_errors=True)
