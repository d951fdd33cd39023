"""The utilisation fields of contract v1 (added additively): what the reporter sends, what
the contract accepts and refuses, and that batches from before them still decode."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agents.protocol import ContractError, decode_batch
from agents.reporter import Reporter

from .conftest import validate

GOLDEN = Path(__file__).parent / "golden"


def _golden() -> dict[str, Any]:
    return json.loads((GOLDEN / "v1_utilisation.json").read_text())


def test_it_accepts_the_golden_utilisation_batch() -> None:
    batch = decode_batch((GOLDEN / "v1_utilisation.json").read_bytes())
    step = batch.records[1]
    assert (step.model_flops, step.hw_flops, step.lr) == (6.88128e15, 9.17504e15, 0.0003)
    assert batch.records[0].name == "NVIDIA H100 80GB HBM3"
    assert batch.records[0].mem_util_pct == 41.0
    assert batch.records[3].interval_s == 5.002


def test_a_batch_without_the_new_fields_means_what_it_meant() -> None:
    body = _golden()
    for rec in body["records"]:
        for key in ("model_flops", "hw_flops", "lr", "name", "mem_util_pct", "interval_s"):
            rec.pop(key, None)
    batch = decode_batch(json.dumps(body).encode())
    assert batch.records[1].model_flops is None and batch.records[0].name is None


@pytest.mark.parametrize(
    ("index", "field", "value"),
    [
        (1, "model_flops", -1.0),
        (1, "hw_flops", "NaN"),  # a FLOP count is a number, never the NaN string
        (1, "lr", "fast"),
        (0, "mem_util_pct", 100.5),  # a percentage, not bytes/s
        (0, "mem_util_pct", -1),
        (0, "name", "x" * 97),
        (3, "interval_s", 0),
        (3, "interval_s", -5.0),
    ],
)
def test_it_refuses_a_bad_value_naming_record_and_field(index: int, field: str, value) -> None:
    body = _golden()
    body["records"][index][field] = value
    with pytest.raises(ContractError) as err:
        decode_batch(json.dumps(body).encode())
    assert (err.value.index, err.value.field) == (index, field)


class _Capture(Reporter):
    def __init__(self) -> None:
        super().__init__(socket_path="/nonexistent/faultline.sock", group="g", rank=3)
        self.records: list[dict[str, Any]] = []

    def _send(self, rec: dict[str, Any]) -> None:
        self.records.append(rec)


def test_the_reporter_sends_flops_and_learning_rate_on_the_step() -> None:
    rep = _Capture()
    rep.step(7, tokens=64, model_flops=1.5e12, hw_flops=2e12, lr=3e-4)
    (rec,) = rep.records
    assert (rec["model_flops"], rec["hw_flops"], rec["lr"]) == (1.5e12, 2e12, 3e-4)
    validate(rep.records)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
def test_a_bad_flop_count_is_left_out_and_the_step_still_goes(bad: float) -> None:
    rep = _Capture()
    rep.step(7, loss=2.0, model_flops=bad, hw_flops=bad)
    (rec,) = rep.records
    assert "model_flops" not in rec and "hw_flops" not in rec and rec["loss"] == 2.0
    validate(rep.records)


def test_a_nan_learning_rate_travels_as_the_contract_string() -> None:
    rep = _Capture()
    rep.step(7, lr=float("nan"))
    assert rep.records[0]["lr"] == "NaN"
    validate(rep.records)


def test_agents_torch_passes_the_steps_flops_and_learning_rate_through() -> None:
    from agents.torch import Recorder

    rep = _Capture()
    Recorder(rep).report_step(4, tokens=32, model_flops=2e12, hw_flops=2.5e12, lr=1e-3)
    (rec,) = [r for r in rep.records if r["kind"] == "step"]
    assert (rec["model_flops"], rec["hw_flops"], rec["lr"]) == (2e12, 2.5e12, 1e-3)
    validate(rep.records)
