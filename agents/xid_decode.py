"""What an Xid line's own fields say: NVIDIA's decode of the NVLink5 Xids (144-150) and the
recovery action an Xid 154 line reports.

Owns NVIDIA's "XID 144-150 Decode" table (the second sheet of the Xid Catalog spreadsheet,
docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html) and the parsers of the two
tails the driver prints after an Xid's code. Every result is built from this vocabulary:
no text of the line is carried. Standard library only; it decides nothing about findings
(agents/xid.py `effective_class` and console/diagnosis do).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agents import xid

# -- Xid 154: "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)" ----
# Printed by the driver since 565.57.01 (src/nvidia/src/kernel/gpu/gpu.c, nvErrorLog_va of
# GPU_RECOVERY_ACTION_CHANGED). The numbers are NV2080_CTRL_GPU_RECOVERY_ACTION_* (the same
# values as NVML's nvmlDeviceGpuRecoveryAction_t); the names in brackets have changed between
# drivers ("GPU Reset Required" / "PF FLR", "Node Reboot Required" / "OS Reboot"), so the
# number decides and the name is read only for a number this vocabulary lacks.
_XID154 = re.compile(
    r"(?:^|, )GPU recovery action changed from 0x(?P<old>[0-9a-fA-F]{1,8}) \((?P<old_name>"
    r"[A-Za-z0-9 /_-]{0,40})\) to 0x(?P<new>[0-9a-fA-F]{1,8}) \((?P<new_name>[A-Za-z0-9 /_-]"
    r"{0,40})\)\.?\s*$"
)
_RECOVERY_WORDS: tuple[tuple[str, str], ...] = (
    ("drain and reset", "drain_and_reset"),
    ("drain p2p", "drain_p2p"),
    ("reboot", "node_reboot"),
    ("reset", "gpu_reset"),
    ("flr", "gpu_reset"),  # a PCIe function-level reset is a GPU reset
    ("none", xid.RECOVERY_NONE),
)


def _recovery(number: str, name: str) -> str | None:
    action = xid.NVML_RECOVERY_ACTIONS.get(int(number, 16))
    if action is not None:
        return action
    lowered = name.lower()
    return next((wire for word, wire in _RECOVERY_WORDS if word in lowered), None)


@dataclass(frozen=True, slots=True)
class RecoveryChange:
    """An Xid 154: the recovery action the GPU needs now (None: not one Faultline knows)."""

    previous: str | None
    current: str | None
    current_code: int

    @property
    def detail(self) -> str:
        def name(action: str | None, code: int | None = None) -> str:
            return action if action is not None else f"0x{code or 0:x} (not a known action)"

        return (
            f"GPU recovery action changed from {name(self.previous)} to "
            f"{name(self.current, self.current_code)}"
        )


def recovery_change(tail: str) -> RecoveryChange | None:
    """The change an Xid 154 line's text (after its code) reports, else None."""
    m = _XID154.search(tail)
    if m is None:
        return None
    return RecoveryChange(
        previous=_recovery(m["old"], m["old_name"]),
        current=_recovery(m["new"], m["new_name"]),
        current_code=int(m["new"], 16),
    )


# -- NVLink5, Xids 144-150 ----------------------------------------------------------------
# R575 and newer print `<UNIT> <Fatal|Nonfatal> XC<n> i<n> Link <nn> (<intrinfo> <errorStatus>
# <more words>)`, e.g. "NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 (0x025525c6 0x00000000 ...)";
# earlier drivers `<UNIT> <Fatal|Nonfatal> XC 1 i 2 Link 01 [0x0000000a]`. NVIDIA's decode
# keys on (Xid, unit, errorStatus), and for NETIR_LINK_EVT on intrinfo bits 20-25. Only a
# RESET_GPU resolution takes the GPU out; IGNORE leaves it in service, XID_154_EVAL too (the
# driver reports what the GPU needs in the Xid 154 that follows).
_NVLINK5 = re.compile(
    r"(?:^|, )(?P<unit>[A-Z][A-Z0-9_]{0,31}(?:/[A-Z][A-Z0-9_]{0,31})?)\s+"
    r"(?P<sev>Fatal|Nonfatal|Non-fatal)\s+XC\s?(?P<xc>\d{1,3})\s+i\s?(?P<inj>\d{1,3})\s+"
    r"Link\s+(?P<link>-?\d{1,3})\s+[(\[](?P<words>0x[0-9a-fA-F]{1,8}(?:\s+0x[0-9a-fA-F]{1,8})"
    r"{0,7})[)\]]\s*$"
)
FATAL, LINK_FATAL, NONFATAL = "fatal", "link fatal", "non-fatal"
RESET, IGNORE, EVAL_154 = "RESET_GPU", "IGNORE", "XID_154_EVAL"
SW_STATUS = 0x80000000  # NVIDIA's "SW" rows: a software-reported status, never fatal

Rule = tuple[str, str, str]  # severity, immediate resolution, investigatory resolution
_NF_IGNORE: Rule = (NONFATAL, IGNORE, "IGNORE")
_NF_SUPPORT: Rule = (NONFATAL, IGNORE, "CONTACT_SUPPORT")
_F_RESET: Rule = (FATAL, RESET, "CONTACT_SUPPORT")
_SW: dict[int, Rule] = {SW_STATUS: _NF_SUPPORT}
_TLW: dict[int, Rule] = {0x1: _NF_IGNORE, 0x2: _NF_SUPPORT, 0x4: _F_RESET, **_SW}

# (Xid, unit) -> errorStatus bit -> rule. Rows of NVIDIA's sheet, one per status bit.
_BITS: dict[tuple[int, str], dict[int, Rule]] = {
    (144, "SAW_MVB"): {
        0x1: _NF_SUPPORT,
        0x2: _F_RESET,
        0x4: _NF_IGNORE,
        0x8: _NF_SUPPORT,
        0x10: _F_RESET,
        0x20: _NF_IGNORE,
    },
    (145, "RLW_CTRL"): dict(_SW),
    (145, "RLW_REMAP"): {
        0x1: (NONFATAL, EVAL_154, "CONTACT_SUPPORT"),
        0x2: (NONFATAL, EVAL_154, "CONTACT_SUPPORT"),
        **{b: (NONFATAL, EVAL_154, "CHECK_NVLINK_FAILURE_FLOW") for b in (0x4, 0x8, 0x10, 0x20)},
        0x40: _F_RESET,
        0x80: _F_RESET,
        0x100: _NF_IGNORE,
        0x200: _NF_IGNORE,
        **_SW,
    },
    (145, "RLW_RSPCOL"): {0x1: _NF_IGNORE, 0x2: _F_RESET, **_SW},
    # 0x1-0x4: "Non-fatal*": a second action (RESET_GPU) only when the traffic loss persists.
    (145, "RLW_RXPIPE"): {
        0x1: _NF_SUPPORT,
        0x2: _NF_SUPPORT,
        0x4: _NF_SUPPORT,
        0x8: _NF_SUPPORT,
        **_SW,
    },
    (145, "RLW_SRC_TRACK"): {
        0x1: _F_RESET,
        0x2: _NF_IGNORE,
        0x4: (NONFATAL, EVAL_154, "IGNORE"),
        0x8: (NONFATAL, EVAL_154, "IGNORE"),
        0x10: _F_RESET,
        0x20: _F_RESET,
        **_SW,
    },
    (145, "RLW_TAGSTATE"): {
        0x1: _NF_IGNORE,
        0x2: _F_RESET,
        0x10000: _NF_IGNORE,
        0x20000: _F_RESET,
        0x100000: _F_RESET,
        **_SW,
    },
    (146, "TLW_CTRL"): dict(_TLW),
    (146, "TLW_RX"): dict(_TLW),  # TLW_RX_PIPE0 and _PIPE1 decode alike
    (146, "TLW_TX"): dict(_TLW),
    (147, "TREX"): {0x1: _NF_SUPPORT, **_SW},  # NVIDIA: not in production code
    (148, "NVLPW_CTRL"): dict(_SW),
}
# (Xid, unit) -> errorStatus value -> rule: units whose status is a value, not a bit mask.
_VALUES: dict[tuple[int, str], dict[int, Rule]] = {
    (149, "NETIR_INT"): {0x0: (LINK_FATAL, RESET, "SYMPATHETIC_REPORT_SOLO")},
    (149, "NETIR_BER_EVENT"): {
        v: (NONFATAL, IGNORE, "INVESTIGATE_LINK_SI_AND_CABLES") for v in (0x0, 0x1, 0x2, 0x3)
    },
    (149, "NETIR_MFDE_EVENT"): {
        0x1: _F_RESET,
        0x3: _NF_IGNORE,
        0x4: _F_RESET,
        0x5: _F_RESET,
        0x7: _F_RESET,
    },
    (150, "MSE_WATCHDOG"): {0x0: _F_RESET},
}
# Xid 149 NETIR_LINK_EVT (link down): intrinfo bits 20-25 say why.
_LINK_DOWN: dict[int, Rule] = {
    0b000000: (LINK_FATAL, RESET, "SYMPATHETIC_REPORT_SOLO"),
    0b000001: (LINK_FATAL, RESET, "REPORT_ISSUE_IF_SEEN_MORE_THAN_DAILY"),
    0b000010: (LINK_FATAL, RESET, "INVESTIGATE_LINK_SI"),
    0b000100: (LINK_FATAL, RESET, "INVESTIGATE_LINK_SI"),
    0b001010: (LINK_FATAL, RESET, "INVESTIGATE_LINK_SI"),
    0b001111: (LINK_FATAL, RESET, "INVESTIGATE_SW_USER"),
    0b010000: (LINK_FATAL, RESET, "INVESTIGATE_SW_USER_LINK_SI"),
    0b010001: (LINK_FATAL, RESET, "INVESTIGATE_SW_USER"),
    0b010010: (LINK_FATAL, RESET, "INVESTIGATE_SW_USER_LINK_SI"),
    0b010101: (LINK_FATAL, RESET, "INVESTIGATE_PEER_DEVICE"),
    0b010110: (LINK_FATAL, RESET, "INVESTIGATE_SW_USER"),
    **{code: (LINK_FATAL, RESET, "INVESTIGATE_PEER_DEVICE") for code in range(0b100000, 0b100110)},
    0b100110: (LINK_FATAL, IGNORE, "INVESTIGATE_SW_USER"),
    0b101000: (FATAL, IGNORE, "INVESTIGATE_HOST"),  # fatal on the host's side, not the GPU's
    0b101010: (LINK_FATAL, RESET, "INVESTIGATE_LINK_SI_AND_CABLES"),
    0b101011: (LINK_FATAL, RESET, "INVESTIGATE_LINK_SI_AND_CABLES"),
}
# The names the driver prints for a unit (NVIDIA's sheet lists them as "A/B") -> the table's.
_UNITS: dict[str, str] = {
    "SAW_MVB": "SAW_MVB",
    "RLW_CTRL": "RLW_CTRL",
    "RLW_REMAP": "RLW_REMAP",
    "RLW_RSPCOL": "RLW_RSPCOL",
    "RLW_RXPIPE": "RLW_RXPIPE",
    "RLW_SRC_TRACK": "RLW_SRC_TRACK",
    "RLW_TAGSTATE": "RLW_TAGSTATE",
    "TLW_CTRL": "TLW_CTRL",
    "TLW_RX": "TLW_RX",
    "TLW_RX_PIPE0": "TLW_RX",
    "TLW_RX_PIPE1": "TLW_RX",
    "TLW_TX": "TLW_TX",
    "TLW_TX_PIPE0": "TLW_TX",
    "TLW_TX_PIPE1": "TLW_TX",
    "TREX": "TREX",
    "NVLPW_CTRL": "NVLPW_CTRL",
    "NVLPW": "NVLPW_CTRL",
    "NETIR": "NETIR_INT",
    "NETIR_INT": "NETIR_INT",
    "NETIR_BER_EVENT": "NETIR_BER_EVENT",
    "NETIR_MFDE_EVENT": "NETIR_MFDE_EVENT",
    "NETIR_LINK_EVT": "NETIR_LINK_EVT",
    "NETIR_LINK_DOWN": "NETIR_LINK_EVT",
    "MSE_WATCHDOG": "MSE_WATCHDOG",
}
NVLINK5_CODES = frozenset(range(144, 151))


@dataclass(frozen=True, slots=True)
class Nvlink5Decode:
    """One NVLink5 Xid as NVIDIA's table reads it. `known` is False when the table has no
    row for the unit or status: then the driver's own word (Fatal / Nonfatal) decides."""

    code: int
    unit: str
    severity: str  # fatal | link fatal | non-fatal
    resolution: str  # RESET_GPU | IGNORE | XID_154_EVAL
    investigatory: str
    link: int
    intrinfo: int | None
    error_status: int | None
    known: bool

    @property
    def fatal(self) -> bool:
        """The decode takes the GPU out: NVIDIA's resolution is a GPU reset."""
        return self.resolution == RESET

    @property
    def recovery_action(self) -> str:
        """The decode as a recovery action (agents/xid.py vocabulary)."""
        return "gpu_reset" if self.fatal else xid.RECOVERY_NONE

    @property
    def detail(self) -> str:
        words = "" if self.error_status is None else f", status 0x{self.error_status:08x}"
        if self.intrinfo is not None:
            words += f", intrinfo 0x{self.intrinfo:08x}"
        source = "NVIDIA's decode" if self.known else "the driver's severity (no decode row)"
        return (
            f"NVLink5 {self.unit} {self.severity} on link {self.link}{words}: {self.resolution}"
            f" per {source}; investigate: {self.investigatory}"
        )[:256]


def _rule(code: int, unit: str, intrinfo: int | None, status: int | None) -> Rule | None:
    if intrinfo is None or status is None:
        return None
    if (code, unit) == (149, "NETIR_LINK_EVT"):
        return _LINK_DOWN.get((intrinfo >> 20) & 0x3F) if status == 0 else None
    values = _VALUES.get((code, unit))
    if values is not None:
        return values.get(status)
    bits = _BITS.get((code, unit))
    if bits is None or status == 0:
        return None
    rules = [bits.get(1 << b) for b in range(32) if status >> b & 1]
    if any(r is None for r in rules):
        return None  # a bit NVIDIA lists no row for: the driver's word decides
    # Several bits: the worst of them (a reset beats a 154 evaluation beats nothing).
    rank = {RESET: 0, EVAL_154: 1, IGNORE: 2}
    return min((r for r in rules if r is not None), key=lambda r: rank[r[1]])


def nvlink5_decode(code: int, tail: str) -> Nvlink5Decode | None:
    """NVIDIA's decode of an NVLink5 Xid line's text (after its code), else None."""
    if code not in NVLINK5_CODES:
        return None
    m = _NVLINK5.search(tail)
    if m is None:
        return None
    printed = m["unit"]
    unit = next((_UNITS[p] for p in printed.split("/") if p in _UNITS), printed[:40])
    words = [int(w, 16) for w in m["words"].split()]
    # The R575+ form prints intrinfo then errorStatus; the older form one word, not decoded.
    intrinfo, status = (words[0], words[1]) if len(words) >= 2 else (None, None)
    found = _rule(code, unit, intrinfo, status)
    rule = found or (
        (FATAL, RESET, "CONTACT_SUPPORT")
        if m["sev"] == "Fatal"
        else (NONFATAL, IGNORE, "CONTACT_SUPPORT")
    )
    return Nvlink5Decode(
        code=code,
        unit=unit,
        severity=rule[0],
        resolution=rule[1],
        investigatory=rule[2],
        link=int(m["link"]),
        intrinfo=intrinfo,
        error_status=status,
        known=found is not None,
    )
