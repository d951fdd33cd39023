"""Websocket consumers: authenticate, join a channel group, forward typed events. Thin.

The fleet topic carries `node.changed`, `incident.changed`, `action.changed` and
`breaker.changed`; a group topic carries `group.changed` and `incident.changed`. Payloads
are console.events'; a consumer must not query or change state.
"""

from __future__ import annotations

from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from console import events
from faultline import metrics


class LiveConsumer(AsyncJsonWebsocketConsumer):
    """One socket per page; `?topic=fleet` or `?topic=group:<name>` picks the stream."""

    channel: str | None = None

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        topic = self.scope["url_route"]["kwargs"].get("topic", "fleet")
        if topic == "fleet":
            self.channel = events.FLEET
        elif topic.startswith("group:"):
            self.channel = events.group_channel(topic.removeprefix("group:"))
        else:
            await self.close(code=4404)
            return
        await self.channel_layer.group_add(self.channel, self.channel_name)
        await self.accept()
        metrics.WEBSOCKET_CLIENTS.inc()
        await self.send_json({"type": "hello", "topic": topic})

    async def disconnect(self, code: int) -> None:
        if self.channel:
            metrics.WEBSOCKET_CLIENTS.dec()
            await self.channel_layer.group_discard(self.channel, self.channel_name)

    async def push(self, message: dict[str, Any]) -> None:
        """Every event published to this socket's channel group (console.events.publish)."""
        await self.send_json(message["event"])
