"""Recovery objectives: validate a declaration and merge a group's effective set.

Owns the precedence — an operator's REST declaration over the launcher's (a `transition`'s
`objectives`) over the pool's default over the fleet default — and which source set each
key. The vocabulary (keys, consistency and serving-semantics values, bounds) is the wire
contract's, agents.protocol.Objectives: one definition for the launcher, REST and pools.
Pure: plain dicts in and out, no ORM, no settings read (the caller passes the pool table).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agents.protocol import OBJECTIVE_KEYS, validate_objectives

from console.policy.inputs import PolicyError

OPERATOR = "operator"
LAUNCHER = "launcher"
DEFAULT = "default"


def validated(raw: Any, *, where: str = "objectives") -> dict[str, Any]:
    """Plain validated objectives; PolicyError names the key and what is wrong."""
    if not isinstance(raw, Mapping):
        raise PolicyError(f"{where} must be an object with keys {', '.join(OBJECTIVE_KEYS)}")
    try:
        return validate_objectives(dict(raw))
    except ValueError as exc:
        raise PolicyError(f"{where}: {exc}") from None


def pool_defaults(data: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """`{"default": {...}, "pools": {"h100": {...}}}` -> {"": default, "h100": {...}}, each
    validated (a typo fails loudly at startup, not silently at the first failure)."""
    data = dict(data or {})
    unknown = sorted(set(data) - {"default", "pools"})
    if unknown:
        raise PolicyError(f"objectives: unknown section(s) {', '.join(unknown)}")
    out = {"": validated(data.get("default") or {}, where="objectives default")}
    pools = data.get("pools") or {}
    if not isinstance(pools, Mapping):
        raise PolicyError("objectives: pools must map a pool name to its objectives")
    for name, raw in pools.items():
        out[str(name)] = validated(raw or {}, where=f"objectives pool {name}")
    return out


def effective(
    *,
    declared: Mapping[str, Any] | None,
    pools: Mapping[str, Mapping[str, Any]],
    pool: str = "",
) -> dict[str, Any]:
    """The objectives in force and `sources` (key -> operator | launcher | pool:<name> |
    default). `declared` is the group's stored {"operator": {...}, "launcher": {...}}."""
    declared = declared or {}
    layers: list[tuple[str, Mapping[str, Any]]] = [
        (DEFAULT, pools.get("", {})),
        (f"pool:{pool}", pools.get(pool, {}) if pool else {}),
        (LAUNCHER, declared.get(LAUNCHER) or {}),
        (OPERATOR, declared.get(OPERATOR) or {}),
    ]
    out: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for source, values in layers:
        for key in OBJECTIVE_KEYS:
            if values.get(key) is not None:
                out[key] = values[key]
                sources[key] = source
    out["sources"] = sources
    return out
