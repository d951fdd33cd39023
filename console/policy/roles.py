"""Roles and what each may do in the console.

Owns the role ladder (viewer < operator < approver < admin) and the permission table: the
one definition of roles (console.choices.UserRole and console.roles are views of it) and
the one place that says which role each verb family needs. Every verb in console.actions
asks this table (through console.actions.audit.require); the views only turn its refusal
into a 403, and decide what to show with `can` too. It must not know about users, sessions
or Django groups: the caller maps a user to a role and asks `can(role, permission)`.
Unknown roles and permissions are refused.
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
    # incidents
    ACKNOWLEDGE = "acknowledge"
    ASSIGN = "assign"
    COMMENT = "comment"
    # remediation actions
    PROPOSE = "propose"
    APPROVE = "approve"
    REJECT = "reject"
    CANCEL_OWN = "cancel_own"
    CANCEL_ANY = "cancel_any"
    ABANDON = "abandon"
    # automation and the fleet
    OPEN_BREAKER = "open_breaker"
    CLOSE_BREAKER = "close_breaker"
    RETURN_TO_SERVICE = "return_to_service"
    SET_GROUP_OBJECTIVES = "set_group_objectives"
    # paging
    MANAGE_SILENCES = "manage_silences"
    MANAGE_POLICIES = "manage_policies"
    MANAGE_CHANNELS = "manage_channels"
    # accounts
    MANAGE_USERS = "manage_users"


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
    Permission.ASSIGN: Role.OPERATOR,
    Permission.COMMENT: Role.OPERATOR,
    Permission.PROPOSE: Role.OPERATOR,
    Permission.APPROVE: Role.APPROVER,
    Permission.REJECT: Role.APPROVER,
    # A proposer withdraws their own proposal; anyone else's is an admin's to cancel (an
    # approver rejects instead, which is a vote and is counted).
    Permission.CANCEL_OWN: Role.OPERATOR,
    Permission.CANCEL_ANY: Role.ADMIN,
    # Giving up on a dispatched action says nobody knows what the agent did: admin only.
    Permission.ABANDON: Role.ADMIN,
    # Anyone who may propose may stop automation (the safe direction). Closing the breaker
    # re-enables automation after it misbehaved, and policies decide what automation may
    # do: admin only.
    Permission.OPEN_BREAKER: Role.OPERATOR,
    Permission.CLOSE_BREAKER: Role.ADMIN,
    # Hardware back in service is a second person's word that it was repaired.
    Permission.RETURN_TO_SERVICE: Role.APPROVER,
    # A group's serving SLO and recovery objectives are the on-call operator's.
    Permission.SET_GROUP_OBJECTIVES: Role.OPERATOR,
    # Silences are the on-call operator's tool during maintenance; they are bounded (reason
    # required, at most 72 h), audited, and never hold back a resolve. Escalation policies
    # and channels decide who is paged, and channels hold secrets: admin only.
    Permission.MANAGE_SILENCES: Role.OPERATOR,
    Permission.MANAGE_POLICIES: Role.ADMIN,
    Permission.MANAGE_CHANNELS: Role.ADMIN,
    # Users, their roles and passwords (the admin site).
    Permission.MANAGE_USERS: Role.ADMIN,
}

# Verbs whose rule depends on the actor's relation to the object: the object's owner (the
# person who proposed an action) may do the key holding only the value; anyone else needs
# the key. So a proposer (operator+) cancels their own action, an admin cancels any.
OWNER_MAY: dict[Permission, Permission] = {
    Permission.CANCEL_ANY: Permission.CANCEL_OWN,
}

# How a refusal names what was refused: "... the operator role is needed for <what>".
WHAT: dict[Permission, str] = {
    Permission.VIEW: "viewing the console",
    Permission.ACKNOWLEDGE: "acknowledging incidents",
    Permission.ASSIGN: "assigning incidents",
    Permission.COMMENT: "commenting on incidents",
    Permission.PROPOSE: "proposing",
    Permission.APPROVE: "approving",
    Permission.REJECT: "rejecting",
    Permission.CANCEL_OWN: "cancelling your own action",
    Permission.CANCEL_ANY: "cancelling another person's action",
    Permission.ABANDON: "abandoning an action",
    Permission.OPEN_BREAKER: "opening the circuit breaker",
    Permission.CLOSE_BREAKER: "closing the circuit breaker",
    Permission.RETURN_TO_SERVICE: "returning hardware to service",
    Permission.SET_GROUP_OBJECTIVES: "changing a group's SLO or objectives",
    Permission.MANAGE_SILENCES: "silences",
    Permission.MANAGE_POLICIES: "escalation policies",
    Permission.MANAGE_CHANNELS: "notification channels",
    Permission.MANAGE_USERS: "managing users and roles",
}


def parse_role(value: str | Role | None) -> Role | None:
    """The role named by `value`, or None when it names no role."""
    if isinstance(value, Role):
        return value
    try:
        return Role(str(value).strip().lower())
    except ValueError:
        return None


def can(role: str | Role | None, permission: str | Permission, *, own: bool = False) -> bool:
    """Whether `role` holds `permission`; anything unknown is refused (fail closed).

    `own`: the actor owns the object, so OWNER_MAY's lesser permission is enough too.
    """
    parsed = parse_role(role)
    try:
        perm = Permission(permission)
    except ValueError:
        return False
    if parsed is None:
        return False
    if own and perm in OWNER_MAY and _RANK[parsed] >= _RANK[MINIMUM_ROLE[OWNER_MAY[perm]]]:
        return True
    return _RANK[parsed] >= _RANK[MINIMUM_ROLE[perm]]


def minimum_role(permission: Permission, *, own: bool = False) -> Role:
    """The least role `can` lets do `permission` (as the owner when `own`)."""
    roles = [MINIMUM_ROLE[permission]]
    if own and permission in OWNER_MAY:
        roles.append(MINIMUM_ROLE[OWNER_MAY[permission]])
    return min(roles, key=_RANK.__getitem__)


def at_least(role: str | Role | None, minimum: Role) -> bool:
    """Whether `role` is `minimum` or above on the ladder."""
    parsed = parse_role(role)
    return parsed is not None and _RANK[parsed] >= _RANK[minimum]
