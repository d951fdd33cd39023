"""Console users and their roles (scripted set-up: `faultline user create`)."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import transaction

from console.choices import UserRole
from console.models import Membership


@transaction.atomic
def create_user(*, username: str, role: str, password: str) -> object:
    if role not in UserRole.values:
        raise ValueError(f"role must be one of {', '.join(UserRole.values)}, got {role!r}")
    user_model = get_user_model()
    user = user_model.objects.create_user(
        username=username, password=password, is_staff=role == UserRole.ADMIN
    )
    if role == UserRole.ADMIN:
        user.is_superuser = True
        user.save(update_fields=["is_superuser"])
    Membership.objects.create(user=user, role=role)
    return user
