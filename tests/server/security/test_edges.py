"""The service's edge: the websocket port serves websockets only, no forwarded header is
believed unless its proxy is configured, and bodies are bounded before anything reads them.
tests/system/test_ports.py checks the same against a real `faultline up`."""

from __future__ import annotations

import asyncio
import ipaddress
from typing import Any

import pytest
from asgiref.testing import ApplicationCommunicator
from django.test import RequestFactory, override_settings

from faultline.client import client_address

pytestmark = pytest.mark.django_db

PROXY = "10.0.0.5"


def _nets(*cidrs: str) -> list[Any]:
    return [ipaddress.ip_network(c) for c in cidrs]


# -- the websocket port ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/metrics"), ("GET", "/login/"), ("POST", "/api/v1/ingest"),
     ("POST", "/api/v1/alertmanager"), ("GET", "/admin/"), ("GET", "/healthz"),
     ("GET", "/ws/live/fleet/")],
)  # fmt: skip
def test_the_websocket_port_answers_every_http_request_404_without_reading_it(
    method: str, path: str
) -> None:
    asyncio.run(_ws_port_http(method, path))


async def _ws_port_http(method: str, path: str) -> None:
    from faultline.asgi import application

    scope = {"type": "http", "method": method, "path": path, "query_string": b"",
             "headers": [(b"x-forwarded-for", b"127.0.0.1"), (b"authorization", b"Bearer x"),
                         (b"content-length", str(255 << 20).encode())],
             "client": ("203.0.113.9", 5000), "server": ("127.0.0.1", 8001),
             "http_version": "1.1", "scheme": "http", "root_path": ""}  # fmt: skip
    app = ApplicationCommunicator(application, scope)
    # No http.request message is ever sent: an app that read the body would wait forever.
    start = await app.receive_output(timeout=5)
    body = await app.receive_output(timeout=5)
    assert start["status"] == 404 and (b"connection", b"close") in start["headers"]
    assert b"websockets only" in body["body"]
    await app.wait(timeout=5)


# -- who the client is ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("trusted", "remote", "forwarded", "client"),
    [
        ([], "203.0.113.9", "", "203.0.113.9"),
        ([], "203.0.113.9", "10.1.1.1", "203.0.113.9"),  # spoofed: believed from nobody
        ([], "127.0.0.1", "10.1.1.1", "127.0.0.1"),  # not even from loopback
        (["10.0.0.0/24"], "203.0.113.9", "10.1.1.1", "203.0.113.9"),  # not from a proxy
        (["10.0.0.0/24"], PROXY, "198.51.100.7", "198.51.100.7"),
        (["10.0.0.0/24"], PROXY, "1.2.3.4, 198.51.100.7", "198.51.100.7"),  # left: the client's
        (["10.0.0.0/24"], PROXY, "198.51.100.7, 10.0.0.9", "198.51.100.7"),  # two proxies
        (["10.0.0.0/24"], PROXY, "garbage, 198.51.100.7", "198.51.100.7"),
        (["10.0.0.0/24"], PROXY, "198.51.100.7, garbage", PROXY),  # the proxy's own hop: bad
        (["10.0.0.0/24"], PROXY, "", PROXY),
        (["10.0.0.0/24"], PROXY, "10.0.0.7", "10.0.0.7"),  # every hop a proxy: the last
        (["10.0.0.0/24", "::1/128"], "::1", "[2001:db8::5]", "2001:db8::5"),
    ],
)
def test_the_client_is_the_connecting_address_unless_a_trusted_proxy_forwarded_it(
    settings: Any, trusted: list[str], remote: str, forwarded: str, client: str
) -> None:
    settings.TRUSTED_PROXIES = _nets(*trusted)
    extra = {"HTTP_X_FORWARDED_FOR": forwarded} if forwarded else {}
    request = RequestFactory().get("/", REMOTE_ADDR=remote, **extra)
    assert client_address(request) == client


@override_settings(LOGIN_FAILURE_LIMIT=3)
def test_a_guesser_rotating_x_forwarded_for_is_still_throttled(client: Any, cast: Any) -> None:
    for i in range(3):
        client.post("/login/", {"username": "viewer", "password": "wrong"},
                    HTTP_X_FORWARDED_FOR=f"10.9.9.{i}")  # fmt: skip
    response = client.post("/login/", {"username": "viewer", "password": "pw-viewer-123"},
                           HTTP_X_FORWARDED_FOR="10.9.9.200")  # fmt: skip
    assert response.status_code == 429


@override_settings(LOGIN_FAILURE_LIMIT=3)
def test_behind_a_trusted_proxy_each_client_is_counted_apart(
    client: Any, cast: Any, settings: Any
) -> None:
    settings.TRUSTED_PROXIES = _nets("10.0.0.0/24")
    for _ in range(3):
        client.post("/login/", {"username": "viewer", "password": "wrong"}, REMOTE_ADDR=PROXY,
                    HTTP_X_FORWARDED_FOR="198.51.100.7")  # fmt: skip
    right = {"username": "viewer", "password": "pw-viewer-123"}
    guesser = client.post("/login/", right, REMOTE_ADDR=PROXY,
                          HTTP_X_FORWARDED_FOR="9.9.9.9, 198.51.100.7")  # fmt: skip
    assert guesser.status_code == 429  # a spoofed hop left of the proxy's changes nothing
    other = client.post("/login/", right, REMOTE_ADDR=PROXY,
                        HTTP_X_FORWARDED_FOR="198.51.100.8")  # fmt: skip
    assert other.status_code == 302


def test_a_spoofed_forwarded_address_does_not_pass_the_metrics_allow_list(
    client: Any, settings: Any
) -> None:
    settings.METRICS_TOKEN, settings.METRICS_ALLOW_CIDRS = "", _nets("10.1.0.0/16")
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1",
                      HTTP_X_FORWARDED_FOR="10.1.2.3").status_code == 403  # fmt: skip
    settings.TRUSTED_PROXIES = _nets("127.0.0.1/32")
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1",
                      HTTP_X_FORWARDED_FOR="10.1.2.3").status_code == 200  # fmt: skip
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1",
                      HTTP_X_FORWARDED_FOR="10.1.2.3, 192.0.2.1").status_code == 403  # fmt: skip


# -- bodies bounded before anything reads them ----------------------------------------------


class Counted:
    """A request body that records how much was read of it."""

    def __init__(self, size: int) -> None:
        self.size, self.read_bytes = size, 0

    def read(self, n: int = -1) -> bytes:
        n = self.size - self.read_bytes if n is None or n < 0 else min(n, 1 << 20)
        n = min(n, self.size - self.read_bytes)
        self.read_bytes += n
        return b"a" * n

    def readline(self, *args: Any) -> bytes:
        return self.read(1024)


BIG = 255 << 20


@pytest.mark.parametrize(
    ("path", "content_type"),
    [("/login/", "multipart/form-data; boundary=xyz"),
     ("/login/", "application/x-www-form-urlencoded"),
     ("/api/v1/ingest", "application/json"), ("/api/v1/alertmanager", "application/json"),
     ("/api/v1/actions/", "application/json"),
     ("/admin/login/", "multipart/form-data; boundary=x"),
     ("/no/such/page", "application/octet-stream")],
)  # fmt: skip
def test_an_oversized_body_is_refused_before_a_byte_of_it_is_read(
    client: Any, path: str, content_type: str
) -> None:
    body = Counted(BIG)
    response = client.generic("POST", path, b"", content_type=content_type,
                              **{"CONTENT_LENGTH": str(BIG), "wsgi.input": body})  # fmt: skip
    assert response.status_code == 413, (path, response.status_code)
    assert body.read_bytes == 0
    assert "the limit is" in response.json()["error"]


def test_a_chunked_body_or_a_nonsense_length_is_refused(client: Any) -> None:
    body = Counted(1 << 20)
    chunked_body = {"HTTP_TRANSFER_ENCODING": "chunked", "wsgi.input": body}
    chunked = client.generic("POST", "/api/v1/ingest", b"", content_type="application/json",
                             **chunked_body)  # fmt: skip
    assert chunked.status_code == 411 and body.read_bytes == 0
    nonsense = client.generic("POST", "/login/", b"", CONTENT_LENGTH="12abc")
    assert nonsense.status_code == 400


def test_a_body_within_the_limit_still_arrives(client: Any, cast: Any) -> None:
    assert client.post("/login/", {"username": "viewer", "password": "x" * 4000}).status_code == 200
