"""DRF permissions from the permission table (console.policy.roles); anonymous callers are
always refused.

The API asks only whether the caller may read (`IsViewer`, the default), or see a thing
only some roles may (`Sees`: notification channels hold secrets). Whether a change is
allowed is the verb's to decide (console.actions asks the same table and raises
NotAllowed, which console/api/errors.py answers with 403); views must not check roles
for writes.
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


def sees(permission: Permission) -> type[BasePermission]:
    """A permission class for reading what only `permission`'s holders may see; a write
    needs only a viewer here, since the verb it calls asks the table itself."""

    class Sees(BasePermission):
        def has_permission(self, request: Any, view: Any) -> bool:
            safe = request.method in SAFE_METHODS
            return allowed(request.user, permission if safe else Permission.VIEW)

    Sees.__name__ = f"Sees{permission.title().replace('_', '')}"
    return Sees
