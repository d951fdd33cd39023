"""What a page must not show a person: the rules the console browser test applies.

`problems(page)` collects the rendered text of a Playwright page (every visible text node,
the Plotly charts' SVG text included; `<script>`/`<style>` left out) and returns each:
- ISO 8601 timestamp (`2026-12-06T21:25:38…`, also with a space for the T), anywhere;
- number with a fractional part and more than four significant digits (outside `<code>`,
  where identifiers, hashes and raw evidence live);
- integer above 9,999 written without thousands separators (outside `<code>`);
- `<` in the document's title.
Exact counts with separators ("12,345 steps") are allowed: a step number is never rounded.
"""

from __future__ import annotations

import re
from typing import Any

ISO = re.compile(r"\b\d{4}-\d\d-\d\d[T ]\d\d:\d\d(:\d\d)?")
# A number standing alone: not part of a word, an id (node-001, GPU-…, #12, r12, v7) or a
# path, a version or an address.
NUMBER = re.compile(r"(?<![\w\-#/.:])(\d[\d,]*(?:\.\d+)?)(?![\w\-/:]|\.\d)")

_TEXTS = """() => {
  const out = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const p = n.parentElement;
    if (!p || p.closest("script, style, template, noscript")) continue;
    const text = n.textContent.trim();
    if (!text) continue;
    const box = p.getBoundingClientRect();
    const visible = p.closest("svg") || (box.width > 0 && box.height > 0) || p.closest("details");
    if (!visible) continue;
    out.push({ text, code: !!p.closest("code, pre, kbd, samp, [data-raw]") });
  }
  return out;
}"""


def significant(number: str) -> int:
    digits = number.replace(",", "")
    whole, _, frac = digits.partition(".")
    if not frac:
        return len(whole.lstrip("0").rstrip("0")) or 1
    return len((whole + frac).lstrip("0")) or 1


def text_problems(texts: list[dict[str, Any]]) -> list[str]:
    found = []
    for t in texts:
        text = t["text"]
        if ISO.search(text):
            found.append(f"ISO timestamp: {text[:120]!r}")
        if t["code"]:
            continue
        for m in NUMBER.finditer(text):
            n = m.group(1).rstrip(",")
            plain = n.replace(",", "")
            if "." in n and significant(n) > 4:
                found.append(f"more than 4 significant digits: {n} in {text[:120]!r}")
            elif "." not in n and "," not in n and int(plain) > 9999:
                found.append(f"no thousands separators: {n} in {text[:120]!r}")
    return found


def problems(page: Any) -> list[str]:
    found = text_problems(page.evaluate(_TEXTS))
    title = page.title()
    if "<" in title:
        found.append(f"markup in the title: {title[:120]!r}")
    return found
