"""The two ports of a real `faultline up`, from outside: the websocket port (uvicorn) serves
websockets and answers anything else 404 without reading it or believing a forwarded
header; a 255 MiB unauthenticated body is refused on either port after a few KB, not read."""

from __future__ import annotations

import select
import socket
import time
from typing import Any

import pytest
from websockets.sync.client import connect

from tests.system.conftest import Service

pytestmark = pytest.mark.slow

BIG = 255 << 20


def _stream(port: int, head: str, *, total: int = BIG) -> tuple[int, int, float]:
    """Send `head` with a Content-Length of `total`, then the body as fast as the server
    takes it, until the server answers or closes. (status, body bytes sent, seconds)."""
    started = time.monotonic()
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(f"{head}Content-Length: {total}\r\n\r\n".encode())
    chunk, sent, reply = b"a" * 65536, 0, b""
    try:
        while sent < total and time.monotonic() - started < 60:
            readable, writable, _ = select.select([sock], [sock], [], 1)
            if readable:
                reply = sock.recv(65536)
                break
            if writable:
                sent += sock.send(chunk)
        if not reply:
            sock.settimeout(30)
            reply = sock.recv(65536)
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        sock.close()
    status = int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/") else 0
    return status, sent, time.monotonic() - started


def _post(path: str, content_type: str) -> str:
    return f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n"


@pytest.mark.parametrize(
    ("which", "path", "content_type", "status"),
    [
        ("ws", "/api/v1/ingest", "application/json", 404),
        ("ws", "/login/", "multipart/form-data; boundary=x", 404),
        ("http", "/api/v1/ingest", "application/json", 413),
        ("http", "/login/", "multipart/form-data; boundary=x", 413),
        ("http", "/api/v1/alertmanager", "application/json", 413),
    ],
)
def test_a_255_mib_unauthenticated_body_is_refused_early_on_both_ports(
    service: Service, which: str, path: str, content_type: str, status: int
) -> None:
    port = service.ws_port if which == "ws" else service.port
    got, sent, seconds = _stream(port, _post(path, content_type))
    assert got == status, (which, path, got)
    # The reply comes from the headers: what was sent meanwhile is socket buffers, not the
    # 255 MiB (before: the websocket port read all of it, then answered 401).
    assert sent < 16 << 20, (which, path, sent)
    assert seconds < 20, seconds


@pytest.mark.parametrize("path", ["/metrics", "/login/", "/api/v1/nodes/", "/healthz", "/"])
def test_the_websocket_port_serves_no_page_api_or_metrics_whatever_it_is_told(
    service: Service, path: str
) -> None:
    head = (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Forwarded-For: 10.1.2.3\r\n"
            "X-Forwarded-Proto: https\r\n")  # fmt: skip
    status, _, _ = _stream(service.ws_port, head, total=0)
    assert status == 404


def test_the_websocket_port_still_serves_the_live_stream(service: Service) -> None:
    cookie, _ = service.login()
    url = f"ws://127.0.0.1:{service.ws_port}/ws/live/fleet/"
    headers: Any = {"Cookie": cookie, "Origin": service.url}
    with connect(url, additional_headers=headers, open_timeout=20) as ws:
        assert '"hello"' in str(ws.recv(timeout=20))


def test_a_spoofed_forwarded_address_passes_no_allow_list_on_the_http_port(
    service: Service,
) -> None:
    """The service runs without FAULTLINE_METRICS_*: /metrics is refused whoever the header
    says the client is (the review reached it through the websocket port with one)."""
    head = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Forwarded-For: 127.0.0.1\r\n"
    status, _, _ = _stream(service.port, head, total=0)
    assert status == 403
