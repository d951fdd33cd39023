"""CPU per ingest batch in one process: the web side and its Postgres backend, no HTTP.

`bench/ingest.py` is the end-to-end figure (real HTTP, concurrent agents, ratio to raw
COPY). This one isolates the cost of one batch: it posts the benchmark's batches one at a
time through Django's test client and reads the CPU time of this process and of the
Postgres backend serving it, so two versions of the code can be compared on a busy box.

    python bench/ingest_inprocess.py                      # 100- and 1,000-record batches
    python bench/ingest_inprocess.py --profile            # plus the top of cProfile
    python bench/ingest_inprocess.py --profile --sort cumulative
    python bench/ingest_inprocess.py --wsgi               # through faultline.wsgi
    python bench/ingest_inprocess.py --root ../old-tree   # another checkout's code

Without DATABASE_URL/REDIS_URL it starts a throwaway embedded Postgres and Valkey.
"""

from __future__ import annotations

import argparse
import cProfile
import gzip
import io
import os
import pstats
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

_HERE = Path(__file__).resolve().parent


def _setup(root: Path) -> object | None:
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
    sys.path.insert(0, str(root))
    embedded = None
    if not (os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL")):
        from faultline.embedded import start_embedded

        embedded = start_embedded(Path(tempfile.mkdtemp(prefix="faultline-inproc-")))
        os.environ["DATABASE_URL"] = embedded.database_url
        os.environ["REDIS_URL"] = embedded.redis_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "faultline.settings"
    os.environ["FAULTLINE_ALLOWED_HOSTS"] = "testserver"
    os.environ["FAULTLINE_INGEST_RATE_PER_MIN"] = "1000000"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return embedded


def _backend_cpu_s() -> float:
    """CPU seconds of the Postgres backends of this database (same host only): Django's
    connection and, through faultline.wsgi, the pool's connections it takes in turn."""
    from django.db import connection

    connection.ensure_connection()
    with connection.cursor() as cur:
        cur.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
        pids = [row[0] for row in cur.fetchall()]
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return float("nan")
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def run(
    batch_seconds: int, batches: int, profile: bool, sort: str = "tottime", wsgi: bool = False
) -> None:
    import msgspec
    from django.test import Client

    from bench.ingest import Agent, build_batches
    from ingest.auth import issue_token

    stamp = time.time_ns()
    agent = Agent(index=stamp % 1000, node=f"inproc-{stamp}", group=f"g-inproc-{stamp}")
    agent.token = issue_token(node_name=agent.node)
    build_batches([agent], batches + 3, batch_seconds)
    ident = {"id": f"agent-{stamp}", "node": agent.node, "version": "bench"}
    bodies = []
    for seq, recs in enumerate(agent.batches, start=1):
        sent_at = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        body = {"agent": ident, "seq": seq, "sent_at": sent_at, "records": recs}
        bodies.append(gzip.compress(msgspec.json.encode(body), 1))
    client = Client()
    headers = {"Authorization": f"Bearer {agent.token}", "Content-Encoding": "gzip"}

    def post(body: bytes) -> None:
        response = client.post(
            "/api/v1/ingest", body, content_type="application/json", headers=headers
        )
        if response.status_code != 202:
            raise SystemExit(f"ingest answered {response.status_code}: {response.content!r}")

    if wsgi:  # the WSGI app gunicorn serves, request signals and pool included; no socket
        from faultline.wsgi import application

        def post(body: bytes) -> None:
            environ = {
                "REQUEST_METHOD": "POST",
                "PATH_INFO": "/api/v1/ingest",
                "SCRIPT_NAME": "",
                "SERVER_NAME": "testserver",
                "SERVER_PORT": "80",
                "HTTP_HOST": "testserver",
                "wsgi.url_scheme": "http",
                "wsgi.input": io.BytesIO(body),
                "CONTENT_LENGTH": str(len(body)),
                "CONTENT_TYPE": "application/json",
                "HTTP_AUTHORIZATION": headers["Authorization"],
                "HTTP_CONTENT_ENCODING": "gzip",
            }
            status: list[str] = []
            out = application(environ, lambda s, h: status.append(s))
            content = b"".join(out)
            out.close()
            if not status[0].startswith("202"):
                raise SystemExit(f"ingest answered {status[0]}: {content!r}")

    for body in bodies[:3]:  # warm: group and ranks exist, connection and caches are hot
        post(body)
    timed = bodies[3:]
    records = sum(len(r) for r in agent.batches[3:]) / len(timed)
    prof = cProfile.Profile(time.process_time) if profile else None
    pg0, cpu0, t0 = _backend_cpu_s(), time.process_time(), time.perf_counter()
    if prof:
        prof.enable()
    for body in timed:
        post(body)
    if prof:
        prof.disable()
    wall, cpu, pg = time.perf_counter() - t0, time.process_time() - cpu0, _backend_cpu_s() - pg0
    n = len(timed)
    print(
        f"batch {records:5.0f} records: web_cpu_ms {cpu / n * 1000:6.2f}  "
        f"pg_cpu_ms {pg / n * 1000:6.2f}  wall_ms {wall / n * 1000:6.2f}"
        f"{'  (profiled: inflated)' if prof else ''}",
        flush=True,
    )
    if prof:
        pstats.Stats(prof).sort_stats(sort).print_stats(30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=_HERE.parent, help="checkout to measure")
    parser.add_argument("--batches", type=int, default=60, help="timed batches per size")
    parser.add_argument("--profile", action="store_true", help="print cProfile's top 30")
    parser.add_argument("--sort", default="tottime", help="cProfile order (e.g. cumulative)")
    parser.add_argument(
        "--wsgi", action="store_true", help="post through faultline.wsgi, not the test client"
    )
    args = parser.parse_args(argv)
    sys.path.insert(0, str(_HERE.parent))  # bench.ingest builds the batches
    embedded = _setup(args.root.resolve())
    try:
        run(4, args.batches, args.profile, args.sort, args.wsgi)
        run(40, max(args.batches // 4, 8), args.profile, args.sort, args.wsgi)
    finally:
        if embedded is not None:
            embedded.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
