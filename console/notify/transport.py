"""The one outbound HTTP call: POST a body, classify the failure for the retrier.

Owns `send`. 5xx, 429, timeouts and connection failures raise `RetryableError`; other
4xx and redirects raise `PermanentError` (retrying them repeats the same refusal, and
following a redirect would hand a signed body to another host). Only http(s) URLs, and
only public addresses unless the caller allows private ones: a channel URL is typed by an
admin, and the worker must not become a way to reach the service's own network. The check
is on the address actually connected to (so a name that re-resolves cannot slip past), and
a refusal never quotes the receiver's response body (status only), so the worker cannot be
used to read internal pages back through delivery errors.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

_MAX_RESPONSE = 64 * 1024  # enough for any error message; never buffer a huge body


class DeliveryError(Exception):
    """A notification that was not delivered. `retryable` says whether to try again."""

    retryable = False

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class RetryableError(DeliveryError):
    retryable = True


class PermanentError(DeliveryError):
    retryable = False


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


class PrivateAddressError(OSError):
    """The channel's host is (or resolved to) a loopback, private or link-local address."""


def is_private(address: str) -> bool:
    """True for addresses a notification must not reach without explicit permission."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return not ip.is_global or ip.is_multicast


def _check_peer(sock: socket.socket, host: str) -> None:
    address = str(sock.getpeername()[0])
    if is_private(address):
        sock.close()
        raise PrivateAddressError(
            f"{host} is {address}, a loopback/private/link-local address; notifications go "
            "only to public addresses unless FAULTLINE_NOTIFY_ALLOW_PRIVATE=1"
        )


class _PublicHTTPConnection(http.client.HTTPConnection):
    def connect(self) -> None:
        super().connect()
        _check_peer(self.sock, self.host)


class _PublicHTTPSConnection(http.client.HTTPSConnection):
    def connect(self) -> None:
        # Check the TCP peer before the TLS handshake: nothing is sent to a refused host.
        http.client.HTTPConnection.connect(self)
        _check_peer(self.sock, self.host)
        if getattr(self, "_tunnel_host", None):  # pragma: no cover - no proxies (see below)
            raise PrivateAddressError("notifications do not go through proxies")
        server = self.host
        self.sock = self._context.wrap_socket(self.sock, server_hostname=server)  # type: ignore[attr-defined]  # private in typeshed


class _PublicHTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_PublicHTTPConnection, req)


class _PublicHTTPSHandler(urllib.request.HTTPSHandler):
    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_PublicHTTPSConnection, req, context=self._context)  # type: ignore[attr-defined]  # private in typeshed


# No ProxyHandler: a proxy would be the connected peer, which defeats the address check,
# and the environment of a worker is no place to decide where pages go.
_OPENER = urllib.request.build_opener(
    urllib.request.ProxyHandler({}), _NoRedirect, _PublicHTTPHandler, _PublicHTTPSHandler
)
_OPENER_ANY = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect)


def send(
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    timeout: float,
    *,
    allow_private: bool = False,
) -> Response:
    """POST `body` to `url`; return the 2xx response or raise a `DeliveryError`.

    `allow_private` lets the POST reach loopback, private and link-local addresses (a
    receiver inside the cluster); the caller reads it from FAULTLINE_NOTIFY_ALLOW_PRIVATE.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PermanentError(f"notification URL must be http(s)://host/..., got {url!r}")
    req = urllib.request.Request(url, data=body, headers=dict(headers), method="POST")  # noqa: S310 - scheme checked above
    host = parts.hostname
    opener = _OPENER_ANY if allow_private else _OPENER
    try:
        with opener.open(req, timeout=timeout) as resp:
            return Response(resp.status, resp.read(_MAX_RESPONSE))
    except urllib.error.HTTPError as exc:
        status = exc.code
        exc.close()  # the body is never read into a message: it could be an internal page
        message = f"{host} answered HTTP {status}"
        if status >= 500 or status in (408, 425, 429):
            raise RetryableError(message, status=status) from None
        raise PermanentError(message, status=status) from None
    except TimeoutError as exc:
        raise RetryableError(f"{host} did not answer within {timeout:g} s") from exc
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, PrivateAddressError):
            raise PermanentError(str(exc.reason)) from None
        if isinstance(exc.reason, TimeoutError):
            raise RetryableError(f"{host} did not answer within {timeout:g} s") from exc
        raise RetryableError(f"could not reach {host}: {exc.reason}") from exc
    except PrivateAddressError as exc:
        raise PermanentError(str(exc)) from None
    except (ConnectionError, OSError) as exc:
        raise RetryableError(f"could not reach {host}: {exc}") from exc
