"""Console accounts: users created by the CLI, the role an SSO identity holds at each
sign-in, and an admin's edits of users and roles through /admin/, each audited.

faultline.sso decides an SSO user's role from the IdP's groups; `record_sso_sign_in` applies
it and writes the `sso_login` row. The admin's user and role forms (console/admin.py) save
through `save_user`, `delete_user`, `set_role` and `record_password_change`, so every such
edit has an audit row naming the admin, in the same transaction. A role is a Membership
plus Django's staff/superuser flags, kept in step here (admin <=> superuser): the admin
forms never set those flags directly. Passwords and their hashes are never recorded.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from console.actions.audit import actor_name, audit, require
from console.actions.errors import NotAllowed
from console.choices import UserRole
from console.models import Membership
from console.policy.roles import Permission
from console.roles import Actor, role_of

# What an audit row may show of a user's fields; anything else (the password) is named only.
_SHOWN = ("username", "first_name", "last_name", "email", "is_active")


def _flags(user: Any, role: str) -> list[str]:
    """Django's staff and superuser flags follow the role (the admin site is the admins')."""
    admin = role == UserRole.ADMIN
    if user.is_staff == admin and user.is_superuser == admin:
        return []
    user.is_staff = user.is_superuser = admin
    return ["is_staff", "is_superuser"]


@transaction.atomic
def create_user(
    *, actor: str, username: str, role: str, password: str, now: datetime | None = None
) -> Any:
    """A user made outside the admin site (`faultline user create`, the demo's on-call
    operator): the user, their role and its flags, and the audit row naming who made them."""
    if role not in UserRole.values:
        raise ValueError(f"role must be one of {', '.join(UserRole.values)}, got {role!r}")
    user = get_user_model().objects.create_user(username=username, password=password)
    _flags(user, role)
    user.save(update_fields=["is_staff", "is_superuser"])
    Membership.objects.create(user=user, role=role)
    audit(
        actor=actor,
        verb="user.created",
        obj=user,
        object_type="user",
        reason=f"created as {role}",
        data={"values": {"username": username}, "role": role},
        now=now or timezone.now(),
    )
    return user


@transaction.atomic
def save_user(*, actor: Actor, user: Any, changed: list[str], created: bool, now: datetime) -> None:
    """An admin added or edited a user (the admin site's form, already validated)."""
    require(actor, Permission.MANAGE_USERS)
    user.save()
    if created:
        Membership.objects.get_or_create(user=user, defaults={"role": UserRole.VIEWER})
    fields = sorted(set(changed) - {"password1", "password2", "usable_password"})
    audit(
        actor=actor_name(actor),
        verb="user.created" if created else "user.changed",
        obj=user,
        object_type="user",
        reason=f"{'added' if created else 'changed'} in the admin site",
        data={
            "fields": fields,
            "values": {f: getattr(user, f) for f in fields if f in _SHOWN},
            "role": role_of(user),
        },
        now=now,
    )


@transaction.atomic
def delete_user(*, actor: Actor, user: Any, now: datetime) -> None:
    require(actor, Permission.MANAGE_USERS)
    if user.pk == getattr(actor, "pk", None):
        raise NotAllowed("an admin cannot delete their own account")
    audit(
        actor=actor_name(actor),
        verb="user.deleted",
        obj=user,
        object_type="user",
        reason="deleted in the admin site",
        data={"username": user.get_username(), "role": role_of(user)},
        now=now,
    )
    user.delete()


@transaction.atomic
def record_password_change(*, actor: Actor, user: Any, now: datetime) -> None:
    """An admin set (or disabled) a user's password; the form saved it. Never the value."""
    require(actor, Permission.MANAGE_USERS)
    audit(
        actor=actor_name(actor),
        verb="user.password_changed",
        obj=user,
        object_type="user",
        reason="password set in the admin site",
        data={"usable": user.has_usable_password()},
        now=now,
    )


def role_change_problem(user: Any, role: str) -> str | None:
    """Why `user` may not be given `role` now (None when it may): an unknown role, or the
    last active admin losing the role (nobody could give it back)."""
    if role not in UserRole.values:
        return f"role must be one of {', '.join(UserRole.values)}, got {role!r}"
    fresh = type(user).objects.get(pk=user.pk)  # not the form's copy with the role already set
    if role_of(fresh) == UserRole.ADMIN and role != UserRole.ADMIN:
        others = type(user).objects.filter(is_superuser=True, is_active=True).exclude(pk=user.pk)
        if not others.exists():
            return f"{user.get_username()} is the last admin; make another admin first"
    return None


@transaction.atomic
def set_role(*, actor: Actor, user: Any, role: str, now: datetime) -> None:
    """An admin gives a user a role: the Membership and the staff/superuser flags, audited."""
    require(actor, Permission.MANAGE_USERS)
    problem = role_change_problem(user, role)
    if problem is not None:
        raise NotAllowed(problem)
    before = role_of(type(user).objects.get(pk=user.pk))
    Membership.objects.update_or_create(user=user, defaults={"role": role})
    flags = _flags(user, role)
    if flags:
        user.save(update_fields=flags)
    audit(
        actor=actor_name(actor),
        verb="user.role",
        obj=user,
        object_type="user",
        reason=f"role {before} -> {role} in the admin site",
        data={"before": before, "after": role},
        now=now,
    )


@transaction.atomic
def remove_role(*, actor: Actor, user: Any, now: datetime) -> None:
    """An admin deletes a user's Membership: no membership is a viewer, so it is that role
    change (flags, audit row), and then the row goes."""
    set_role(actor=actor, user=user, role=UserRole.VIEWER, now=now)
    Membership.objects.filter(user=user).delete()


@transaction.atomic
def set_password(*, actor: str, user: Any, password: str, now: datetime) -> None:
    """A user's password set outside the admin site (the demo's on-call operator gets a
    fresh one each run); the audit row says it changed, never the value."""
    user.set_password(password)
    user.save(update_fields=["password"])
    audit(
        actor=actor,
        verb="user.password_changed",
        obj=user,
        object_type="user",
        reason="password set",
        data={"usable": True},
        now=now,
    )


@transaction.atomic
def record_sso_sign_in(
    *,
    actor: Actor,
    role: str,
    issuer: str,
    sub: str,
    groups: list[str],
    created: bool,
    now: datetime,
) -> None:
    """`actor` is the SSO user signing in (they act on their own account)."""
    user: Any = actor
    flags = _flags(user, role)
    if flags:
        user.save(update_fields=flags)
    Membership.objects.update_or_create(user=user, defaults={"role": role})
    audit(
        actor=actor_name(actor),
        verb="sso_login",
        obj=user,
        object_type="user",
        reason=f"signed in through {issuer or 'the OpenID provider'} as {role}",
        data={
            "issuer": issuer,
            "sub": sub[:255],
            "groups": groups[:50],
            "role": role,
            "created": created,
        },
        now=now,
    )
