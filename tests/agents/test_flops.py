"""agents.flops: the FLOPs formula the integrations use and the peak table MFU divides by."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents import flops
from agents.fake_nvml import FAKE_NAME


def test_it_counts_six_per_parameter_and_twelve_per_layer_width_and_token_of_context() -> None:
    # PaLM's 6N + 12LHQT for a 7B-class model (N = 6.5e9, 32 layers of 4096, 4096 tokens).
    got = flops.model_flops_per_token(6_500_000_000, layers=32, hidden=4096, seq_len=4096)
    assert got == 6 * 6.5e9 + 12 * 32 * 4096 * 4096


@pytest.mark.parametrize(
    "shape", [{}, {"layers": 2}, {"layers": 2, "hidden": 64}, {"hidden": 64, "seq_len": 32}]
)
def test_it_leaves_the_attention_term_out_without_layers_width_and_length(shape) -> None:
    assert flops.model_flops_per_token(1000, **shape) == 6000.0


@given(st.floats(min_value=0, max_value=1e18, allow_nan=False))
def test_it_counts_a_second_forward_only_with_recomputation(model: float) -> None:
    assert flops.hardware_flops(model, recompute=False) == model
    assert flops.hardware_flops(model, recompute=True) == pytest.approx(model * 4 / 3)


@pytest.mark.parametrize(
    ("name", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", 989.5),
        ("NVIDIA H100 PCIe", 756.5),
        ("NVIDIA A100-SXM4-80GB", 312),
        ("NVIDIA H200", 989.5),
        ("NVIDIA B200", 2250),
        ("NVIDIA L40S", 362.05),
    ],
)
def test_it_gives_each_device_its_datasheet_dense_bf16_peak(name: str, tflops: float) -> None:
    peak = flops.peak(name)
    assert peak is not None and peak.flops == pytest.approx(tflops * 1e12)
    assert "datasheet" in peak.source


@pytest.mark.parametrize(
    "name", ["nvidia h100 80gb hbm3", "  NVIDIA  H100 80GB   HBM3 ", "NVIDIA H100 80GB HBM3\n"]
)
def test_it_matches_a_name_whatever_its_case_and_spacing(name: str) -> None:
    assert flops.peak(name) == flops.peak("NVIDIA H100 80GB HBM3")


@pytest.mark.parametrize(
    "name", [None, "", "NVIDIA H100", "H100", "NVIDIA H100 80GB HBM3 (MIG 1g.10gb)", "Tesla V100"]
)
def test_it_knows_no_peak_for_a_name_it_does_not_hold_whole(name: str | None) -> None:
    # A guessed peak makes an MFU that looks right and is not: no partial matches.
    assert flops.peak(name) is None


def test_every_entry_has_a_positive_peak_and_a_source() -> None:
    for name, peak in flops.PEAKS.items():
        assert peak.flops > 1e12 and peak.source, name
        assert re.fullmatch(r"[\w .()/-]+", name), name


def test_the_fake_gpus_name_has_a_peak_and_no_real_device_is_called_so() -> None:
    peak = flops.peak(FAKE_NAME)
    assert peak is not None and "fake" in peak.source
    assert not FAKE_NAME.startswith("NVIDIA")
