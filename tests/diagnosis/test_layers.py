"""One mapping from finding kind (and Xid) to layer."""

from __future__ import annotations

import re
from pathlib import Path

from agents import xid
from console.diagnosis import layers

RULES = Path(__file__).resolve().parents[2] / "console" / "diagnosis" / "rules"


def test_every_kind_the_rules_emit_has_a_layer():
    text = "\n".join(p.read_text() for p in RULES.glob("*.py"))
    emitted = set(re.findall(r'kind="([a-z_]+)"', text))
    emitted |= set(re.findall(r'\("([a-z_]+)", (?:ROOT_CAUSE|SYMPTOM|UNDETERMINED)', text))
    emitted -= {"xid"}
    assert emitted, "the pattern found no kinds"
    missing = sorted(k for k in emitted if k not in layers.KIND_LAYER)
    assert not missing, missing


def test_xid_layers_come_from_the_catalog():
    assert layers.layer_of("xid", {"code": 48}) == layers.HBM
    assert layers.layer_of("xid", {"code": 74}) == layers.NVLINK
    assert layers.layer_of("xid", {"code": 79}) == layers.GPU
    assert layers.layer_of("xid", {"code": 13}) == layers.SOFTWARE  # application class
    assert layers.layer_of("xid", {}) == layers.GPU  # unknown code: the GPU's
    for code in xid.active().codes():
        assert xid.xid_layer(code) in layers.LAYERS


def test_categories():
    assert layers.category_of(layers.HBM) == layers.HARDWARE
    assert layers.category_of(layers.SOFTWARE) == "software"
    assert layers.layer_of("brand_new_kind") == layers.UNDETERMINED
    assert set(layers.LAYER_LABELS) == set(layers.LAYERS)
