from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from console.notify import transport
from console.notify.transport import PermanentError, RetryableError


def send(*args: object, **kwargs: object) -> transport.Response:
    """The test receiver listens on 127.0.0.1: allow it, as FAULTLINE_NOTIFY_ALLOW_PRIVATE does."""
    return transport.send(*args, allow_private=True, **kwargs)  # type: ignore[arg-type]  # passes send()'s own arguments through


RECEIVED: list[tuple[str, dict[str, str], bytes]] = []


class Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        body = self.rfile.read(length)
        RECEIVED.append((self.path, dict(self.headers), body))
        if self.path == "/slow":
            time.sleep(1.0)
        if self.path == "/moved":
            self.send_response(302)
            self.send_header("Location", "/ok")
            self.end_headers()
            return
        status = {"/ok": 200, "/boom": 503, "/missing": 404, "/busy": 429}.get(self.path, 200)
        payload = b"accepted" if status == 200 else b"nope"
        try:
            self.send_response(status)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up first: that is what the timeout test wants

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_it_posts_the_body_and_headers(base: str) -> None:
    response = send(f"{base}/ok", b'{"a":1}', {"X-Test": "yes"}, timeout=2)
    assert (response.status, response.body) == (200, b"accepted")
    path, headers, body = RECEIVED[-1]
    assert (path, headers["X-Test"], body) == ("/ok", "yes", b'{"a":1}')


def test_it_marks_a_server_error_retryable(base: str) -> None:
    with pytest.raises(RetryableError) as err:
        send(f"{base}/boom", b"{}", {}, timeout=2)
    assert err.value.status == 503 and err.value.retryable


def test_it_marks_rate_limiting_retryable(base: str) -> None:
    with pytest.raises(RetryableError):
        send(f"{base}/busy", b"{}", {}, timeout=2)


def test_it_marks_a_client_error_permanent(base: str) -> None:
    with pytest.raises(PermanentError) as err:
        send(f"{base}/missing", b"{}", {}, timeout=2)
    assert err.value.status == 404 and not err.value.retryable


def test_it_marks_a_timeout_retryable(base: str) -> None:
    with pytest.raises(RetryableError, match=r"did not answer within 0\.2 s"):
        send(f"{base}/slow", b"{}", {}, timeout=0.2)


def test_it_does_not_follow_redirects(base: str) -> None:
    before = len(RECEIVED)
    with pytest.raises(PermanentError) as err:
        send(f"{base}/moved", b"{}", {}, timeout=2)
    assert err.value.status == 302
    assert len(RECEIVED) == before + 1


def test_it_marks_a_refused_connection_retryable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(RetryableError, match=r"could not reach 127\.0\.0\.1"):
        send(f"http://127.0.0.1:{port}/", b"{}", {}, timeout=2)


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://127.0.0.1/x", "http:///nohost"])
def test_it_refuses_urls_that_are_not_http(url: str) -> None:
    with pytest.raises(PermanentError, match="must be http"):
        send(url, b"{}", {}, timeout=2)


def test_it_refuses_a_loopback_receiver_unless_private_targets_are_allowed(base: str) -> None:
    before = len(RECEIVED)
    with pytest.raises(PermanentError, match=r"127\.0\.0\.1.*FAULTLINE_NOTIFY_ALLOW_PRIVATE"):
        transport.send(f"{base}/ok", b"{}", {}, timeout=2)
    assert len(RECEIVED) == before  # nothing was posted


def test_it_refuses_a_name_that_resolves_to_loopback(base: str) -> None:
    port = base.rsplit(":", 1)[1]
    with pytest.raises(PermanentError, match="loopback/private/link-local"):
        transport.send(f"http://localhost:{port}/ok", b"{}", {}, timeout=2)


@pytest.mark.parametrize(
    ("address", "private"),
    [
        ("127.0.0.1", True),
        ("10.1.2.3", True),
        ("172.16.0.1", True),
        ("192.168.1.1", True),
        ("169.254.169.254", True),  # cloud metadata
        ("::1", True),
        ("fe80::1%eth0", True),
        ("::ffff:10.0.0.1", True),
        ("0.0.0.0", True),  # noqa: S104 - an address to classify, not a bind
        ("8.8.8.8", False),
        ("2606:4700:4700::1111", False),
    ],
)
def test_it_classifies_addresses_a_page_must_not_reach(address: str, private: bool) -> None:
    assert transport.is_private(address) is private


def test_it_never_quotes_the_receivers_response_body(base: str) -> None:
    with pytest.raises(PermanentError) as err:
        send(f"{base}/missing", b"{}", {}, timeout=2)
    assert "nope" not in str(err.value)
    assert str(err.value).endswith("answered HTTP 404")
