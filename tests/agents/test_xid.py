"""The Xid catalog: its shape against NVIDIA's, overrides, recovery actions, dedup keys."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agents import xid
from agents.agent import Agent
from agents.cli import ConfigError, _parser, build_config
from agents.protocol import RECOVERY_ACTIONS, ContractError

from .conftest import validate

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


@pytest.fixture
def restore_catalog() -> Iterator[None]:
    before = xid.active()
    yield
    xid.install(before)


# -- shape ------------------------------------------------------------------------------


def test_it_lists_every_code_nvidia_catalogs_for_ampere_and_newer() -> None:
    # 1-172 from NVIDIA's catalog page, 173-176 from the driver's nverror.h (595.45.04).
    assert xid.CATALOG.codes() == list(range(1, 177))


def test_it_gives_every_row_a_known_class_bucket_and_gpu_list() -> None:
    for code in xid.CATALOG.codes():
        info = xid.CATALOG.get(code)
        assert info.code == code and info.known and not info.overridden
        assert info.mnemonic and info.mnemonic == info.mnemonic.upper(), code
        assert info.meaning and len(info.meaning) <= 96, code
        assert info.xid_class in xid.CLASSES, code
        assert info.immediate in xid.IMMEDIATE_ACTIONS, code
        assert info.investigatory, code
        assert set(info.gpus) <= set(xid.GPUS), code
        assert len(xid.detail(code)) <= 256


def test_it_keeps_unused_codes_undetermined_and_applicable_to_no_gpu() -> None:
    unused = [c for c in xid.CATALOG.codes() if xid.CATALOG.get(c).meaning == "Unused"]
    assert len(unused) > 50
    for code in unused:
        info = xid.CATALOG.get(code)
        assert (info.xid_class, info.gpus, info.immediate) == (
            "undetermined",
            (),
            "CONTACT_SUPPORT",
        )


def test_it_classes_codes_the_way_nvidias_buckets_say() -> None:
    for code in xid.CATALOG.codes():
        info = xid.CATALOG.get(code)
        if info.immediate == "RESTART_APP":
            assert info.xid_class == "application", code
        if info.immediate in {
            "RESET_GPU",
            "RESTART_BM",
            "WORKFLOW_XID_48",
            "WORKFLOW_NVLINK_ERR",
        }:
            assert info.xid_class == "hardware", code
        if info.immediate == "WORKFLOW_NVLINK5_ERR":  # the decode of each line decides
            assert info.xid_class == "undetermined", code


@pytest.mark.parametrize(
    ("code", "cls", "immediate"),
    [
        (13, "application", "RESTART_APP"),
        (31, "application", "RESTART_APP"),
        (43, "application", "IGNORE"),  # "the GPU remains in a healthy state"
        (94, "application", "RESTART_APP"),
        (137, "application", "IGNORE"),  # NVLink in the name, a program's illegal access
        (45, "consequence", "WORKFLOW_XID_45"),
        (48, "hardware", "WORKFLOW_XID_48"),
        (74, "hardware", "WORKFLOW_NVLINK_ERR"),
        (79, "hardware", "RESTART_BM"),
        (95, "hardware", "RESET_GPU"),
        (149, "undetermined", "WORKFLOW_NVLINK5_ERR"),
        (173, "hardware", "RESTART_BM"),
        (174, "application", "RESTART_APP"),
        (175, "hardware", "RESET_GPU"),
        (176, "undetermined", "CONTACT_SUPPORT"),
        (63, "informational", "IGNORE"),
        (92, "informational", "IGNORE"),
        (154, "informational", "XID_154"),
    ],
)
def test_it_matches_nvidias_catalog_for_the_codes_fleets_meet(code, cls, immediate) -> None:
    info = xid.CATALOG.get(code)
    assert (info.xid_class, info.immediate) == (cls, immediate)


def test_it_records_which_gpus_a_code_applies_to() -> None:
    assert xid.CATALOG.get(74).gpus == ("A100", "H100")  # NVLink 5 uses 144-150
    assert xid.CATALOG.get(144).gpus == ("B100", "GB200")
    assert xid.CATALOG.get(121).gpus == ("GB200",)
    assert xid.CATALOG.get(13).gpus == xid.GPUS


def test_it_makes_an_unknown_code_undetermined() -> None:
    info = xid.CATALOG.get(31337)
    assert (info.known, info.xid_class, info.takes_gpu_out) == (False, "undetermined", False)


def test_it_counts_only_hardware_codes_as_hardware_faults() -> None:
    hw = xid.CATALOG.hardware_codes
    assert {46, 48, 62, 64, 74, 79, 95, 109, 110, 119, 120, 136, 140, 143, 155, 156} <= hw
    assert hw.isdisjoint({13, 31, 43, 45, 63, 92, 94, 154})
    assert xid.is_hardware_fault("xid", 79) and not xid.is_hardware_fault("xid", 13)
    assert xid.is_hardware_fault("gpu_lost") and xid.is_hardware_fault("ecc_dbe")
    assert not xid.is_hardware_fault("thermal")
    assert not xid.is_hardware_fault("xid", 31337)  # unknown: a human looks, node stays


def test_it_turns_any_xid_into_a_hardware_fault_when_the_driver_asks_for_action() -> None:
    assert xid.is_hardware_fault("xid", 154, "node_reboot")
    assert xid.is_hardware_fault("xid", 13, "drain_and_reset")
    assert not xid.is_hardware_fault("xid", 154, "none")
    assert not xid.is_hardware_fault("xid", 154)


@pytest.mark.parametrize("code", range(144, 151))
def test_it_lets_an_nvlink5_xids_decode_decide_whether_it_takes_the_gpu_out(code) -> None:
    info = xid.CATALOG.get(code)
    assert xid.effective_class(info, "gpu_reset") == "hardware"  # a fatal decode
    assert xid.effective_class(info, "none") == "informational"  # any other decode
    assert xid.effective_class(info, None) == "undetermined"  # no decode: a human looks
    assert not xid.is_hardware_fault("xid", code) and xid.is_hardware_fault(
        "xid", code, "gpu_reset"
    )
    # "none" makes only NVLink5's own workflow informational: another code keeps its class.
    assert xid.effective_class(xid.CATALOG.get(95), "none") == "hardware"
    assert xid.effective_class(xid.CATALOG.get(31337), "none") == "undetermined"


def test_it_keeps_an_operators_class_for_an_nvlink5_xid_over_a_non_fatal_decode() -> None:
    catalog = xid.CATALOG.with_overrides({145: {"class": "hardware"}})
    assert xid.effective_class(catalog.get(145), "none") == "hardware"


# -- recovery action ----------------------------------------------------------------------


def test_it_names_nvmls_recovery_actions_as_the_contract_does() -> None:
    assert [xid.recovery_action_name(v) for v in range(5)] == [
        "none",
        "gpu_reset",
        "node_reboot",
        "drain_p2p",
        "drain_and_reset",
    ]
    assert set(xid.RECOVERY_ACTIONS) == set(RECOVERY_ACTIONS)
    assert xid.recovery_action_name(7) is None and xid.recovery_action_name(None) is None


def test_it_accepts_device_events_with_and_without_a_recovery_action() -> None:
    base = {"kind": "device_event", "ts": "2026-12-01T10:00:00.000Z", "gpu": "GPU-1",
            "event": "xid", "code": 62}  # fmt: skip
    (old,) = validate([base]).records  # a v1 agent that never sends it stays accepted
    assert old.recovery_action is None
    (new,) = validate([{**base, "recovery_action": "gpu_reset"}]).records
    assert new.recovery_action == "gpu_reset"
    with pytest.raises(ContractError, match="recovery_action"):
        validate([{**base, "recovery_action": "reboot_please"}])


# -- overrides ----------------------------------------------------------------------------


def test_it_applies_an_override_without_touching_the_stock_catalog() -> None:
    cat = xid.CATALOG.with_overrides({"13": {"class": "hardware", "action": "reset_gpu"}})
    info = cat.get(13)
    assert (info.xid_class, info.immediate, info.overridden) == ("hardware", "RESET_GPU", True)
    assert info.mnemonic == "ROBUST_CHANNEL_GR_EXCEPTION"  # the rest stays NVIDIA's
    assert 13 in cat.hardware_codes and 13 not in xid.CATALOG.hardware_codes
    assert xid.CATALOG.get(13).xid_class == "application"


def test_it_lets_an_operator_classify_a_code_nvidia_does_not_list_yet() -> None:
    cat = xid.CATALOG.with_overrides({900: {"class": "hardware", "action": "RESTART_BM"}})
    assert cat.get(900).known and cat.get(900).takes_gpu_out


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"thirteen": {"class": "hardware"}}, "key 'thirteen' must be an Xid number"),
        ({13: {"class": "broken"}}, "class 'broken' must be one of application"),
        ({13: {"action": "PRAY"}}, "action 'PRAY' must be one of RESTART_APP"),
        ({13: {"severity": "high"}}, "unknown key 'severity'"),
        ({13: "hardware"}, "must be a table"),
        ({0: {"class": "hardware"}}, "not a valid Xid number"),
    ],
)
def test_it_refuses_a_bad_override_naming_code_key_and_fix(overrides, message) -> None:
    with pytest.raises(xid.OverrideError, match=message):
        xid.CATALOG.with_overrides(overrides)


def test_it_loads_overrides_from_toml_and_json_files(tmp_path: Path) -> None:
    toml = tmp_path / "xids.toml"
    toml.write_text('[overrides]\n13 = { class = "hardware", action = "RESET_GPU" }\n')
    assert xid.load_overrides(toml).get(13).xid_class == "hardware"
    data = tmp_path / "xids.json"
    data.write_text(json.dumps({"43": {"class": "informational"}}))
    assert xid.load_overrides(data).get(43).xid_class == "informational"
    (tmp_path / "bad.toml").write_text("13 = {class = \n")
    with pytest.raises(xid.OverrideError, match=r"bad\.toml"):
        xid.load_overrides(tmp_path / "bad.toml")
    with pytest.raises(xid.OverrideError, match=r"missing\.toml"):
        xid.load_overrides(tmp_path / "missing.toml")


def test_it_reads_the_agents_overrides_from_agent_toml(
    tmp_path: Path, monkeypatch, restore_catalog
) -> None:
    for key in list(os.environ):
        if key.startswith("FAULTLINE_"):
            monkeypatch.delenv(key)
    conf = tmp_path / "agent.toml"
    conf.write_text('dry_run = true\n[xid_overrides]\n13 = { class = "hardware" }\n')
    cfg = build_config(_parser().parse_args(["run", "--config", str(conf)]))
    assert cfg.xid_catalog is not None and cfg.xid_catalog.get(13).xid_class == "hardware"
    cfg.state_dir = tmp_path / "state"
    Agent(cfg, out=io.StringIO())
    assert "hardware" in xid.detail(13)  # what this agent now sends
    conf.write_text('dry_run = true\n[xid_overrides]\n13 = { class = "sometimes" }\n')
    with pytest.raises(ConfigError, match=r"\[xid_overrides\]: Xid override 13: class"):
        build_config(_parser().parse_args(["run", "--config", str(conf)]))


# -- one Xid, two witnesses -----------------------------------------------------------------


def test_it_makes_one_event_of_an_xid_seen_in_the_kernel_log_and_through_nvml() -> None:
    dedup = xid.XidDeduper(window_s=5.0)
    key, new = dedup.admit("GPU-1", 79, T0, "kmsg")
    again, second = dedup.admit("GPU-1", 79, T0 + timedelta(seconds=0.4), "nvml")
    assert (new, second, again) == (True, False, key)
    assert key == xid.event_key("GPU-1", 79, T0)
    assert dedup.sources("GPU-1", 79) == {"kmsg", "nvml"}


def test_it_keeps_other_gpus_other_codes_and_recurrences_apart() -> None:
    dedup = xid.XidDeduper(window_s=5.0)
    first, _ = dedup.admit("GPU-1", 79, T0, "nvml")
    assert dedup.admit("GPU-2", 79, T0, "nvml")[1]
    assert dedup.admit("GPU-1", 48, T0, "nvml")[1]
    later, new = dedup.admit("GPU-1", 79, T0 + timedelta(seconds=30), "kmsg")
    assert new and later != first
