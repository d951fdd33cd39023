"""One format for numbers, durations and times: console/formats.py and common.js agree.

The browser walk (tests/system/test_browser_console.py) checks what the pages show; this
holds the two implementations to the same cases, the neighbours of each rule included.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from console import formats

NUMBERS = [
    (22090.181, "22,090"), (0.166667, "0.1667"), (0.3338, "0.3338"), (0.926, "0.926"),
    (17_694_720, "17.69 M"), (1234, "1,234"), (9999.5, "10,000"), (12345, "12,350"),
    (0, "0"), (-3.5, "-3.5"), (850.44, "850.4"), (1e-5, "0.00001"), (123456789012, "123.5 G"),
    (999_950, "1 M"), (None, "—"), (float("nan"), "—"), (float("inf"), "—"),
]  # fmt: skip
DURATIONS = [
    (0.85, "850 ms"), (0.0005, "0.5 ms"), (12.34, "12.34 s"), (59.6, "59.6 s"),
    (250, "4 min 10 s"), (3599.6, "1 h"), (7300, "2 h 2 min"), (90000, "1 d 1 h"),
    (86399, "1 d"), (-2, "-2 s"), (None, "—"),
]  # fmt: skip
NOW = datetime(2026, 12, 6, 21, 30, tzinfo=UTC)
RELATIVE = [(0, "just now"), (35, "35 s ago"), (600, "10 min ago"), (7300, "2 h ago"),
            (90000, "1 d ago"), (-1200, "in 20 min")]  # fmt: skip
COMMON_JS = Path(__file__).resolve().parents[3] / "static" / "console" / "common.js"


@pytest.mark.parametrize(("value", "text"), NUMBERS)
def test_it_writes_a_number_with_four_significant_digits_and_separators(value, text):
    assert formats.number(value) == text


@pytest.mark.parametrize(("value", "text"), DURATIONS)
def test_it_writes_a_duration_in_the_largest_units_that_fit(value, text):
    assert formats.duration(value) == text


@pytest.mark.parametrize(("ago", "text"), RELATIVE)
def test_it_writes_a_time_relative_to_now(ago, text):
    assert formats.relative(NOW - timedelta(seconds=ago), NOW) == text


def test_it_keeps_the_absolute_utc_time_for_the_hover():
    ts = datetime(2026, 12, 6, 21, 25, 38, 478510, tzinfo=UTC)
    assert formats.absolute(ts) == "2026-12-06 21:25:38 UTC"
    assert formats.parse("2026-12-06T21:25:38.478510+00:00") == ts
    assert formats.parse("yesterday") is None and formats.parse(None) is None


@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e15, max_value=1e15))
def test_no_number_has_more_than_four_significant_digits(x):
    text = formats.number(x)
    mantissa = text.split(" ")[0].lstrip("-").replace(",", "").replace(".", "").lstrip("0")
    assert len(mantissa.rstrip("0")) <= 4, text
    if abs(x) >= 9999.5 and abs(x) < 999_950:
        assert "," in text, text


def test_common_js_writes_the_same_as_the_server():
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: common.js is checked by the browser walk only")
    script = """
      global.document = {
        addEventListener() {}, createTextNode: (x) => x, getElementById: () => null,
      };
      global.window = {};
      eval(require("fs").readFileSync(process.argv[1], "utf8"));
      const C = window.Console, now = Date.parse(process.argv[2]);
      const cases = JSON.parse(process.argv[3]);
      console.log(JSON.stringify({
        numbers: cases.numbers.map((v) => C.num(v === "nan" ? NaN : v === "inf" ? Infinity : v)),
        durations: cases.durations.map((v) => C.dur(v)),
        relative: cases.relative.map((s) => C.relative(now - s * 1000, now)),
      }));
    """
    cases = {
        "numbers": [("nan" if v != v else "inf" if v == float("inf") else v) for v, _ in NUMBERS],
        "durations": [v for v, _ in DURATIONS],
        "relative": [s for s, _ in RELATIVE],
    }
    out = subprocess.run(
        [node, "-e", script, str(COMMON_JS), NOW.isoformat(), json.dumps(cases)],
        capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    got = json.loads(out.stdout)
    assert got["numbers"] == [t for _, t in NUMBERS]
    assert got["durations"] == [t for _, t in DURATIONS]
    assert got["relative"] == [t for _, t in RELATIVE]
