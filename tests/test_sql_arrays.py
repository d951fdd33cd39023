"""Every array parameter compared with `= ANY(...)` in our SQL carries an explicit cast.

psycopg types a Python list by its values (ints become smallint[] or int[]), so an uncast
`id = ANY(%s)` on a bigint column compares across types. Postgres hashes the array
of an `= ANY` filter only when both sides share a hash function, which cross-type integer
operators do not: the filter then scans the whole array for every row. A diagnosis pass at
16k ranks spent 10.7 s that way on 14k ids among 47k rows (docs/performance.md)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ANY_PARAM = re.compile(r"ANY\s*\(\s*%(?:\(\w+\))?s(?!::)")


def test_every_any_parameter_is_cast_to_the_columns_type():
    offenders = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for package in ("console", "ingest", "faultline")
        for path in sorted((ROOT / package).rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if ANY_PARAM.search(line)
    ]
    assert offenders == []


def test_the_check_sees_an_uncast_parameter():
    assert ANY_PARAM.search("WHERE id = ANY(%s)")
    assert ANY_PARAM.search("WHERE g.name = ANY(%(names)s) AND")
    assert not ANY_PARAM.search("WHERE id = ANY(%s::bigint[])")
    assert not ANY_PARAM.search("r.rank = ANY(%(ranks)s::int[])")
