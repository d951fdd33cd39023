"""Plain inputs the safety gates read: requests, votes, fleet, history, breaker, policy.

Owns the frozen dataclasses the caller builds from its storage, and `Policy.from_dict`,
which reads gate settings from a plain dict (settings or a database row) and fails
loudly on unknown keys or bad values. It must not evaluate gates or do I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import datetime, timedelta
from typing import Any

from console.policy.lifecycle import ActionKind, ActionState


class PolicyError(ValueError):
    """A policy setting that is unknown or has a value the gates cannot use."""


@dataclass(frozen=True)
class Limit:
    """A cap on things out of service at once: a count, or a percent of the total.

    Like Medik8s maxUnhealthy. A percent is floored: 25 % of 6 nodes allows 1 out,
    so small pools hold proposals for a human rather than empty out.
    """

    count: int | None = None
    percent: float | None = None

    @classmethod
    def parse(cls, value: object, *, name: str) -> Limit:
        if isinstance(value, Limit):
            return value
        if isinstance(value, bool):
            raise PolicyError(f'{name} must be a count or a percent like "25%", got {value!r}')
        if isinstance(value, int) and value >= 0:
            return cls(count=value)
        if isinstance(value, str) and value.strip().endswith("%"):
            try:
                pct = float(value.strip()[:-1])
            except ValueError:
                pct = -1.0
            if 0 <= pct <= 100:
                return cls(percent=pct)
        raise PolicyError(f'{name} must be a count or a percent like "25%", got {value!r}')

    def allowed(self, total: int) -> int:
        """How many of `total` may be out of service at once."""
        if self.count is not None:
            return self.count
        return math.floor(total * (self.percent or 0.0) / 100)

    def describe(self) -> str:
        return f"{self.count}" if self.count is not None else f"{self.percent:g} %"


@dataclass(frozen=True)
class ActionRequest:
    """One proposed remediation as the gates see it.

    `proposed_by` is the user name, or None when automation proposed it. `generation`
    is the target group's generation when the action was proposed; dispatch refuses
    the action if the group moved on. `auto_restart_safe` and `restart_advice` come
    from the diagnosis recovery advice of the root cause.
    """

    id: str
    kind: ActionKind
    target: str
    proposed_at: datetime
    expires_at: datetime
    proposed_by: str | None = None
    state: ActionState = ActionState.PROPOSED
    node: str | None = None
    gpu: str | None = None
    group: str | None = None
    generation: int | None = None
    trigger: str | None = None
    auto_restart_safe: bool | None = None
    restart_advice: str = ""
    # Putting capacity back: the target's health lifecycle (console.policy.fleet_health).
    replace_flagged: bool = False  # a repeat offender: an approver returns it
    taken_out_by: str = ""  # "faultline", "operator", "scheduler" or "" (in service)

    @property
    def automatic(self) -> bool:
        return self.proposed_by is None


@dataclass(frozen=True)
class Vote:
    """One approver's decision, bound to one action and the generation it was cast on."""

    action_id: str
    voter: str
    role: str
    approve: bool
    cast_at: datetime
    generation: int | None = None


@dataclass(frozen=True)
class FleetState:
    """Inventory and what is out of service now.

    `pools` maps pool -> node count; `pool_gpus` pool -> GPU count; `node_pool`
    node -> pool; `gpu_node` GPU uuid -> node. `generations` maps group -> its
    current generation.
    """

    pools: Mapping[str, int]
    node_pool: Mapping[str, str]
    quarantined: frozenset[str] = frozenset()
    cordoned: frozenset[str] = frozenset()
    pool_gpus: Mapping[str, int] = field(default_factory=dict)
    gpu_node: Mapping[str, str] = field(default_factory=dict)
    isolated_gpus: frozenset[str] = frozenset()
    generations: Mapping[str, int] = field(default_factory=dict)

    @property
    def nodes_out(self) -> frozenset[str]:
        return self.quarantined | self.cordoned

    def gpu_pool(self, gpu: str) -> str | None:
        node = self.gpu_node.get(gpu)
        return self.node_pool.get(node) if node is not None else None


@dataclass(frozen=True)
class ActionRecord:
    """One action that was dispatched (it counts for rate limits and the breaker)."""

    kind: ActionKind
    target: str
    at: datetime
    automatic: bool
    node: str | None = None
    failed: bool = False


@dataclass(frozen=True)
class RecentActions:
    """Dispatched actions; the caller passes at least the longest policy window."""

    records: tuple[ActionRecord, ...] = ()

    @classmethod
    def of(cls, records: Iterable[ActionRecord]) -> RecentActions:
        return cls(tuple(records))

    def since(self, start: datetime) -> list[ActionRecord]:
        return [r for r in self.records if r.at > start]


@dataclass(frozen=True)
class BreakerState:
    """The automation circuit breaker: while open every action needs a human."""

    open: bool = False
    reason: str = ""
    opened_at: datetime | None = None
    closed_at: datetime | None = None
    closed_by: str | None = None
    close_reason: str = ""


def _positive_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PolicyError(f"{name} must be a whole number of at least 1, got {value!r}")
    return value


def _kind(value: object, name: str) -> ActionKind:
    try:
        return ActionKind(str(value))
    except ValueError:
        known = ", ".join(k.value for k in ActionKind)
        raise PolicyError(f'{name}: unknown action kind "{value}"; known: {known}') from None


_LIMIT_KEYS = frozenset(
    {
        "max_nodes_out_per_pool",
        "max_nodes_out_fleet",
        "max_gpus_out_per_pool",
        "max_gpus_out_fleet",
    }
)


@dataclass(frozen=True)
class Policy:
    """Gate settings. The defaults are the safe ones; see docs/safety.md."""

    max_nodes_out_per_pool: Limit = Limit(percent=25)
    max_nodes_out_fleet: Limit = Limit(percent=20)
    max_gpus_out_per_pool: Limit = Limit(percent=25)
    max_gpus_out_fleet: Limit = Limit(percent=20)
    rate_window_s: int = 600
    max_per_kind: int = 5
    max_per_kind_overrides: Mapping[ActionKind, int] = field(default_factory=dict)
    max_per_target: int = 2
    repeat_window_s: int = 86_400
    max_repeats_per_node: int = 2
    breaker_window_s: int = 600
    breaker_max_automatic: int = 10
    breaker_max_failures: int = 3
    # Auto-approval is off unless a kind is listed, with the triggers it may follow
    # ("xid:79" matches exactly, "xid" matches any xid, "*" anything).
    auto_approve: Mapping[ActionKind, tuple[str, ...]] = field(default_factory=dict)
    approvals_required: int = 1
    approvals_above_limit: int = 2
    proposal_ttl_s: int = 3_600

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Policy:
        """Read a policy from plain data; keys absent keep their defaults."""
        data = dict(data or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise PolicyError(
                f"unknown policy setting(s): {', '.join(unknown)}; "
                f"known: {', '.join(sorted(known))}"
            )
        values: dict[str, Any] = {}
        for key, raw in data.items():
            if key in _LIMIT_KEYS:
                values[key] = Limit.parse(raw, name=key)
            elif key == "max_per_kind_overrides":
                if not isinstance(raw, Mapping):
                    raise PolicyError(f"{key} must map action kind to a count, got {raw!r}")
                values[key] = {
                    _kind(k, key): _positive_int(v, f"{key}[{k}]") for k, v in raw.items()
                }
            elif key == "auto_approve":
                values[key] = cls._auto_approve(raw)
            else:
                values[key] = _positive_int(raw, key)
        policy = replace(cls(), **values)
        if policy.approvals_above_limit < policy.approvals_required:
            raise PolicyError(
                "approvals_above_limit must be at least approvals_required "
                f"({policy.approvals_above_limit} < {policy.approvals_required})"
            )
        return policy

    @staticmethod
    def _auto_approve(raw: object) -> dict[ActionKind, tuple[str, ...]]:
        if not isinstance(raw, Mapping):
            raise PolicyError(f"auto_approve must map action kind to triggers, got {raw!r}")
        out: dict[ActionKind, tuple[str, ...]] = {}
        for key, triggers in raw.items():
            if isinstance(triggers, str) or not isinstance(triggers, Iterable):
                raise PolicyError(f"auto_approve[{key}] must be a list of triggers like xid:79")
            items = tuple(str(t).strip() for t in triggers)
            if not items or any(not t for t in items):
                raise PolicyError(f"auto_approve[{key}] must name at least one trigger")
            out[_kind(key, "auto_approve")] = items
        return out

    def kind_limit(self, kind: ActionKind) -> int:
        return self.max_per_kind_overrides.get(kind, self.max_per_kind)

    def auto_approves(self, kind: ActionKind, trigger: str | None) -> bool:
        """Whether this policy lets automation approve `kind` after `trigger`."""
        allowed = self.auto_approve.get(kind, ())
        if not allowed or not trigger:
            return False
        family = trigger.split(":", 1)[0]
        return any(t in ("*", trigger, family) for t in allowed)

    def expires_at(self, proposed_at: datetime) -> datetime:
        """When a proposal made at `proposed_at` stops accepting votes."""
        return proposed_at + timedelta(seconds=self.proposal_ttl_s)
