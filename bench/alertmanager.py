"""One large Alertmanager delivery through POST /api/v1/alertmanager, timed in one process.

Alertmanager gives a webhook 60 s by default; a delivery that outlives it is rolled back and
sent again. This posts one payload of N alerts through Django's test client against an
inventory of nodes and GPUs, then the same payload again (Alertmanager re-sends firing
alerts every repeat_interval), then the resolves, and prints the wall time and query count
of each.

    python bench/alertmanager.py                    # 3,000 alerts: node-exporter + DCGM Xid
    python bench/alertmanager.py --alerts 10000 --xid-share 0
    python bench/alertmanager.py --root ../old-tree # another checkout's code

Shapes: `--xid-share` of the alerts are DCGM Xid alerts (one per GPU, latching a fault),
the rest node-exporter alerts, `--per-node` alerts on each node. Without
DATABASE_URL/REDIS_URL it starts a throwaway embedded Postgres and Valkey.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

_HERE = Path(__file__).resolve().parent
TOKEN = "bench-alertmanager-token-0123456789"  # noqa: S105 - a throwaway bench database


def _setup(root: Path) -> object | None:
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
    sys.path.insert(0, str(root))
    embedded = None
    if not (os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL")):
        from faultline.embedded import start_embedded

        embedded = start_embedded(Path(tempfile.mkdtemp(prefix="faultline-am-")))
        os.environ["DATABASE_URL"] = embedded.database_url
        os.environ["REDIS_URL"] = embedded.redis_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "faultline.settings"
    os.environ["FAULTLINE_ALLOWED_HOSTS"] = "testserver"
    os.environ["FAULTLINE_ALERTMANAGER_TOKEN"] = TOKEN
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return embedded


def _inventory(nodes: int, gpus: int, stamp: str) -> list[tuple[str, list[str]]]:
    from console.models import Device, Node

    made = []
    for n in range(nodes):
        node = Node.objects.create(name=f"am-{stamp}-{n:04d}", pool="bench")
        uuids = [f"GPU-{stamp}-{n:04d}-{g}" for g in range(gpus)]
        Device.objects.bulk_create(
            [Device(uuid=u, node=node, index=g) for g, u in enumerate(uuids)]
        )
        made.append((node.name, uuids))
    return made


START = (datetime.now(UTC) - timedelta(minutes=5)).isoformat().replace("+00:00", "Z")


def _alerts(
    inventory: list[tuple[str, list[str]]], total: int, xid_share: float, status: str
) -> list[dict[str, object]]:
    start = START  # the same alerts each time: a re-delivery, then their resolves
    end = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    xids = int(total * xid_share)
    out: list[dict[str, object]] = []
    slots = [(name, g, uuid) for name, uuids in inventory for g, uuid in enumerate(uuids)]
    for i in range(xids):
        name, g, uuid = slots[i % len(slots)]
        labels = {
            "alertname": "DCGM_FI_DEV_XID_ERRORS",
            "severity": "critical",
            "Hostname": name,
            "gpu": str(g),
            "UUID": uuid,
            "err_code": "79",
        }
        out.append(
            {
                "status": status,
                "labels": labels,
                "annotations": {"summary": "Xid 79"},
                "startsAt": start,
                "endsAt": end if status == "resolved" else "0001-01-01T00:00:00Z",
                "fingerprint": f"x{i:07d}",
            }
        )
    for i in range(total - xids):
        name = inventory[i % len(inventory)][0]
        labels = {
            "alertname": f"NodeCheck{i // len(inventory)}",
            "severity": "warning",
            "instance": f"{name}:9100",
            "job": "node",
        }
        out.append(
            {
                "status": status,
                "labels": labels,
                "annotations": {"summary": "node-exporter says so"},
                "startsAt": start,
                "endsAt": end if status == "resolved" else "0001-01-01T00:00:00Z",
                "fingerprint": f"n{i:07d}",
            }
        )
    return out


def _deliver(client: object, alerts: list[dict[str, object]], status: str) -> tuple[float, int]:
    from django.db import connection

    body = json.dumps(
        {
            "version": "4",
            "groupKey": "{}:{}",
            "status": status,
            "receiver": "faultline",
            "alerts": alerts,
        }
    )
    count = [0]

    def counted(execute, sql, params, many, context):  # type: ignore[no-untyped-def]  # Django's execute_wrapper hook signature, untyped upstream
        count[0] += 1
        return execute(sql, params, many, context)

    with connection.execute_wrapper(counted):
        t0 = time.perf_counter()
        response = client.post(  # type: ignore[attr-defined]  # django.test.Client built after setup(), typed object here
            "/api/v1/alertmanager",
            body,
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {TOKEN}",
        )
        wall = time.perf_counter() - t0
    if response.status_code != 200:
        raise SystemExit(f"receiver answered {response.status_code}: {response.content[:500]!r}")
    return wall, count[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alerts", type=int, default=3000)
    parser.add_argument("--xid-share", type=float, default=0.5)
    parser.add_argument("--per-node", type=int, default=8, help="alerts per node")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--root", default=str(_HERE.parent), help="the checkout to measure")
    args = parser.parse_args()
    embedded = _setup(Path(args.root).resolve())
    try:
        from django.test import Client

        stamp = f"{time.time_ns() % 10**8:08d}"
        nodes = max(1, args.alerts // args.per_node)
        inventory = _inventory(nodes, args.gpus, stamp)
        client = Client()
        print(
            f"{args.alerts} alerts ({args.xid_share:.0%} DCGM Xid) on {nodes} nodes, "
            f"{args.gpus} GPUs each; code from {args.root}"
        )
        for label, status in (
            ("first delivery", "firing"),
            ("re-delivery", "firing"),
            ("resolves", "resolved"),
        ):
            alerts = _alerts(inventory, args.alerts, args.xid_share, status)
            wall, queries = _deliver(client, alerts, status)
            print(f"  {label:15s} {wall:7.2f} s  {queries:7d} queries")
    finally:
        if embedded is not None:
            embedded.stop()  # type: ignore[attr-defined]  # Embedded returned by the bench's own start helper, typed object


if __name__ == "__main__":
    main()
