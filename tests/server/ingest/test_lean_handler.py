"""faultline.wsgi sends POST /api/v1/ingest through a lean handler: the same answers.

Each request goes through the WSGI app gunicorn serves (faultline.wsgi.application) and,
for comparison, through Django's full handler; status, headers and body must match, and
the lean path must still refuse what the full stack refuses.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.core import signals
from django.core.handlers.wsgi import WSGIHandler
from django.db import close_old_connections

from faultline import lean
from ingest.models import BatchReceipt, DeviceSample
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db


@pytest.fixture
def apps() -> Iterator[tuple[Any, Any]]:
    """(the app gunicorn serves, Django's full handler), with the request signals that
    would close the test's connection detached, as Django's test client does."""
    from faultline.wsgi import application

    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        yield application, WSGIHandler()
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


def call(
    app: Any, body: bytes = b"", *, method: str = "POST", token: str = "", query: str = "",
    path: str = lean.PATH, host: str = "testserver",
) -> tuple[int, dict[str, str], bytes]:  # fmt: skip
    environ = {
        "REQUEST_METHOD": method, "PATH_INFO": path, "SCRIPT_NAME": "", "QUERY_STRING": query,
        "SERVER_NAME": "testserver", "SERVER_PORT": "80", "HTTP_HOST": host,
        "wsgi.url_scheme": "http", "wsgi.input": io.BytesIO(body),
        "CONTENT_LENGTH": str(len(body)), "CONTENT_TYPE": "application/json",
    }  # fmt: skip
    if token:
        environ["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    answer: list[Any] = []
    out = app(environ, lambda status, headers: answer.extend([status, headers]))
    content = b"".join(out)
    out.close()
    return int(answer[0].split()[0]), dict(answer[1]), content


def _sample() -> dict[str, Any]:
    return {"kind": "device_sample", "gpu": "GPU-0", "index": 0, "temp_c": 51.0}


def test_the_ingest_path_skips_only_the_middleware_it_never_uses(settings):
    kept = lean.ingest_middleware()
    assert kept == [m for m in settings.MIDDLEWARE if m not in lean.SKIPPED]
    assert "django.contrib.sessions.middleware.SessionMiddleware" not in kept
    assert "faultline.nul.RejectNulMiddleware" in kept  # and the header middleware stay
    assert "faultline.middleware.SecurityHeadersMiddleware" in kept


def test_a_batch_is_stored_and_answered_as_through_the_full_stack(apps, agent_token):
    wsgi, full = apps
    token = agent_token("node-1")
    first = json.dumps(make_batch([_sample()], seq=11)).encode()
    # Another agent of the node: both answers report a first batch (the same bytes).
    second = json.dumps(make_batch([_sample()], seq=12, agent_id="agent-lean-0002")).encode()
    lean_answer = call(wsgi, first, token=token)
    full_answer = call(full, second, token=token)
    assert lean_answer[0] == full_answer[0] == 202
    assert lean_answer[1] == full_answer[1]  # every header, security headers included
    assert json.loads(lean_answer[2]) == {
        "ack_seq": 11,
        "duplicate": False,
        "actions": [],
        "high_water": None,  # the agent's first batch
        "gaps": [],
    }
    assert DeviceSample.objects.count() == 2
    replay = call(wsgi, first, token=token)
    assert (replay[0], json.loads(replay[2])["duplicate"]) == (202, True)
    assert BatchReceipt.objects.count() == 2 and DeviceSample.objects.count() == 2


@pytest.mark.parametrize(
    ("case", "status"),
    [
        ("no token", 401),
        ("unknown token", 401),
        ("another node's token", 403),
        ("bad json", 400),
        ("bad record", 400),
        ("get", 405),
        ("nul in the query", 400),
        ("foreign host", 400),
    ],
)
def test_every_refusal_is_the_full_stacks(apps, agent_token, case, status):
    wsgi, full = apps
    token = agent_token("node-1")
    body = json.dumps(make_batch([_sample()], seq=21)).encode()
    kwargs: dict[str, Any] = {"token": token}
    if case == "no token":
        kwargs = {}
    elif case == "unknown token":
        kwargs = {"token": "fl_not-a-token"}
    elif case == "another node's token":
        kwargs = {"token": agent_token("node-2")}
    elif case == "bad json":
        body = b'{"agent": '
    elif case == "bad record":
        body = json.dumps(make_batch([{**_sample(), "temp_c": "hot"}], seq=21)).encode()
    elif case == "get":
        kwargs["method"] = "GET"
    elif case == "nul in the query":
        kwargs["query"] = "x=%00"
    elif case == "foreign host":
        kwargs["host"] = "evil.example"
    lean_answer = call(wsgi, body, **kwargs)
    full_answer = call(full, body, **kwargs)
    assert lean_answer[0] == full_answer[0] == status, (lean_answer, full_answer)
    assert lean_answer[1] == full_answer[1]
    assert lean_answer[2] == full_answer[2]
    assert BatchReceipt.objects.count() == 0 and DeviceSample.objects.count() == 0


def test_other_paths_still_go_through_the_full_stack(apps):
    wsgi, _full = apps
    status, headers, _ = call(wsgi, method="GET", path="/api/v1/ingest/")  # not the endpoint
    assert status == 404
    status, headers, _ = call(wsgi, method="GET", path="/login/")
    assert status == 200
    assert "csrftoken" in headers.get("Set-Cookie", "")  # CSRF middleware ran


def test_the_served_app_sends_only_the_ingest_path_to_the_lean_handler(apps, monkeypatch):
    wsgi, _full = apps
    seen: list[str] = []
    resolve = lean.LeanIngestMixin.resolve_request

    def spy(self: Any, request: Any) -> Any:
        seen.append(request.path)
        return resolve(self, request)

    monkeypatch.setattr(lean.LeanIngestMixin, "resolve_request", spy)
    assert call(wsgi, b"{}")[0] == 401
    call(wsgi, method="GET", path="/healthz")
    assert seen == [lean.PATH]
