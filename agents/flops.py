"""Model FLOPs per token and the GPUs' peak dense FLOPs: what MFU and HFU are made of.

Owns the one formula the framework integrations use for a transformer's training FLOPs
and the one table of peak BF16 dense tensor-core FLOP/s keyed by the name NVML reports
(`nvmlDeviceGetName`), each entry with the NVIDIA datasheet it comes from. The service
reads the same table (console.diagnosis.utilisation), so a rank's MFU means the same thing
on the page, in the REST API and in /metrics. Standard library only.

MFU (model FLOPs utilisation) = the model's FLOPs per second / the peak; HFU (hardware
FLOPs utilisation) counts what the hardware actually ran, rematerialisation included
(Chowdhery et al. 2022, "PaLM", arXiv:2204.02311, §4.1 and Appendix B).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Peak:
    flops: float  # BF16 dense tensor-core FLOP/s (without 2:4 sparsity)
    source: str


# Where a datasheet gives only the "with sparsity" figure (2:4 structured sparsity doubles
# it), dense is half of it.
_A100 = "NVIDIA A100 Tensor Core GPU datasheet: BF16 Tensor Core 312 TFLOPS dense"
_H100 = "NVIDIA H100 Tensor Core GPU datasheet: BF16 Tensor Core, with sparsity"
_H100_SXM = f"{_H100}: H100 SXM 1,979 TFLOPS"
_H100_PCIE = f"{_H100}: H100 PCIe 1,513 TFLOPS"
_H100_NVL = f"{_H100}: H100 NVL 1,671 TFLOPS"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet: BF16 Tensor Core, with sparsity"
_H200_SXM = f"{_H200}: H200 SXM 1,979 TFLOPS"
_H200_NVL = f"{_H200}: H200 NVL 1,671 TFLOPS"
_GH200 = "NVIDIA GH200 Grace Hopper Superchip datasheet: FP16/BF16 Tensor Core 1,979 TFLOPS, sparse"
_B200 = "NVIDIA HGX B200 datasheet: FP16/BF16 Tensor Core 36 PFLOPS for 8 GPUs, sparse"
_L40S = "NVIDIA L40S datasheet: BF16 Tensor Core 362.05 TFLOPS dense (733 with sparsity)"
_L4 = "NVIDIA L4 Tensor Core GPU datasheet: BF16 Tensor Core 242 TFLOPS with sparsity"
_A10 = "NVIDIA A10 Tensor Core GPU datasheet: BF16 Tensor Core 125 TFLOPS dense"
_FAKE = "agents/fake_nvml.py: the fake GPU of demos and tests, given the H100 SXM figure"
T = 1e12

# Keyed by the name NVML reports.
PEAKS: dict[str, Peak] = {
    "NVIDIA A100-SXM4-40GB": Peak(312 * T, _A100),
    "NVIDIA A100-SXM4-80GB": Peak(312 * T, _A100),
    "NVIDIA A100-PCIE-40GB": Peak(312 * T, _A100),
    "NVIDIA A100 80GB PCIe": Peak(312 * T, _A100),
    "NVIDIA H100 80GB HBM3": Peak(989.5 * T, _H100_SXM),
    "NVIDIA H100 PCIe": Peak(756.5 * T, _H100_PCIE),
    "NVIDIA H100 NVL": Peak(835.5 * T, _H100_NVL),
    "NVIDIA H200": Peak(989.5 * T, _H200_SXM),
    "NVIDIA H200 NVL": Peak(835.5 * T, _H200_NVL),
    "NVIDIA GH200 480GB": Peak(989.5 * T, _GH200),
    "NVIDIA B200": Peak(2250 * T, _B200),
    "NVIDIA L40S": Peak(362.05 * T, _L40S),
    "NVIDIA L4": Peak(121 * T, _L4),
    "NVIDIA A10": Peak(125 * T, _A10),
    "Faultline Fake H100 80GB HBM3": Peak(989.5 * T, _FAKE),
}
_SPACE = re.compile(r"\s+")
_BY_KEY = {_SPACE.sub(" ", k).strip().casefold(): v for k, v in PEAKS.items()}


def peak(device_name: str | None) -> Peak | None:
    """The device's peak, matched on the whole NVML name (case and runs of spaces aside).

    No partial matching: "NVIDIA H100 PCIe" and "NVIDIA H100 80GB HBM3" differ by 30 %,
    and a guessed peak makes an MFU that looks right and is not. Unknown: None."""
    if not device_name:
        return None
    return _BY_KEY.get(_SPACE.sub(" ", device_name).strip().casefold())


def model_flops_per_token(
    params: int, *, layers: int | None = None, hidden: int | None = None, seq_len: int | None = None
) -> float:
    """Training FLOPs per token of a dense transformer: 6·N + 12·L·d·T.

    6·N: a multiply-add (2 FLOPs) per parameter per token forward, twice that backward;
    12·L·d·T: the attention scores and their weighted sum (PaLM, Appendix B, "6N + 12LHQT",
    with H·Q = d). `params` (N) counts the weights that do a matmul per token: the
    embedding lookups are left out, the output projection counted (Narayanan et al. 2021,
    "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", §5.1,
    its V/(12hL) term). Without layers, width or sequence length: 6·N alone."""
    flops = 6.0 * params
    if layers and hidden and seq_len:
        flops += 12.0 * layers * hidden * seq_len
    return flops


def hardware_flops(model_flops: float, *, recompute: bool) -> float:
    """The FLOPs the hardware runs for `model_flops` of the model's (per token or per
    step). With full activation recomputation every forward runs twice: 8·N + 16·L·d·T, 4/3
    of the model's FLOPs (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
    Transformer Models", §5; PaLM Appendix B). Without it, the hardware runs the model's."""
    return model_flops * 4.0 / 3.0 if recompute else model_flops
