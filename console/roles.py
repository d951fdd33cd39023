"""A user's console role (viewer, operator, approver, admin) from their Membership."""

from __future__ import annotations

from typing import Any

from console.choices import ROLE_ORDER, UserRole


def role_of(user: Any) -> str:
    if not getattr(user, "is_authenticated", False):
        return ""
    if user.is_superuser:
        return UserRole.ADMIN
    membership = getattr(user, "membership", None)
    return membership.role if membership is not None else UserRole.VIEWER


def has_role(user: Any, minimum: str) -> bool:
    role = role_of(user)
    return bool(role) and ROLE_ORDER.index(role) >= ROLE_ORDER.index(minimum)
