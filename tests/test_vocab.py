"""The shared vocabularies have one definition, agents/vocab.py.

A set, tuple, list or Literal that spells two or more group states, health values,
severities or hardware fault kinds anywhere else in the source (Python, the page scripts,
the templates), a table keyed by a whole vocabulary, or a second action output limit, is a
second definition that can drift from the first: these tests name it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from agents import protocol, vocab

ROOT = Path(__file__).resolve().parent.parent
PYTHON = ("agents", "console", "ingest", "faultline")
HOME = ROOT / "agents" / "vocab.py"

VOCABS: dict[str, frozenset[str]] = {
    "group states": frozenset(vocab.GROUP_STATES),
    "health values": frozenset(vocab.HEALTH_ORDER),
    "severities": frozenset(vocab.SEVERITY_ORDER),
    "hardware fault kinds": vocab.HARDWARE_FAULT_KINDS,
}


def _strings(nodes: list[ast.expr | None]) -> set[str]:
    return {n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _python_findings(source: str, where: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Set | ast.Tuple | ast.List):
            spelled = _strings(list(node.elts))
            for name, values in VOCABS.items():
                if len(spelled & values) >= 2:
                    found.append(f"{where}:{node.lineno}: {name} {sorted(spelled & values)}")
        elif isinstance(node, ast.Dict):
            keys = _strings(list(node.keys))
            for name, values in VOCABS.items():
                if values <= keys:
                    found.append(f"{where}:{node.lineno}: a table keyed by every one of {name}")
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            value = node.value
            for target in targets:
                if (
                    isinstance(target, ast.Name)
                    and "OUTPUT" in target.id
                    and isinstance(value, ast.Constant)
                    and isinstance(value.value, int)
                ):
                    found.append(f"{where}:{node.lineno}: an output limit {value.value}")
    return sorted(found, key=lambda f: int(f.split(":")[1]))


_ARRAY = re.compile(r"\[([^\[\]]*)\]")
_QUOTED = re.compile(r"""["']([a-z_]+)["']""")
_HEALTH_CLASS = re.compile(r"health-([a-z]+)")


def _script_findings(text: str, where: str) -> list[str]:
    found = []
    for m in _ARRAY.finditer(text):
        spelled = set(_QUOTED.findall(m.group(1)))
        for name, values in VOCABS.items():
            if len(spelled & values) >= 2:
                line = text.count("\n", 0, m.start()) + 1
                found.append(f"{where}:{line}: {name} {sorted(spelled & values)}")
    return found


def _template_findings(text: str, where: str) -> list[str]:
    spelled = set(_HEALTH_CLASS.findall(text)) & VOCABS["health values"]
    return [f"{where}: health values {sorted(spelled)}"] if len(spelled) >= 2 else []


def _second_definitions() -> list[str]:
    found = []
    for folder in PYTHON:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == HOME or "migrations" in path.parts:
                continue
            where = str(path.relative_to(ROOT))
            found += _python_findings(path.read_text(), where)
    for path in sorted((ROOT / "static" / "console").glob("*.js")):
        found += _script_findings(path.read_text(), str(path.relative_to(ROOT)))
    for path in sorted((ROOT / "templates").rglob("*.html")):
        found += _template_findings(path.read_text(), str(path.relative_to(ROOT)))
    return found


def test_no_vocabulary_is_defined_twice() -> None:
    assert _second_definitions() == []


def test_it_finds_the_second_definitions_it_looks_for() -> None:
    python = (
        'ENDED = frozenset({"completed", "stopped"})\n'
        'RANK = {"critical": 0, "major": 1, "minor": 2, "info": 3}\n'
        "OUTPUT_LIMIT = 4096\n"
        'ok = event in ("gpu_lost", "ecc_dbe")\n'
        'one = state == "failed" or health in ("ok",)\n'
    )
    assert [f.split(": ", 1)[1] for f in _python_findings(python, "x.py")] == [
        "group states ['completed', 'stopped']",
        "a table keyed by every one of severities",
        "an output limit 4096",
        "hardware fault kinds ['ecc_dbe', 'gpu_lost']",
    ]
    script = 'const ORDER = ["ok", "unknown", "warning"];\nconst one = ["ok"];\n'
    assert _script_findings(script, "x.js") == [
        "x.js:1: health values ['ok', 'unknown', 'warning']"
    ]
    html = '<i class="health-ok"></i><i class="health-down"></i>'
    assert _template_findings(html, "x.html") == ["x.html: health values ['down', 'ok']"]


def test_the_protocol_sends_the_vocabularys_group_states() -> None:
    assert protocol.GROUP_STATES == vocab.GROUP_STATES
    assert set(vocab.GROUP_STATES) >= vocab.TERMINAL_GROUP_STATES


def test_the_orders_hold_each_value_once() -> None:
    assert len(set(vocab.HEALTH_ORDER)) == len(vocab.HEALTH_ORDER) == 5
    assert list(vocab.SEVERITY_RANK) == list(vocab.SEVERITY_ORDER)
    assert sorted(vocab.SEVERITY_RANK.values()) == list(range(len(vocab.SEVERITY_ORDER)))


def test_the_agent_clips_action_output_within_the_one_limit() -> None:
    from agents import executor, schedulers

    text = "h" * 5000 + "t" * 5000
    for clip in (schedulers.bound, executor._bound):
        out = clip(text)
        assert len(out) <= vocab.ACTION_OUTPUT_LIMIT
        assert out.startswith("h" * 2000) and out.endswith("t" * 2000) and "[truncated]" in out
        assert clip("short") == "short"


def test_the_group_charts_colour_exactly_the_vocabularys_group_states() -> None:
    # A colour per state is the page's own (not a vocabulary), but its keys must follow the
    # vocabulary's states: a new state would otherwise be drawn in the fallback grey.
    script = (ROOT / "static" / "console" / "group.js").read_text()
    table = re.search(r"const STATE_COLORS = \{(.*?)\};", script, re.S)
    assert table is not None
    assert set(re.findall(r"([a-z_]+):", table.group(1))) == set(vocab.GROUP_STATES)
