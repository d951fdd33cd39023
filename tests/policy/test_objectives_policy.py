"""Which recovery objectives are in force and who set them."""

from __future__ import annotations

import pytest

from console.policy import objectives as o
from console.policy.inputs import PolicyError

POOLS = o.pool_defaults(
    {"default": {"rto_s": 900, "consistency": "allow_repeat"}, "pools": {"h100": {"rto_s": 300}}}
)


def test_operator_beats_launcher_beats_pool_beats_default() -> None:
    declared = {"launcher": {"rpo_steps": 500, "rto_s": 120}, "operator": {"rpo_steps": 50}}
    eff = o.effective(declared=declared, pools=POOLS, pool="h100")
    assert eff["rpo_steps"] == 50 and eff["sources"]["rpo_steps"] == "operator"
    assert eff["rto_s"] == 120 and eff["sources"]["rto_s"] == "launcher"
    assert eff["consistency"] == "allow_repeat" and eff["sources"]["consistency"] == "default"
    bare = o.effective(declared={}, pools=POOLS, pool="h100")
    assert bare["rto_s"] == 300 and bare["sources"]["rto_s"] == "pool:h100"
    assert o.effective(declared=None, pools=POOLS, pool="a100")["rto_s"] == 900
    assert "rpo_steps" not in bare  # nobody promised an RPO: nothing checks it


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ({"consistency": "mostly"}, "consistency"),
        ({"rpo_steps": 0}, "rpo_steps"),
        ({"rto_s": -1}, "rto_s"),
        ({"goodput_target": 1.5}, "goodput_target"),
        ({"semantics": "exactly_once"}, "semantics"),
        ({"rpo": 5}, "rpo"),
        ([1, 2], "must be an object"),
    ],
)
def test_bad_objectives_are_refused_naming_the_key(raw: object, fragment: str) -> None:
    with pytest.raises(PolicyError, match=fragment):
        o.validated(raw)


def test_bad_pool_defaults_fail_loudly() -> None:
    with pytest.raises(PolicyError, match="pool h100"):
        o.pool_defaults({"pools": {"h100": {"rto_s": "soon"}}})
    with pytest.raises(PolicyError, match="unknown section"):
        o.pool_defaults({"defaults": {}})
