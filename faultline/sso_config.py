"""Parsing of the single sign-on settings that settings.py reads (no Django, no models).

Owns the FAULTLINE_OIDC_ROLE_MAP format, `GROUP=ROLE,GROUP=ROLE`; faultline.sso applies it.
"""

from __future__ import annotations

from console.policy.roles import Role  # plain Python: safe to import from settings

ROLES = tuple(role.value for role in Role)  # the ladder, lowest first


def parse_role_map(raw: list[str]) -> dict[str, str]:
    """`group=role` items -> {group: role}; raises ValueError naming a bad item and the fix."""
    out: dict[str, str] = {}
    for item in raw:
        group, sep, role = item.rpartition("=")
        group, role = group.strip(), role.strip()
        if not sep or not group or role not in ROLES:
            raise ValueError(
                f"FAULTLINE_OIDC_ROLE_MAP item {item!r} must be GROUP=ROLE with ROLE one of "
                f"{', '.join(ROLES)}"
            )
        out[group] = role
    return out
