"""Benchmark the agent's vLLM/SGLang scrape: parsing a /metrics answer and mapping two
scrapes to a window; prints figures. Input: the captured vLLM 0.32 scrapes
(tests/agents/fixtures/serving/vllm-0.32.0.*.prom) and a synthetic one N times larger (an
engine with many data-parallel engines). Goal: about 1 % of a core at the default 10 s
interval (<= 100 ms a scrape).

    python bench/serving_scrape.py [--rounds 50] [--scale 20]
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from pathlib import Path

from agents import engines, prometheus

FIXTURES = Path(__file__).parents[1] / "tests" / "agents" / "fixtures" / "serving"


def _scaled(text: str, scale: int) -> str:
    """The scrape as `scale` data-parallel engines would write it (engine="0".."n-1")."""
    lines = [x for x in text.splitlines() if 'engine="0"' in x]
    more = [re.sub(r'engine="0"', f'engine="{e}"', x) for e in range(1, scale) for x in lines]
    return text + "\n".join(more) + "\n"


def _time(a: str, b: str, rounds: int) -> list[float]:
    out = []
    keep = engines.wanted(engines.VLLM).__contains__  # as the agent's scraper reads
    for _ in range(rounds):
        started = time.perf_counter()
        before = engines.read(engines.VLLM, prometheus.parse(a, keep=keep))
        after = engines.read(engines.VLLM, prometheus.parse(b, keep=keep))
        engines.window(engines.VLLM, before, after, 10.0, engines.Slo())
        out.append((time.perf_counter() - started) / 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--scale", type=int, default=20)
    args = parser.parse_args()
    a, b = ((FIXTURES / f"vllm-0.32.0.{s}.prom").read_text() for s in "ab")
    for label, (x, y) in (
        ("vllm 0.32, 1 engine", (a, b)),
        (f"vllm 0.32, {args.scale} engines", (_scaled(a, args.scale), _scaled(b, args.scale))),
    ):
        ms = sorted(t * 1000 for t in _time(x, y, args.rounds))
        print(
            f"{label}: {len(y)} bytes, {y.count(chr(10))} lines: per scrape median "
            f"{statistics.median(ms):.1f} ms, p95 {ms[int(0.95 * (len(ms) - 1))]:.1f} ms"
        )


if __name__ == "__main__":
    main()
