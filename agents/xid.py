"""The Xid catalog: what an NVIDIA Xid means, whose fault it is, and what to do about it.

Owns the one catalog the agent and the service both read (NVIDIA's "Xid Catalog" for
Ampere and newer GPUs, docs.nvidia.com/deploy/xid-errors), Faultline's class for every
code, operator overrides, the driver's recovery-action vocabulary and the key that makes
one Xid seen twice (kernel log and NVML) one event. Standard library only; it must not
decide findings (console/diagnosis does) nor read files except in `load_overrides`.
"""

from __future__ import annotations

import json
import threading
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from agents import vocab

# -- classes: whose fault an Xid is, which decides what Faultline does with it ------------
# application: the program faulted (bad address, bad push buffer, killed channel); the GPU
#   is fine. Evidence on the process, never a hardware fault, never a reason to take the
#   node out.
# hardware: the GPU, its memory, links or board need an operator action (reset, reboot,
#   mechanics, firmware, support) before the GPU runs work again: the node comes out.
# consequence: follows another error or a kill (Xid 45 after a DBE or a SIGKILL): a
#   symptom of what it follows.
# informational: bookkeeping that needs no action now (a remapped row, an SBE rate).
# undetermined: NVIDIA lists no use on Ampere and newer, or no recovery beyond "contact
#   support", or the code is not in the catalog at all: a human must look.
APPLICATION = "application"
HARDWARE = "hardware"
CONSEQUENCE = "consequence"
INFORMATIONAL = "informational"
UNDETERMINED = "undetermined"
CLASSES: tuple[str, ...] = (APPLICATION, HARDWARE, CONSEQUENCE, INFORMATIONAL, UNDETERMINED)

GPUS: tuple[str, ...] = ("A100", "H100", "B100", "GB200")

# NVIDIA's resolution buckets for the immediate action, with the step an operator takes.
IMMEDIATE_ACTIONS: dict[str, str] = {
    "RESTART_APP": "restart the application; the GPU stays in service",
    "RESET_GPU": "drain the GPU and reset it (nvidia-smi -r); reboot the node if the reset "
    "fails, replace the GPU if it recurs",
    "RESTART_BM": "reboot the node",
    "RESTART_VM": "restart the VM that owns the GPU",
    "IGNORE": "no action needed",
    "CONTACT_SUPPORT": "contact NVIDIA or the hardware vendor",
    "CHECK_MECHANICALS": "check the GPU's seating and power connections",
    "UPDATE_SWFW": "update the GPU driver and firmware",
    "CHECK_UVM": "reset the GPU if UVM or vGPU is in use, otherwise no action",
    "WORKFLOW_XID_45": "follow the Xid it accompanies; alone, restart Fabric Manager",
    "WORKFLOW_XID_48": "reset the GPU (drain first when Xid 63/64 came with it); for an SRAM "
    "error check the SRAM threshold flag and run field diagnostics",
    "WORKFLOW_NVLINK_ERR": "reset the GPU or reboot the node to clear the link; decode the Xid "
    "registers and check the NVLink peer and cabling",
    "WORKFLOW_NVLINK5_ERR": "decode the Xid's intrInfo/errorStatus (NVIDIA's 144-150 table): "
    "reset the GPU when fatal, else follow the Xid 154 recovery action",
    "XID_154": "apply the recovery action the driver reports",
}

# The driver's GPU recovery action (NVML nvmlDeviceGetGpuRecoveryAction; Xid 154 reports
# each change). Wire names, as `device_event.recovery_action` carries them.
RECOVERY_NONE = "none"
RECOVERY_ACTIONS: dict[str, str] = {
    RECOVERY_NONE: "no recovery action pending",
    "gpu_reset": "the driver requires a GPU reset",
    "node_reboot": "the driver requires a node reboot",
    "drain_p2p": "drain peer-to-peer (NVLink) traffic, then read the recovery action again",
    "drain_and_reset": "the GPU runs at reduced capacity: drain its work, then reset it",
}
# NVML's nvmlDeviceGpuRecoveryAction_t values (NVML_GPU_RECOVERY_ACTION_*).
NVML_RECOVERY_ACTIONS: dict[int, str] = {
    0: RECOVERY_NONE,
    1: "gpu_reset",
    2: "node_reboot",
    3: "drain_p2p",
    4: "drain_and_reset",
}


@dataclass(frozen=True, slots=True)
class XidInfo:
    """One catalog row. `immediate`/`investigatory` are NVIDIA's resolution buckets."""

    code: int
    mnemonic: str
    meaning: str
    xid_class: str
    immediate: str
    investigatory: str
    gpus: tuple[str, ...]  # the GPUs NVIDIA lists it for (empty: unused on Ampere+)
    known: bool = True  # False: not in NVIDIA's catalog (an unknown code)
    overridden: bool = False  # an operator changed its class or action

    @property
    def action(self) -> str:
        """The operator step the immediate bucket stands for."""
        return IMMEDIATE_ACTIONS.get(self.immediate, self.immediate.lower().replace("_", " "))

    @property
    def takes_gpu_out(self) -> bool:
        """Hardware class: the GPU (and so its node) leaves service until the action is done."""
        return self.xid_class == HARDWARE


# fmt: off
# (code, mnemonic, NVIDIA's description, applies to A100/H100/B100/GB200, immediate
# bucket, investigatory bucket, class). A/H/C/I/U: application, hardware, consequence,
# informational, undetermined. "-" investigatory: NVIDIA publishes none.
_A, _H, _C, _I, _U = APPLICATION, HARDWARE, CONSEQUENCE, INFORMATIONAL, UNDETERMINED
_UNUSED = "Unused"
_ROWS: tuple[tuple[int, str, str, str, str, str, str], ...] = (
    (1, "ROBUST_CHANNEL_FIFO_ERROR_FIFO_METHOD", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (2, "ROBUST_CHANNEL_FIFO_ERROR_SW_METHOD", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (3, "ROBUST_CHANNEL_FIFO_ERROR_UNK_METHOD", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (4, "ROBUST_CHANNEL_FIFO_ERROR_CHANNEL_BUSY", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (5, "ROBUST_CHANNEL_FIFO_ERROR_RUNOUT_OVERFLOW", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (6, "ROBUST_CHANNEL_FIFO_ERROR_PARSE_ERR", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (7, "ROBUST_CHANNEL_FIFO_ERROR_PTE_ERR", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (8, "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "GPU stopped processing", "1111",
     "RESTART_APP", "CONTACT_SUPPORT", _A),
    (9, "ROBUST_CHANNEL_GR_ERROR_INSTANCE", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (10, "ROBUST_CHANNEL_GR_ERROR_SINGLE_STEP", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (11, "ROBUST_CHANNEL_GR_ERROR_MISSING_HW", "Invalid or corrupted push buffer stream",
     "1111", "RESTART_APP", "CHECK_APP/CUDA", _A),
    (12, "ROBUST_CHANNEL_GR_ERROR_SW_METHOD", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (13, "ROBUST_CHANNEL_GR_EXCEPTION", "Graphics Engine Exception", "1111", "RESTART_APP",
     "WORKFLOW_XID_13", _A),
    (14, "ROBUST_CHANNEL_FAKE_ERROR", "Fake or injected error from userspace", "1111",
     "IGNORE", "CONTACT_SUPPORT", _I),
    (15, "ROBUST_CHANNEL_SCANLINE_TIMEOUT", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (16, "ROBUST_CHANNEL_VBLANK_CALLBACK_TIMEOUT", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (17, "ROBUST_CHANNEL_PARAMETER_ERROR", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (18, "ROBUST_CHANNEL_BUS_MASTER_TIMEOUT_ERROR", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (19, "ROBUST_CHANNEL_DISP_MISSED_NOTIFIER", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (20, "ROBUST_CHANNEL_MPEG_ERROR_SW_METHOD", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (21, "ROBUST_CHANNEL_ME_ERROR_SW_METHOD", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (22, "ROBUST_CHANNEL_VP_ERROR_SW_METHOD", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (23, "ROBUST_CHANNEL_RC_LOGGING_ENABLED", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (24, "ROBUST_CHANNEL_GR_SEMAPHORE_TIMEOUT", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (25, "ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY", "Invalid or illegal push buffer stream", "1111",
     "RESTART_APP", "CHECK_APP/CUDA", _A),
    (26, "ROBUST_CHANNEL_FIFO_ERROR_FBISTATE_TIMEOUT", _UNUSED, "0000", "CONTACT_SUPPORT", "-",
     _U),
    (27, "ROBUST_CHANNEL_VP_ERROR", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (28, "ROBUST_CHANNEL_VP2_ERROR", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (29, "ROBUST_CHANNEL_BSP_ERROR", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (30, "ROBUST_CHANNEL_BAD_ADDR_ACCESS", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (31, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "GPU memory page fault", "1111",
     "RESTART_APP", "WORKFLOW_XID_31", _A),
    (32, "ROBUST_CHANNEL_PBDMA_ERROR", "Invalid or corrupted push buffer stream", "1111",
     "RESTART_APP", "CHECK_APP/CUDA", _A),
    (33, "ROBUST_CHANNEL_SEC_ERROR", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (34, "ROBUST_CHANNEL_MSVLD_ERROR", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (35, "ROBUST_CHANNEL_MSPDEC_ERROR", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (36, "ROBUST_CHANNEL_MSPPP_ERROR", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (37, "ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD", "Driver firmware error", "1111",
     "IGNORE", "CHECK_APP/CUDA", _I),
    (38, "ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT", "Driver firmware error", "1111",
     "IGNORE", "CONTACT_SUPPORT", _I),
    (39, "ROBUST_CHANNEL_CE0_ERROR", "Copy Engine Exception", "1111", "RESTART_APP",
     "CONTACT_SUPPORT", _A),
    (40, "ROBUST_CHANNEL_CE1_ERROR", "Copy Engine Exception", "1111", "RESTART_APP",
     "CONTACT_SUPPORT", _A),
    (41, "ROBUST_CHANNEL_CE2_ERROR", "Copy Engine Exception", "1111", "RESTART_APP",
     "CONTACT_SUPPORT", _A),
    (42, "ROBUST_CHANNEL_VIC_ERROR", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    # NVIDIA: "a user application hits a software induced fault and must terminate. The
    # GPU remains in a healthy state": the application's, whatever the bucket says.
    (43, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "GPU stopped processing", "1111",
     "IGNORE", "CONTACT_SUPPORT", _A),
    (44, "ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW", "Graphics Engine fault during context switch",
     "1111", "IGNORE", "CONTACT_SUPPORT", _I),
    (45, "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "Preemptive cleanup, due to previous errors",
     "1111", "WORKFLOW_XID_45", "RESTART_FM if solo, else IGNORE (follow the other Xid)", _C),
    (46, "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "GPU stopped processing", "1111", "RESET_GPU",
     "CONTACT_SUPPORT", _H),
    (47, "ROBUST_CHANNEL_NVENC0_ERROR", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (48, "ROBUST_CHANNEL_GPU_ECC_DBE", "Double Bit ECC Error", "1111", "WORKFLOW_XID_48",
     "WORKFLOW_XID_48", _H),
    (49, "SILENT_RUNNING_CONSTANT_LEVEL_SET_BY_REGISTRY", _UNUSED, "0000", "CONTACT_SUPPORT",
     "-", _U),
    (50, "SILENT_RUNNING_LEVEL_TRANSITION_DUE_TO_RC_ERROR", _UNUSED, "0000", "CONTACT_SUPPORT",
     "-", _U),
    (51, "SILENT_RUNNING_STRESS_TEST_FAILURE", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (52, "SILENT_RUNNING_LEVEL_TRANS_DUE_TO_TEMP_RISE", _UNUSED, "0000", "CONTACT_SUPPORT", "-",
     _U),
    (53, "SILENT_RUNNING_TEMP_REDUCED_CLOCKING", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (54, "SILENT_RUNNING_PWR_REDUCED_CLOCKING",
     "Auxiliary power is not connected to the GPU board", "1110", "CHECK_MECHANICALS",
     "CONTACT_SUPPORT", _H),
    (55, "SILENT_RUNNING_TEMPERATURE_READ_ERROR", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (56, "DISPLAY_CHANNEL_EXCEPTION", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (57, "FB_LINK_TRAINING_FAILURE_ERROR", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (58, "FB_MEMORY_ERROR", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (59, "PMU_ERROR", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (60, "ROBUST_CHANNEL_SEC2_ERROR", "Video processor exception", "1111", "RESTART_APP",
     "INVESTIGATE_SW", _A),
    (61, "PMU_BREAKPOINT", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (62, "PMU_HALT_ERROR", "Internal micro-controller halt", "1111", "RESET_GPU",
     "CONTACT_SUPPORT", _H),
    (63, "INFOROM_DRAM_RETIREMENT_EVENT", "GPU memory remapping event", "1111", "IGNORE",
     "IGNORE", _I),
    (64, "INFOROM_DRAM_RETIREMENT_FAILURE", "GPU memory remapping failure", "1111",
     "RESET_GPU", "CONTACT_SUPPORT", _H),
    (65, "ROBUST_CHANNEL_NVENC1_ERROR", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (66, "ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION", "Illegal access by driver", "1111",
     "IGNORE", "INVESTIGATE_SW", _I),
    (67, "ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION", "Illegal access by driver", "1111",
     "IGNORE", "CONTACT_SUPPORT", _I),
    (68, "ROBUST_CHANNEL_NVDEC0_ERROR", "NVDEC0 Exception", "1111", "RESTART_APP",
     "CONTACT_SUPPORT", _A),
    (69, "ROBUST_CHANNEL_GR_CLASS_ERROR", "Graphics Engine class error", "1111", "RESTART_APP",
     "CHECK_APP/CUDA", _A),
    (70, "ROBUST_CHANNEL_CE3_ERROR", "CE3: Unknown Error", "1111", "RESTART_APP",
     "CONTACT_SUPPORT", _A),
    (71, "ROBUST_CHANNEL_CE4_ERROR", "CE4: Unknown Error", "1111", "RESTART_APP",
     "CONTACT_SUPPORT", _A),
    (72, "ROBUST_CHANNEL_CE5_ERROR", "CE5: Unknown Error", "1111", "RESTART_APP",
     "CONTACT_SUPPORT", _A),
    (73, "ROBUST_CHANNEL_NVENC2_ERROR", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (74, "NVLINK_ERROR", "NVLINK Error", "1100", "WORKFLOW_NVLINK_ERR", "CONTACT_SUPPORT", _H),
    (75, "ROBUST_CHANNEL_CE6_ERROR", "CE6: Unknown Error", "1111", "RESTART_APP",
     "CONTACT_SUPPORT", _A),
    (76, "ROBUST_CHANNEL_CE7_ERROR", "CE7: Unknown Error", "1111", "RESTART_APP",
     "CONTACT_SUPPORT", _A),
    (77, "ROBUST_CHANNEL_CE8_ERROR", "CE8: Unknown Error", "1111", "RESTART_APP",
     "CONTACT_SUPPORT", _A),
    (78, "VGPU_START_ERROR", "vGPU Start Error", "1111", "UPDATE_SWFW", "UPDATE_SWFW", _H),
    (79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "GPU has fallen off the bus", "1111",
     "RESTART_BM", "CONTACT_SUPPORT", _H),
    (80, "PBDMA_PUSHBUFFER_CRC_MISMATCH", "Corrupted data sent to GPU", "1100", "RESTART_APP",
     "CHECK_APP/CUDA", _A),
    (81, "ROBUST_CHANNEL_VGA_SUBSYSTEM_ERROR", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (82, "ROBUST_CHANNEL_NVJPG0_ERROR", "NVJPG0 Error", "1111", "RESTART_APP",
     "CONTACT_SUPPORT", _A),
    (83, "ROBUST_CHANNEL_NVDEC1_ERROR", "NVDEC1 Error", "1111", "RESTART_APP",
     "CONTACT_SUPPORT", _A),
    (84, "ROBUST_CHANNEL_NVDEC2_ERROR", "NVDEC2 Error", "1111", "RESTART_APP",
     "CONTACT_SUPPORT", _A),
    (85, "ROBUST_CHANNEL_CE9_ERROR", "CE9: Unknown Error", "1111", "RESTART_APP",
     "CONTACT_SUPPORT", _A),
    (86, "ROBUST_CHANNEL_OFA0_ERROR", "OFA Exception", "1111", "RESTART_APP",
     "CONTACT_SUPPORT", _A),
    (87, "NVTELEMETRY_DRIVER_REPORT", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (88, "ROBUST_CHANNEL_NVDEC3_ERROR", "NVDEC3 Error", "1111", "RESTART_APP",
     "CONTACT_SUPPORT", _A),
    (89, "ROBUST_CHANNEL_NVDEC4_ERROR", "NVDEC4 Error", "1111", "RESTART_APP",
     "CONTACT_SUPPORT", _A),
    (90, "LTC_ERROR", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (91, "RESERVED_XID", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (92, "EXCESSIVE_SBE_INTERRUPTS", "High single-bit ECC error rate", "1111", "IGNORE",
     "CONTACT_SUPPORT", _I),
    (93, "INFOROM_ERASE_LIMIT_EXCEEDED", "Non-fatal violation of provisioned InfoROM wear limit",
     "1000", "IGNORE", "CONTACT_SUPPORT", _I),
    # Contained to one application, which must restart; the others run on. NVIDIA advises
    # a GPU reset "when convenient", not now.
    (94, "ROBUST_CHANNEL_CONTAINED_ERROR", "Contained memory error", "1111", "RESTART_APP",
     "IGNORE (sympathetic)", _A),
    (95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "Uncontained memory error", "1111", "RESET_GPU",
     "IGNORE (sympathetic)", _H),
    (96, "ROBUST_CHANNEL_NVDEC5_ERROR", "NVDEC5 Error", "0111", "RESTART_APP",
     "CONTACT_SUPPORT", _A),
    (97, "ROBUST_CHANNEL_NVDEC6_ERROR", "NVDEC6 Error", "0111", "RESTART_APP",
     "CONTACT_SUPPORT", _A),
    (98, "ROBUST_CHANNEL_NVDEC7_ERROR", "NVDEC7 Error", "0111", "RESTART_APP",
     "CONTACT_SUPPORT", _A),
    (99, "ROBUST_CHANNEL_NVJPG1_ERROR", "NVJPG1 Error", "0111", "RESTART_APP",
     "CONTACT_SUPPORT", _A),
    (100, "ROBUST_CHANNEL_NVJPG2_ERROR", "NVJPG2 Error", "0111", "RESTART_APP",
     "CONTACT_SUPPORT", _A),
    (101, "ROBUST_CHANNEL_NVJPG3_ERROR", "NVJPG3 Error", "0111", "RESTART_APP",
     "CONTACT_SUPPORT", _A),
    (102, "ROBUST_CHANNEL_NVJPG4_ERROR", "NVJPG4 Error", "0111", "RESTART_APP",
     "CONTACT_SUPPORT", _A),
    (103, "ROBUST_CHANNEL_NVJPG5_ERROR", "NVJPG5 Error", "0111", "RESTART_APP",
     "CONTACT_SUPPORT", _A),
    (104, "ROBUST_CHANNEL_NVJPG6_ERROR", "NVJPG6 Error", "0111", "RESTART_APP",
     "CONTACT_SUPPORT", _A),
    (105, "ROBUST_CHANNEL_NVJPG7_ERROR", "NVJPG7 Error", "0111", "RESTART_APP",
     "CONTACT_SUPPORT", _A),
    (106, "SMBPBI_TEST_MESSAGE", "SMBPBI Test Message", "1111", "IGNORE", "IGNORE", _I),
    (107, "SMBPBI_TEST_MESSAGE_SILENT", "SMBPBI Test Message Silent", "1111", "IGNORE",
     "IGNORE", _I),
    # Investigated with the Xid 137 flow (an illegal peer access by the program).
    (108, "NVLINK_REMOTE_TRANSLATION_ERROR", "NVLink remote translation error", "1111",
     "IGNORE", "XID_137_FLOW", _A),
    (109, "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "Context Switch Timeout Error", "1111",
     "RESET_GPU", "CONTACT_SUPPORT", _H),
    (110, "SEC_FAULT_ERROR", "Security Fault Error", "0111", "RESET_GPU", "INVESTIGATE_SW", _H),
    (111, "BUNDLE_ERROR_EVENT", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (112, "DISP_SUPERVISOR_ERROR", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (113, "DP_LT_FAILURE", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (114, "HEAD_RG_UNDERFLOW", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (115, "CORE_CHANNEL_REGS", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (116, "WINDOW_CHANNEL_REGS", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (117, "CURSOR_CHANNEL_REGS", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (118, "HEAD_REGS", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (119, "GSP_RPC_TIMEOUT", "GSP RPC Timeout", "1111", "RESET_GPU", "INVESTIGATE_SW", _H),
    (120, "GSP_ERROR", "GSP Error", "1111", "RESET_GPU", "INVESTIGATE_SW", _H),
    (121, "C2C_ERROR", "C2C Error (corrected errors on the Grace C2C link)", "0001", "IGNORE",
     "CONTACT_SUPPORT", _I),
    (122, "SPI_PMU_RPC_READ_FAIL", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (123, "SPI_PMU_RPC_WRITE_FAIL", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (124, "SPI_PMU_RPC_ERASE_FAIL", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (125, "INFOROM_FS_ERROR", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (126, "ROBUST_CHANNEL_CE10_ERROR", "CE10: Unknown Error", "0011", "RESTART_APP",
     "CONTACT_SUPPORT", _A),
    (127, "ROBUST_CHANNEL_CE11_ERROR", "CE11: Unknown Error", "0011", "RESTART_APP",
     "CONTACT_SUPPORT", _A),
    (128, "ROBUST_CHANNEL_CE12_ERROR", "CE12: Unknown Error", "0011", "RESTART_APP",
     "CONTACT_SUPPORT", _A),
    (129, "ROBUST_CHANNEL_CE13_ERROR", "CE13: Unknown Error", "0011", "RESTART_APP",
     "CONTACT_SUPPORT", _A),
    (130, "ROBUST_CHANNEL_CE14_ERROR", "CE14: Unknown Error", "0011", "RESTART_APP",
     "CONTACT_SUPPORT", _A),
    (131, "ROBUST_CHANNEL_CE15_ERROR", "CE15: Unknown Error", "0011", "RESTART_APP",
     "CONTACT_SUPPORT", _A),
    (132, "ROBUST_CHANNEL_CE16_ERROR", "CE16: Unknown Error", "0011", "RESTART_APP",
     "CONTACT_SUPPORT", _A),
    (133, "ROBUST_CHANNEL_CE17_ERROR", "CE17: Unknown Error", "0011", "RESTART_APP",
     "CONTACT_SUPPORT", _A),
    (134, "ROBUST_CHANNEL_CE18_ERROR", "CE18: Unknown Error", "0011", "RESTART_APP",
     "CONTACT_SUPPORT", _A),
    (135, "ROBUST_CHANNEL_CE19_ERROR", "CE19: Unknown Error", "0011", "RESTART_APP",
     "CONTACT_SUPPORT", _A),
    (136, "ALI_TRAINING_FAIL", "Link Training Failed", "0100", "RESET_GPU",
     "INVESTIGATE_LINK_SI", _H),
    # NVLink in the name, but an illegal peer-to-peer access by the program.
    (137, "NVLINK_PRIV_ERR", "NVLink Privilege Error", "1111", "IGNORE", "XID_137_FLOW", _A),
    (138, "ROBUST_CHANNEL_DLA_ERROR", _UNUSED, "0000", "CONTACT_SUPPORT", "-", _U),
    (139, "ROBUST_CHANNEL_OFA1_ERROR", "OFA1 Error", "0011", "RESTART_APP", "CONTACT_SUPPORT",
     _A),
    (140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "ECC Unrecovered Error", "1111", "RESET_GPU",
     "CONTACT_SUPPORT", _H),
    (141, "ROBUST_CHANNEL_FAST_PATH_ERROR", "CUDA Fast Path Error", "0111", "IGNORE",
     "CONTACT_SUPPORT", _I),
    (142, "ROBUST_CHANNEL_NVENC3_ERROR", "NVENC3 Error", "0001", "CONTACT_SUPPORT", "-", _U),
    (143, "GPU_INIT_ERROR", "GPU Initialization Error", "0111", "RESET_GPU", "CONTACT_SUPPORT",
     _H),
    # NVLink5: NVIDIA decodes each line's own fields (unit, error status, intrinfo); most
    # decodes are non-fatal. Undetermined until a decode (`nvlink5_decode`) or the driver's
    # recovery action says which (`effective_class`).
    (144, "NVLINK_SAW_ERROR", "NVLINK: SAW Error", "0011", "WORKFLOW_NVLINK5_ERR",
     "WORKFLOW_NVLINK5_ERR", _U),
    (145, "NVLINK_RLW_ERROR", "NVLINK: RLW Error", "0011", "WORKFLOW_NVLINK5_ERR",
     "WORKFLOW_NVLINK5_ERR", _U),
    (146, "NVLINK_TLW_ERROR", "NVLINK: TLW Error", "0011", "WORKFLOW_NVLINK5_ERR",
     "WORKFLOW_NVLINK5_ERR", _U),
    (147, "NVLINK_TREX_ERROR", "NVLINK: TREX Error", "0011", "WORKFLOW_NVLINK5_ERR",
     "WORKFLOW_NVLINK5_ERR", _U),
    (148, "NVLINK_NVLPW_CTRL_ERROR", "NVLINK: NVLPW_CTRL Error", "0011", "WORKFLOW_NVLINK5_ERR",
     "WORKFLOW_NVLINK5_ERR", _U),
    (149, "NVLINK_NETIR_ERROR", "NVLINK: NETIR Error", "0011", "WORKFLOW_NVLINK5_ERR",
     "WORKFLOW_NVLINK5_ERR", _U),
    (150, "NVLINK_MSE_ERROR", "NVLINK: MSE Error", "0011", "WORKFLOW_NVLINK5_ERR",
     "WORKFLOW_NVLINK5_ERR", _U),
    (151, "ROBUST_CHANNEL_KEY_ROTATION_ERROR", "Key rotation Error", "0111", "RESTART_VM",
     "CONTACT_SUPPORT", _H),
    (152, "ROBUST_CHANNEL_DLA_SMMU_ERROR", "DLA SMMU Error", "0000", "IGNORE",
     "CONTACT_SUPPORT", _I),
    (153, "ROBUST_CHANNEL_DLA_TIMEOUT", "DLA timeout Error", "0000", "IGNORE",
     "CONTACT_SUPPORT", _I),
    # Summarises the recovery action another Xid needs; the action it carries (NVML's
    # recovery action) decides, not this row.
    (154, "GPU_RECOVERY_ACTION_CHANGED", "GPU Recovery Action Changed", "1111", "XID_154",
     "N/A: informational, about another Xid", _I),
    (155, "NVLINK_SW_DEFINED_ERROR", "NVLINK: SW Defined Error (intentional link down)",
     "0011", "RESET_GPU", "INVESTIGATE_SW_USER", _H),
    (156, "RESOURCE_RETIREMENT_EVENT", "Resource Retirement Event", "0111", "RESET_GPU",
     "IGNORE", _H),
    (157, "RESOURCE_RETIREMENT_FAILURE", "Resource Retirement Failure (no repair resources "
     "left)", "0111", "IGNORE", "CONTACT_SUPPORT", _I),
    (158, "GPU_FATAL_TIMEOUT", "GPU Fatal Timeout", "1111", "RESET_GPU", "CONTACT_SUPPORT", _H),
    (159, "ROBUST_CHANNEL_CHI_NON_DATA_ERROR", "CHI Non-Data Error", "0011", "CHECK_UVM",
     "SYMPATHETIC_REPORT_SOLO", _C),
    (160, "CHANNEL_RETIREMENT_EVENT", "Channel Retirement Event", "0011", "IGNORE",
     "INVESTIGATE_SW", _I),
    (161, "CHANNEL_RETIREMENT_FAILURE", "Channel Retirement Failure", "0011", "IGNORE",
     "INVESTIGATE_SW", _I),
    # 162-172: NVIDIA lists no resolution bucket; these follow its trigger notes.
    (162, "PSHC_REENGAGED", "Power smoothing circuitry re-engaged", "0011", "IGNORE", "-", _I),
    (163, "PSHC_DISENGAGED", "Power smoothing circuitry disengaged (no reset needed)", "0011",
     "IGNORE", "-", _I),
    (164, "PSHC_LOW_LIFETIME", "Power smoothing circuitry low lifetime reached", "0011",
     "IGNORE", "-", _I),
    (165, "PSHC_ZERO_LIFETIME", "Power smoothing circuitry lifetime exhausted", "0011",
     "IGNORE", "-", _I),
    (166, "NVLINK_SECURE_CRYPTO_ERR", "CC traffic before the link was set up for encryption",
     "0011", "CONTACT_SUPPORT", "-", _U),
    (167, "PCIE_FATAL_TIMEOUT", "PCIe fatal timeout", "0111", "CONTACT_SUPPORT", "-", _H),
    (168, "REDUCED_GPU_MEMORY_CAPACITY", "Errors found in the write-protected region (WPR)",
     "1111", "CONTACT_SUPPORT", "-", _H),
    (169, "SEC2_HALT_ERROR", "Internal micro-controller halt", "0111", "CONTACT_SUPPORT", "-",
     _H),
    (170, "NVLINK_SECURE_OTHER", "Interrupt seen in CC mode", "0011", "CONTACT_SUPPORT", "-",
     _U),
    (171, "UNCORRECTABLE_DRAM_ERROR", "Detail of an Xid 48: the error was in DRAM", "1111",
     "IGNORE", "WORKFLOW_XID_48", _C),
    (172, "UNCORRECTABLE_SRAM_ERROR", "Detail of an Xid 48: the error was in SRAM", "1111",
     "IGNORE", "WORKFLOW_XID_48", _C),
    # 173-176: defined by the driver (src/common/sdk/nvidia/inc/nverror.h: 173 since 580.105.08,
    # 174 since 590.44.01, 175 and 176 since 595.45.04) with no row yet in NVIDIA's catalog page:
    # classed from the driver's names and where it raises them; the Xid 154 recovery action the
    # driver reports with them overrides the class. Applies-to: the Blackwell parts those
    # branches ship for (C2C links exist only on Grace superchips).
    # A fatal Grace-GPU C2C link leaves the GPU unreachable from the CPU: handled like Xid 79.
    (173, "C2C_FATAL_LINK_FAILURE", "C2C fatal link failure", "0001", "RESTART_BM",
     "CONTACT_SUPPORT", _H),
    # The silent form of a channel reset that kills the faulting process (compare 43).
    (174, "ROBUST_CHANNEL_RESETCHANNEL_KILL_PROCESS_SILENT",
     "Channel reset killed the faulting process (silent)", "0011", "RESTART_APP", "-", _A),
    # Raised instead of 119 (GSP RPC timeout) when the timeout came from a memory subsystem
    # error (kernel_gsp.c _kgspClassifyGspTimeout): 119's reset, on the memory layer.
    (175, "MEMORY_SUBSYSTEM_ERROR", "Memory subsystem error (behind a GSP timeout)", "0011",
     "RESET_GPU", "CONTACT_SUPPORT", _H),
    (176, "PCIE_CORRECTABLE_ERROR_FAULT", "PCIe correctable error fault", "0011",
     "CONTACT_SUPPORT", "-", _U),
)
# fmt: on


def _row(row: tuple[int, str, str, str, str, str, str]) -> XidInfo:
    code, mnemonic, meaning, applies, immediate, investigatory, cls = row
    gpus = tuple(g for g, bit in zip(GPUS, applies, strict=True) if bit == "1")
    return XidInfo(code, mnemonic, meaning, cls, immediate, investigatory, gpus)


class OverrideError(ValueError):
    """An Xid override the catalog cannot use; the message names the code, key and fix."""


class XidCatalog:
    """Code -> XidInfo, with operator overrides applied. Immutable once built."""

    def __init__(self, entries: Mapping[int, XidInfo]) -> None:
        self._entries = dict(entries)
        self.hardware_codes: frozenset[int] = frozenset(
            c for c, i in self._entries.items() if i.takes_gpu_out
        )

    def __contains__(self, code: object) -> bool:
        return code in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def codes(self) -> list[int]:
        return sorted(self._entries)

    def get(self, code: int | None) -> XidInfo:
        """The row for `code`; an unknown code is undetermined and asks a human to look."""
        if code is not None and code in self._entries:
            return self._entries[code]
        return XidInfo(
            code=-1 if code is None else code,
            mnemonic="UNKNOWN",
            meaning=f"Xid {code} is not in NVIDIA's Xid catalog for Ampere and newer GPUs",
            xid_class=UNDETERMINED,
            immediate="CONTACT_SUPPORT",
            investigatory="-",
            gpus=(),
            known=False,
        )

    def with_overrides(self, overrides: Mapping[Any, Any], *, source: str = "") -> XidCatalog:
        """A new catalog with `{code: {"class": ..., "action": ..., "investigatory": ...}}`
        applied. Unknown codes may be added (a newer driver's Xid). Raises OverrideError."""
        where = f"{source}: " if source else ""
        if not isinstance(overrides, Mapping):
            raise OverrideError(f"{where}Xid overrides must be a table of code = {{...}}")
        entries = dict(self._entries)
        for raw_code, spec in overrides.items():
            try:
                code = int(str(raw_code).strip())
            except ValueError:
                raise OverrideError(
                    f"{where}Xid override key {raw_code!r} must be an Xid number, e.g. 13"
                ) from None
            if not 0 < code < 100_000:
                raise OverrideError(f"{where}Xid override {code} is not a valid Xid number")
            if not isinstance(spec, Mapping):
                raise OverrideError(
                    f'{where}Xid override {code} must be a table like {{class = "hardware"}}'
                )
            unknown = sorted(set(spec) - {"class", "action", "investigatory"})
            if unknown:
                raise OverrideError(
                    f"{where}Xid override {code}: unknown key {unknown[0]!r} "
                    "(known: class, action, investigatory)"
                )
            base = self.get(code)
            cls = str(spec.get("class", base.xid_class))
            if cls not in CLASSES:
                raise OverrideError(
                    f"{where}Xid override {code}: class {cls!r} must be one of {', '.join(CLASSES)}"
                )
            action = str(spec.get("action", base.immediate)).upper()
            if action not in IMMEDIATE_ACTIONS:
                raise OverrideError(
                    f"{where}Xid override {code}: action {action!r} must be one of "
                    f"{', '.join(IMMEDIATE_ACTIONS)}"
                )
            investigatory = str(spec.get("investigatory", base.investigatory))[:64]
            meaning = base.meaning if base.known else f"Xid {code} (classified by the operator)"
            entries[code] = replace(
                base,
                meaning=meaning,
                xid_class=cls,
                immediate=action,
                investigatory=investigatory,
                known=True,
                overridden=True,
            )
        return XidCatalog(entries)


CATALOG = XidCatalog({row[0]: _row(row) for row in _ROWS})

# The catalog this process uses: the stock one until the agent's config or the service's
# settings install overrides at startup (one writer, before any reader; reads are atomic).
_active: XidCatalog = CATALOG
_lock = threading.Lock()


def active() -> XidCatalog:
    """The catalog in use in this process (stock, or with the operator's overrides)."""
    return _active


def install(catalog: XidCatalog) -> XidCatalog:
    """Make `catalog` the one this process uses; returns the one it replaces."""
    global _active
    with _lock:
        previous, _active = _active, catalog
    return previous


def load_overrides(path: str | Path) -> XidCatalog:
    """The stock catalog with the overrides in a TOML or JSON file applied.

    The file is a table of code -> {class, action, investigatory}; in TOML,
    `[overrides]` may wrap it (`13 = { class = "hardware", action = "RESET_GPU" }`).
    """
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise OverrideError(f"Xid overrides file {p}: {exc.strerror}") from None
    try:
        data: Any = json.loads(text) if p.suffix == ".json" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise OverrideError(f"Xid overrides file {p}: {exc}") from None
    if isinstance(data, Mapping) and set(data) == {"overrides"}:
        data = data["overrides"]
    return CATALOG.with_overrides(data, source=str(p))


def classify(code: int | None) -> XidInfo:
    """The active catalog's row for `code` (unknown codes are undetermined)."""
    return _active.get(code)


# -- layer: which part of the machine an Xid is evidence against (the reliability record) --
# The layer names are console.diagnosis.layers.LAYERS' (a test keeps them in step). Memory
# errors (ECC, remapping, contained/uncontained) are HBM; link errors are NVLink; an
# application-class Xid is the software's; everything else is the GPU's.
XID_HBM_CODES = frozenset({48, 58, 63, 64, 92, 94, 95, 140, 168, 171, 172, 175})


def xid_layer(code: int | None) -> str:
    """`hbm`, `nvlink`, `software` or `gpu`: the layer an Xid blames."""
    info = classify(code)
    if info.code in XID_HBM_CODES:
        return "hbm"
    if "NVLINK" in info.mnemonic:
        return "nvlink"
    if info.xid_class == APPLICATION:
        return "software"
    return "gpu"


def detail(code: int) -> str:
    """A short, bounded `device_event.detail` for an Xid."""
    info = classify(code)
    return f"{info.mnemonic}: {info.meaning}; {info.xid_class}; {info.immediate}"[:256]


def recovery_action_name(value: int | None) -> str | None:
    """NVML's recovery action number as its wire name; None when unknown or unread."""
    return None if value is None else NVML_RECOVERY_ACTIONS.get(int(value))


def recovery_requires_action(name: str | None) -> bool:
    """The driver asks for a reset, reboot or drain: the GPU must leave service."""
    return name is not None and name in RECOVERY_ACTIONS and name != RECOVERY_NONE


def effective_class(info: XidInfo, recovery_action: str | None = None) -> str:
    """The class an Xid acts with: a driver that asks for a reset, reboot or drain makes
    any Xid (154 included) a hardware fault, whatever its row says. An NVLink5 Xid (144-150)
    that needs nothing (its decode is non-fatal, or the driver's recovery action is none)
    is informational: NVIDIA's workflow resets only on a fatal decode, else follows 154."""
    if recovery_requires_action(recovery_action):
        return HARDWARE
    if (
        recovery_action == RECOVERY_NONE
        and info.immediate == "WORKFLOW_NVLINK5_ERR"
        and not info.overridden
    ):
        return INFORMATIONAL
    return info.xid_class


def is_hardware_fault(
    event: str,
    code: int | None = None,
    recovery_action: str | None = None,
    catalog: XidCatalog | None = None,
) -> bool:
    """Whether a `device_event` takes its GPU out of service (ingest marks it critical).

    A lost GPU, a double-bit ECC error or a failed row remap always does; an Xid only when
    its class (with overrides) is hardware or the driver reports a recovery action.
    """
    if event != vocab.XID:
        return event in vocab.HARDWARE_FAULT_KINDS
    info = (catalog or _active).get(code)
    return effective_class(info, recovery_action) == HARDWARE


# -- one Xid, two witnesses ------------------------------------------------------------
# The driver logs an Xid to the kernel ring buffer ("NVRM: Xid (PCI:...): 79, ...") and
# NVML delivers the same Xid as an event; the two arrive at slightly different times and
# the kernel line names the GPU by PCI bus id. Once the reader maps the bus id to the UUID,
# sightings of the same (gpu, code) within DEDUP_WINDOW_S of the event's first sighting
# are one event, keyed by the first sighting: `gpu/code/first-ms`.
DEDUP_WINDOW_S = 5.0


def event_key(gpu: str, code: int | str, first_seen: datetime) -> str:
    """The stable key of one Xid event (the gpu, the code, its first sighting); `code` is
    the event's name for a device event that is not an Xid (`gpu_lost`)."""
    return f"{gpu}/{code}/{int(first_seen.timestamp() * 1000)}"


class XidDeduper:
    """Folds sightings of one Xid from several sources into one event.

    `admit` answers (key, is_new): the first sighting of a (gpu, code) opens an event and
    is sent; a later sighting inside the window joins it (not sent again, its source is
    recorded). A sighting after the window opens a new event: a recurring Xid is news.
    """

    def __init__(self, window_s: float = DEDUP_WINDOW_S) -> None:
        self.window_s = window_s
        self._open: dict[tuple[str, int | str], tuple[datetime, str, set[str]]] = {}
        self._lock = threading.Lock()

    def admit(self, gpu: str, code: int | str, ts: datetime, source: str) -> tuple[str, bool]:
        with self._lock:
            current = self._open.get((gpu, code))
            if current is not None:
                first, key, sources = current
                if abs((ts - first).total_seconds()) <= self.window_s:
                    sources.add(source)
                    return key, False
            key = event_key(gpu, code, ts)
            self._open[(gpu, code)] = (ts, key, {source})
            return key, True

    def sources(self, gpu: str, code: int | str) -> set[str]:
        """The sources that have seen the open event of (gpu, code)."""
        with self._lock:
            current = self._open.get((gpu, code))
            return set(current[2]) if current else set()
