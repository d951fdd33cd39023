"""Who the client is: the connecting address, or what a trusted proxy says it forwarded.

Owns the one answer the login throttle and the metrics allow-list use. Without
FAULTLINE_TRUSTED_PROXIES (the default) it is REMOTE_ADDR and nothing else: X-Forwarded-For
is set freely by any client (a spoofed one once passed the metrics allow-list and escaped
the login throttle). With it, a request whose connecting address is one of those proxies
is from the right-most X-Forwarded-For address that is not itself a trusted proxy; a
malformed entry stops the walk at the proxy. It must not trust any other header.
"""

from __future__ import annotations

import ipaddress

from django.conf import settings
from django.http import HttpRequest

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def _address(text: str) -> Address | None:
    try:
        return ipaddress.ip_address(text.strip().strip("[]"))
    except ValueError:
        return None


def _trusted(address: Address) -> bool:
    return any(address in net for net in settings.TRUSTED_PROXIES)


def client_address(request: HttpRequest) -> str:
    """The client's address as text ("" when the server gave none)."""
    peer = _address(request.META.get("REMOTE_ADDR", ""))
    if peer is None:
        return request.META.get("REMOTE_ADDR", "")
    if not settings.TRUSTED_PROXIES or not _trusted(peer):
        return str(peer)
    chain = request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")
    for hop in reversed(chain[-32:]):  # appended by each proxy: the nearest is last
        address = _address(hop)
        if address is None:
            break
        if not _trusted(address):
            return str(address)
        peer = address
    return str(peer)
