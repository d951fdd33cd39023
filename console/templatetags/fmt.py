"""Template filters for the console's one time, number and duration format (console.formats).

`{{ ts|when }}` writes `<time datetime="ISO" title="… UTC">4 min ago</time>`: relative on
the page, absolute UTC on hover, and static/console/common.js keeps the text fresh.
`{{ x|qty:"tok/s" }}`, `{{ s|dur }}`, `{{ f|pct }}` write numbers, durations and shares.
"""

from __future__ import annotations

from django import template
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from console import charts, formats

register = template.Library()


@register.filter
def when(value: object, empty: str = "—") -> SafeString | str:
    ts = formats.parse(value)
    if ts is None:
        return empty
    return format_html(
        '<time datetime="{}" title="{}">{}</time>',
        ts.isoformat(),
        formats.absolute(ts),
        formats.relative(ts, timezone.now()),
    )


@register.filter
def qty(value: object, unit: str = "") -> str:
    return formats.number(value, unit)


@register.filter
def dur(value: object) -> str:
    return formats.duration(value)


@register.filter
def pct(value: object) -> str:
    return formats.percent(value)


@register.filter
def count(value: object) -> str:
    """An exact count or step number: 12345 -> "12,345" (never rounded)."""
    return formats.count(value)


@register.filter
def evidence(value: object) -> list[dict[str, str]]:
    """An action's or finding's evidence as the incident page shows it (key, value, at)."""
    return charts.evidence_rows(value) if isinstance(value, dict) else []
