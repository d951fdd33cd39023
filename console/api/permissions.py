"""DRF permissions from the permission table (console.policy.roles); anonymous callers are
always refused.

A view names the Permission its read needs (`IsViewer`, the default: VIEW) and, for a
write, the Permission the verb it calls asks the table for (`allows(write=...)`), so a
caller below it is refused (403) before validation or a lookup tells them anything. The
verb still decides (console.actions asks the same table, e.g. owner or not, and raises
NotAllowed, which console/api/errors.py answers with 403); views never name a role.
"""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import SAFE_METHODS, BasePermission

from console.policy.roles import Permission
from console.roles import allowed


class IsViewer(BasePermission):
    """Signed in with a role that may view the console."""

    def has_permission(self, request: Any, view: Any) -> bool:
        return allowed(request.user, Permission.VIEW)


def allows(
    *, read: Permission = Permission.VIEW, write: Permission | None = None
) -> type[BasePermission]:
    """A permission class: reads need `read`; writes need `write` (default: `read`)."""
    needed_to_write = write if write is not None else read

    class Allows(BasePermission):
        def has_permission(self, request: Any, view: Any) -> bool:
            safe = request.method in SAFE_METHODS
            return allowed(request.user, read if safe else needed_to_write)

    Allows.__name__ = f"Allows{needed_to_write.title().replace('_', '')}"
    return Allows
