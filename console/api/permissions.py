"""DRF permissions by console role; anonymous callers are always refused."""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import BasePermission

from console.choices import UserRole
from console.roles import has_role


class _RoleAtLeast(BasePermission):
    minimum: str = UserRole.VIEWER

    def has_permission(self, request: Any, view: Any) -> bool:
        return has_role(request.user, self.minimum)


class IsViewer(_RoleAtLeast):
    minimum = UserRole.VIEWER


class IsOperator(_RoleAtLeast):
    minimum = UserRole.OPERATOR


class IsApprover(_RoleAtLeast):
    minimum = UserRole.APPROVER


class IsAdmin(_RoleAtLeast):
    minimum = UserRole.ADMIN
