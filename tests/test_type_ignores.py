"""Every `type: ignore` in the tree says why on the same line (mypy's own check,
`warn_unused_ignores`, catches those that do nothing)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IGNORE = re.compile(r"#\s*type:\s*ignore(\[[^\]]*\])?(?P<rest>.*)$")


def _unexplained() -> list[str]:
    bad = []
    for folder in ("agents", "console", "ingest", "faultline", "bench", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            if path == Path(__file__).resolve():
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                m = IGNORE.search(line)
                if m and not re.search(r"[#—-]\s*\S", m.group("rest")):
                    bad.append(f"{path.relative_to(ROOT)}:{n}")
    return bad


def test_it_finds_an_unexplained_ignore(tmp_path: Path) -> None:
    line = "x = f()  # type: ignore[misc]"
    assert IGNORE.search(line) and not re.search(r"[#—-]\s*\S", IGNORE.search(line)["rest"])


def test_it_gives_every_type_ignore_a_reason() -> None:
    assert _unexplained() == []
