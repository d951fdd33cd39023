"""Roles and what each may do in the console.

Owns the role ladder (viewer < operator < approver < admin) and the permission table: the
one definition of roles (console.choices.UserRole and console.roles are views of it).
It must not know about users, sessions or Django groups: the caller maps a user to a
role and asks `can(role, permission)`. Unknown roles and permissions are refused.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum


class Role(StrEnum):
    VIEWER = "viewer"
    OPERATOR = "operator"
    APPROVER = "approver"
    ADMIN = "admin"


class Permission(StrEnum):
    VIEW = "view"
    ACKNOWLEDGE = "acknowledge"
    PROPOSE = "propose"
    APPROVE = "approve"
    REJECT = "reject"
    CANCEL = "cancel"
    CLOSE_BREAKER = "close_breaker"
    MANAGE_POLICIES = "manage_policies"
    MANAGE_SILENCES = "manage_silences"


class _Rank(IntEnum):
    VIEWER = 0
    OPERATOR = 1
    APPROVER = 2
    ADMIN = 3


_RANK = {
    Role.VIEWER: _Rank.VIEWER,
    Role.OPERATOR: _Rank.OPERATOR,
    Role.APPROVER: _Rank.APPROVER,
    Role.ADMIN: _Rank.ADMIN,
}

# The least role holding each permission; every role above it holds it too.
MINIMUM_ROLE: dict[Permission, Role] = {
    Permission.VIEW: Role.VIEWER,
    Permission.ACKNOWLEDGE: Role.OPERATOR,
    Permission.PROPOSE: Role.OPERATOR,
    Permission.CANCEL: Role.OPERATOR,
    Permission.APPROVE: Role.APPROVER,
    Permission.REJECT: Role.APPROVER,
    # Closing the breaker re-enables automation after it misbehaved, and policies decide
    # what automation may do: admin only. Silences are the on-call operator's tool during
    # maintenance; they are bounded (reason required, at most 72 h), audited, and never
    # hold back a resolve.
    Permission.CLOSE_BREAKER: Role.ADMIN,
    Permission.MANAGE_POLICIES: Role.ADMIN,
    Permission.MANAGE_SILENCES: Role.OPERATOR,
}


def parse_role(value: str | Role | None) -> Role | None:
    """The role named by `value`, or None when it names no role."""
    if isinstance(value, Role):
        return value
    try:
        return Role(str(value).strip().lower())
    except ValueError:
        return None


def can(role: str | Role | None, permission: str | Permission) -> bool:
    """Whether `role` holds `permission`; anything unknown is refused (fail closed)."""
    parsed = parse_role(role)
    try:
        perm = Permission(permission)
    except ValueError:
        return False
    if parsed is None:
        return False
    return _RANK[parsed] >= _RANK[MINIMUM_ROLE[perm]]


def at_least(role: str | Role | None, minimum: Role) -> bool:
    """Whether `role` is `minimum` or above on the ladder."""
    parsed = parse_role(role)
    return parsed is not None and _RANK[parsed] >= _RANK[minimum]
