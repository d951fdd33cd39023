"""The one definition of GPU health: throttle reason names, health from a sample, ordering."""

from __future__ import annotations

import math

from agents import gpu_health as gh


def test_it_names_every_reason_it_judges_as_the_agent_decodes_it():
    decoded = set(gh.decode_throttle_reasons(sum(bit for bit, _ in gh.THROTTLE_BITS)))
    # The legacy short name is the only one no current agent sends.
    assert gh.SLOWDOWN_REASONS - decoded == {"hw_power_brake"}


def test_it_leaves_a_software_power_cap_healthy_but_counts_it_as_a_slowdown():
    assert gh.sample_health({"temp_c": 60.0, "throttle_reasons": ["sw_power_cap"]}) == gh.OK
    assert "sw_power_cap" in gh.SLOWDOWN_REASONS
    assert gh.throttle_kind(["sw_power_cap"]) == "power_throttle"


def test_it_warns_on_a_hardware_or_thermal_slowdown_or_heat():
    assert gh.sample_health({"throttle_reasons": ["hw_slowdown"]}) == gh.WARNING
    assert gh.sample_health({"throttle_reasons": ["sw_thermal_slowdown"]}) == gh.WARNING
    assert gh.sample_health({"temp_c": gh.WARNING_TEMP_C}) == gh.WARNING
    assert gh.sample_health({"temp_c": gh.WARNING_TEMP_C - 0.1}) == gh.OK
    assert gh.sample_health({"temp_c": math.nan}) == gh.OK


def test_it_makes_a_double_bit_error_or_pending_remap_critical_whatever_else():
    assert gh.sample_health({"ecc_dbe": 1, "temp_c": 40.0}) == gh.CRITICAL
    assert gh.sample_health({"retired_or_remapped_pending": 2}) == gh.CRITICAL


def test_it_tells_thermal_from_power_throttling_and_ignores_clock_settings():
    assert gh.throttle_kind(["hw_power_brake_slowdown", "hw_thermal_slowdown"]) == (
        "thermal_throttle"
    )
    assert gh.throttle_kind(["hw_power_brake"]) == "power_throttle"
    assert gh.throttle_kind(["gpu_idle", "sync_boost", "hw_slowdown", "bit_0x1000"]) is None


def test_it_orders_health_worst_last_and_reads_an_unknown_value_as_unknown():
    assert gh.worst_health(["ok", "critical", "warning"]) == "critical"
    assert gh.worst_health(["down", "critical"]) == "down"
    assert gh.worst_health(["ok", "melted"]) == "unknown"
    assert gh.worst_health([]) == "ok"
