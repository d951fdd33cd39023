"""The one outbound HTTP call: POST a body, classify the failure for the retrier.

Owns `send`. 5xx, 429, timeouts and connection failures raise `RetryableError`; other
4xx and redirects raise `PermanentError` (retrying them repeats the same refusal, and
following a redirect would hand a signed body to another host). Only http(s) URLs.
"""

from __future__ import annotations

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


_OPENER = urllib.request.build_opener(_NoRedirect)


def send(url: str, body: bytes, headers: Mapping[str, str], timeout: float) -> Response:
    """POST `body` to `url`; return the 2xx response or raise a `DeliveryError`."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PermanentError(f"notification URL must be http(s)://host/..., got {url!r}")
    req = urllib.request.Request(url, data=body, headers=dict(headers), method="POST")  # noqa: S310 - scheme checked above
    host = parts.hostname
    try:
        with _OPENER.open(req, timeout=timeout) as resp:
            return Response(resp.status, resp.read(_MAX_RESPONSE))
    except urllib.error.HTTPError as exc:
        status = exc.code
        detail = exc.read(_MAX_RESPONSE).decode("utf-8", "replace")[:200]
        exc.close()
        message = f"{host} answered HTTP {status}: {detail}".rstrip(": ")
        if status >= 500 or status in (408, 425, 429):
            raise RetryableError(message, status=status) from None
        raise PermanentError(message, status=status) from None
    except TimeoutError as exc:
        raise RetryableError(f"{host} did not answer within {timeout:g} s") from exc
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            raise RetryableError(f"{host} did not answer within {timeout:g} s") from exc
        raise RetryableError(f"could not reach {host}: {exc.reason}") from exc
    except (ConnectionError, OSError) as exc:
        raise RetryableError(f"could not reach {host}: {exc}") from exc
