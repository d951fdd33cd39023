"""A console user's role (viewer, operator, approver, admin), read from their Membership.

Owns the mapping user -> role; the roles, their ladder and the permission table are
console.policy.roles' (plain Python, shared with the pure gates). It must not define roles
or permissions itself, nor compare roles: `allowed` asks the table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

from console.policy.roles import Permission, Role, can

if TYPE_CHECKING:  # auth models load only once the app registry is ready
    from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

# Who changes state: a console user (the write path names them in the audit log).
Actor: TypeAlias = "AbstractBaseUser"
User: TypeAlias = "AbstractBaseUser | AnonymousUser"


def role_of(user: User | None) -> str:
    """The user's role value, "" for anonymous callers (who hold no role at all)."""
    if user is None or not getattr(user, "is_authenticated", False):
        return ""
    if getattr(user, "is_superuser", False):
        return Role.ADMIN.value
    membership = getattr(user, "membership", None)
    return str(membership.role) if membership is not None else Role.VIEWER.value


def allowed(user: User | None, permission: Permission, *, own: bool = False) -> bool:
    """Whether the table lets this user's role do `permission` (`own`: on their own object)."""
    return can(role_of(user), permission, own=own)
