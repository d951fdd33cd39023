"""NVIDIA's decode of NVLink5 Xids (144-150) and the Xid 154 recovery action, line by line."""

from __future__ import annotations

import pytest

from agents import xid, xid_decode

LINE = "{unit} {sev} XC0 i0 Link 04 (0x{intrinfo:08x} 0x{status:08x} 0x00000000 0x00000000)"


def _decode(code: int, unit: str, status: int, intrinfo: int = 0, sev: str = "Nonfatal"):
    tail = ", " + LINE.format(unit=unit, sev=sev, intrinfo=intrinfo, status=status)
    decode = xid_decode.nvlink5_decode(code, tail)
    assert decode is not None
    return decode


@pytest.mark.parametrize(
    ("code", "unit", "status", "fatal"),
    [
        (144, "SAW_MVB", 0x1, False),
        (144, "SAW_MVB", 0x2, True),
        (144, "SAW_MVB", 0x10, True),
        (145, "RLW_REMAP", 0x1, False),  # XID_154_EVAL: the Xid 154 that follows decides
        (145, "RLW_REMAP", 0x80, True),
        (145, "RLW_SRC_TRACK", 0x1, True),
        (145, "RLW_TAGSTATE", 0x100000, True),
        (145, "RLW_RXPIPE", 0x4, False),
        (146, "TLW_TX_PIPE1", 0x4, True),
        (146, "TLW_CTRL", 0x2, False),
        (147, "TREX", 0x1, False),
        (148, "NVLPW", 0x80000000, False),
        (149, "NETIR_MFDE_EVENT", 0x3, False),
        (149, "NETIR_MFDE_EVENT", 0x7, True),
        (149, "NETIR_INT", 0x0, True),
        (150, "MSE_WATCHDOG", 0x0, True),
    ],
)
def test_it_decodes_each_unit_and_status_as_nvidias_sheet_does(code, unit, status, fatal) -> None:
    decode = _decode(code, unit, status, sev="Fatal" if not fatal else "Nonfatal")
    # The sheet, not the printed word, decides where it has a row.
    assert decode.known and decode.fatal == fatal
    assert decode.recovery_action == ("gpu_reset" if fatal else "none")


@pytest.mark.parametrize(
    ("subcode", "fatal", "investigate"),
    [
        (0b000000, True, "SYMPATHETIC_REPORT_SOLO"),
        (0b000100, True, "INVESTIGATE_LINK_SI"),
        (0b100101, True, "INVESTIGATE_PEER_DEVICE"),
        (0b100110, False, "INVESTIGATE_SW_USER"),
        (0b101000, False, "INVESTIGATE_HOST"),
        (0b101011, True, "INVESTIGATE_LINK_SI_AND_CABLES"),
    ],
)
def test_it_reads_why_a_link_went_down_from_intrinfo_bits_20_to_25(subcode, fatal, investigate):
    decode = _decode(149, "NETIR_LINK_EVT", 0, intrinfo=subcode << 20 | 0x1C6, sev="Fatal")
    assert (decode.known, decode.fatal, decode.investigatory) == (True, fatal, investigate)


def test_it_takes_the_worst_of_several_status_bits() -> None:
    assert _decode(145, "RLW_REMAP", 0x41).fatal  # 0x1 evaluate, 0x40 reset
    assert not _decode(145, "RLW_REMAP", 0x101).fatal  # 0x1 evaluate, 0x100 ignore


@pytest.mark.parametrize("sev", ["Fatal", "Nonfatal"])
def test_it_falls_back_to_the_drivers_word_where_the_sheet_has_no_row(sev) -> None:
    for decode in (
        _decode(145, "RLW_CTRL", 0x4, sev=sev),  # a status bit the sheet lists no row for
        _decode(145, "RLW_FUTURE_UNIT", 0x1, sev=sev),  # a unit it does not list
        _decode(149, "NETIR_LINK_EVT", 0, intrinfo=0b111111 << 20, sev=sev),
    ):
        assert not decode.known and decode.fatal == (sev == "Fatal")
        assert "the driver's severity" in decode.detail


def test_it_shows_the_decode_as_bounded_text_of_its_own_words() -> None:
    decode = _decode(149, "NETIR_LINK_EVT", 0, intrinfo=0x025525C6, sev="Fatal")
    assert decode.detail == (
        "NVLink5 NETIR_LINK_EVT link fatal on link 4, status 0x00000000, intrinfo 0x025525c6: "
        "RESET_GPU per NVIDIA's decode; investigate: INVESTIGATE_PEER_DEVICE"
    )
    assert len(decode.detail) <= 256


@pytest.mark.parametrize("code", [13, 79, 143, 151, 154])
def test_it_decodes_only_nvlink5_codes(code) -> None:
    assert xid_decode.nvlink5_decode(code, ", " + LINE.format(
        unit="SAW_MVB", sev="Fatal", intrinfo=0x21, status=0x2)) is None  # fmt: skip


@pytest.mark.parametrize(
    ("tail", "current"),
    [
        ("GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", "gpu_reset"),
        (
            "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
            "node_reboot",
        ),
        ("GPU recovery action changed from 0x0 (None) to 0x3 (Drain P2P)", "drain_p2p"),
        ("GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)", "drain_and_reset"),
        ("GPU recovery action changed from 0x4 (Drain and Reset) to 0x0 (None)", "none"),
        ("GPU recovery action changed from 0x0 (None) to 0x1 (PF FLR)", "gpu_reset"),
        ("GPU recovery action changed from 0x0 (None) to 0x2 (OS Reboot)", "node_reboot"),
        ("GPU recovery action changed from 0x0 (None) to 0x5 (Recover IMEX Domain)", None),
        ("GPU recovery action changed from 0x0 (None) to 0x9 (Some Future Reset)", "gpu_reset"),
    ],
)
def test_it_reads_the_recovery_action_an_xid_154_reports(tail, current) -> None:
    change = xid_decode.recovery_change(", " + tail)
    assert change is not None and change.current == current
    assert current is None or current in xid.RECOVERY_ACTIONS


@pytest.mark.parametrize(
    "tail",
    [
        ", GPU recovery action changed",
        ", GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required), and more",
        ", pid=1, name=x, something else",
        "",
    ],
)
def test_it_reads_no_recovery_action_from_other_text(tail) -> None:
    assert xid_decode.recovery_change(tail) is None
