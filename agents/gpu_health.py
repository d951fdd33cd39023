"""GPU health vocabulary: throttle reason names, what they mean, and the health ordering.

The one definition of these rules, shared by the agent (which decodes NVML's reason bits
to these names), ingest (a GPU's live health from its newest sample; minute rollups count
throttled GPUs), the console (the fleet grid's colours) and the diagnosis engine
(thermal or power throttling as a cause). Plain standard-library Python over plain
values, like `agents/protocol.py`: it must not import the service, Django or NVML.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from agents import vocab

# -- health ---------------------------------------------------------------------------------
# The health values and their order are agents/vocab.py's; the short names are this module's.
OK, UNKNOWN, WARNING = vocab.HEALTH_OK, vocab.HEALTH_UNKNOWN, vocab.HEALTH_WARNING
CRITICAL, DOWN = vocab.HEALTH_CRITICAL, vocab.HEALTH_DOWN
HEALTH_ORDER = vocab.HEALTH_ORDER

# -- throttle reasons -----------------------------------------------------------------------
# nvmlClocksEventReason* bits (formerly "throttle reasons"), decoded to stable names that
# travel in `device_sample.throttle_reasons`; unknown bits travel as `bit_0x...`.
THROTTLE_BITS: tuple[tuple[int, str], ...] = (
    (0x0001, "gpu_idle"),
    (0x0002, "applications_clocks_setting"),
    (0x0004, "sw_power_cap"),
    (0x0008, "hw_slowdown"),
    (0x0010, "sync_boost"),
    (0x0020, "sw_thermal_slowdown"),
    (0x0040, "hw_thermal_slowdown"),
    (0x0080, "hw_power_brake_slowdown"),
    (0x0100, "display_clock_setting"),
)
# "hw_power_brake" is the legacy short name of hw_power_brake_slowdown (older agents).
THERMAL_REASONS = frozenset({"sw_thermal_slowdown", "hw_thermal_slowdown"})
POWER_REASONS = frozenset({"sw_power_cap", "hw_power_brake_slowdown", "hw_power_brake"})
# Clocks cut for heat or power: what the minute rollups count as a throttled GPU. gpu_idle,
# sync_boost and application/display clock settings are not throttling anyone should see.
SLOWDOWN_REASONS = THERMAL_REASONS | POWER_REASONS | {"hw_slowdown"}
# Slowdowns that make a GPU unhealthy on their own: hardware slowdowns and heat. A software
# power cap alone is normal on a busy GPU; it matters only when it inflates step time.
WARNING_REASONS = SLOWDOWN_REASONS - {"sw_power_cap"}

WARNING_TEMP_C = 85.0
# Device events that make a GPU critical at once (and push its node card without delay).
CRITICAL_EVENTS = vocab.HARDWARE_FAULT_KINDS


def decode_throttle_reasons(mask: int) -> list[str]:
    """Names of the set bits; unknown bits become `bit_0x...` so nothing is hidden."""
    names = [name for bit, name in THROTTLE_BITS if mask & bit]
    known = 0
    for bit, _ in THROTTLE_BITS:
        known |= bit
    rest = mask & ~known
    bit = 1
    while rest:
        if rest & bit:
            names.append(f"bit_{bit:#x}")
            rest &= ~bit
        bit <<= 1
    return names


def throttle_kind(reasons: Iterable[str]) -> str | None:
    """`thermal_throttle`, `power_throttle` or None for a sample's throttle reasons."""
    names = set(reasons)
    if names & THERMAL_REASONS:
        return "thermal_throttle"
    if names & POWER_REASONS:
        return "power_throttle"
    return None


def sample_health(sample: Mapping[str, Any]) -> str:
    """A GPU's health from its newest sample (a `device_sample` as plain values).

    Double-bit ECC errors or pending row remaps are critical; a hardware or thermal
    slowdown, or a temperature at WARNING_TEMP_C or above, is a warning.
    """
    if (sample.get("ecc_dbe") or 0) > 0 or (sample.get("retired_or_remapped_pending") or 0) > 0:
        return CRITICAL
    temp = sample.get("temp_c")
    if not WARNING_REASONS.isdisjoint(sample.get("throttle_reasons") or ()) or (
        temp is not None and not math.isnan(temp) and temp >= WARNING_TEMP_C
    ):
        return WARNING
    return OK


def worst_health(healths: Iterable[str], *, default: str = OK) -> str:
    """The worst of these healths; a value outside HEALTH_ORDER counts as unknown."""
    ranked = [h if h in HEALTH_ORDER else UNKNOWN for h in healths]
    return max(ranked, key=HEALTH_ORDER.index, default=default)
