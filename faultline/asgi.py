"""ASGI entry point: the websocket port serves websockets (Channels) and nothing else.

Every plain HTTP request there is answered 404 at once, without reading its body and
without Django: pages, the API, ingest and /metrics live on the HTTP port (gunicorn), where
the body limits, the login throttle and the metrics allow-list apply. Serving the whole
app here let a spoofed X-Forwarded-For (uvicorn believed it from 127.0.0.1) pass the
metrics allow-list and the login throttle, and a 255 MiB unauthenticated body be read
before its 401. `django_asgi` is the HTTP app for benchmarks that compare servers.
"""

from __future__ import annotations

import os
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "faultline.settings")
django_asgi = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402 - after Django is set up
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from console.routing import websocket_urlpatterns  # noqa: E402

NOT_FOUND = b'{"error": "this port serves websockets only (/ws/live/...)"}'


async def websockets_only(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """404 for any HTTP request, sent before (and instead of) reading its body."""
    await send(
        {
            "type": "http.response.start",
            "status": 404,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(NOT_FOUND)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": NOT_FOUND})


application = ProtocolTypeRouter(
    {
        "http": websockets_only,
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)
