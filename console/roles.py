"""A console user's role (viewer, operator, approver, admin), read from their Membership.

Owns the mapping user -> role; the roles and their ladder are console.policy.roles' (plain
Python, shared with the pure gates). It must not define roles or permissions itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

from console.policy.roles import Role, at_least, parse_role

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


def has_role(user: User | None, minimum: str) -> bool:
    """Whether the user's role is `minimum` or above on the ladder."""
    wanted = parse_role(minimum)
    if wanted is None:
        raise ValueError(f"unknown role {minimum!r}; known: {', '.join(r.value for r in Role)}")
    return at_least(role_of(user), wanted)
