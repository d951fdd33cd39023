"""Websocket routes: one live socket per page, its topic in the path."""

from __future__ import annotations

from django.urls import re_path

from console.consumers import LiveConsumer

websocket_urlpatterns = [
    re_path(r"^ws/live/(?P<topic>[^/]+)/$", LiveConsumer.as_asgi()),
]
