"""Single sign-on's one write: the role an IdP identity holds, set at each sign-in, audited.

faultline.sso decides the role from the IdP's groups; this verb applies it (Membership,
and Django's staff/superuser flags for admins, demotion included) and writes the
`sso_login` audit row naming the SSO identity. It must not create or touch local accounts.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction

from console.actions.audit import actor_name, audit
from console.models import Membership
from console.roles import Actor


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
    admin = role == "admin"
    if user.is_staff != admin or user.is_superuser != admin:
        user.is_staff = user.is_superuser = admin
        user.save(update_fields=["is_staff", "is_superuser"])
    Membership.objects.update_or_create(user=user, defaults={"role": role})
    audit(
        actor=actor_name(actor),
        verb="sso_login",
        obj=user,
        object_type="user",
        reason=f"signed in through {issuer or 'the OpenID provider'} as {role}",
        data={"issuer": issuer, "sub": sub[:255], "groups": groups[:50], "role": role,
              "created": created},
        now=now,
    )  # fmt: skip
