"""Reads for serving groups: G_serve over time, per-worker state, and version switches.

Shapes what `console.queries.telemetry` aggregates from the serving windows in SQL, so a
page or API call costs a few indexed queries however many windows a fleet reports. Must not
query ingest's tables itself.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from console.diagnosis.records import ServingSlo
from console.models import ConsistencyGroup
from console.queries.telemetry import serving_windows

WINDOW = timedelta(hours=1)


def serving_state_of(group: ConsistencyGroup) -> dict[str, Any] | None:
    """The serving state the newest diagnosis wrote (console.diagnosis.rules.serving);
    `initializing` before the first diagnosis; None for a training group."""
    if group.kind != "serving":
        return None
    return (group.summary or {}).get("serving_state") or {
        "state": "initializing",
        "reason": "not diagnosed yet",
        "workers": 0,
        "ready": 0,
        "breaching": 0,
    }


def effective_slo(group: ConsistencyGroup) -> dict[str, float]:
    return ServingSlo.from_mapping(group.slo).to_dict()


def workers(group: ConsistencyGroup) -> list[dict[str, Any]]:
    """The newest window of every worker, with its versions, readiness and drain state."""
    rows = serving_windows.serving_workers(group)
    out = []
    for row in rows:
        row = dict(row)
        win = row.pop("window")
        requests = int(win.get("requests") or 0)
        met = int(win.get("slo_met") or 0)
        seconds = float(win.get("seconds") or 0) or None
        out.append(
            {
                **row,
                "g_serve": round(met / seconds, 3) if seconds else None,
                "slo_met_ratio": round(met / requests, 4) if requests else None,
                **{
                    k: win.get(k)
                    for k in (
                        "requests",
                        "ttft_ms_p99",
                        "tpot_ms_p99",
                        "e2e_ms_p99",
                        "queued",
                        "active",
                        "preempted",
                        "kv_used_pct",
                        "evictions",
                        "oom",
                        "retries",
                    )
                },
            }
        )
    return out


def series(group: ConsistencyGroup, now: datetime) -> list[dict[str, Any]]:
    """G_serve (SLO-meeting requests per second) and worst p99 latencies per minute."""
    rows = serving_windows.serving_minutes(group, now - WINDOW)
    return [
        {
            "minute": minute.isoformat(),
            "g_serve": round(float(met) / float(secs), 3) if secs else None,
            "requests": requests,
            "slo_met": met,
            "ttft_ms_p99": ttft,
            "tpot_ms_p99": tpot,
        }
        for minute, met, requests, secs, ttft, tpot in (
            (m, int(a), int(b), float(c), d, e) for m, a, b, c, d, e in rows
        )
    ]


def versions(group: ConsistencyGroup, now: datetime) -> list[dict[str, Any]]:
    """Traffic share and SLO goodput per model version: how a canary compares."""
    rows = [
        (v, int(req), int(met), int(n), first, last)
        for v, req, met, n, first, last in serving_windows.serving_versions(group, now - WINDOW)
    ]
    total = sum(r[1] for r in rows)
    return [
        {
            "version": version,
            "requests": requests,
            "traffic_share": round(requests / total, 4) if total else None,
            "slo_met_ratio": round(met / requests, 4) if requests else None,
            "workers": n_workers,
            "first_seen": first.isoformat(),
            "last_seen": last.isoformat(),
        }
        for version, requests, met, n_workers, first, last in rows
    ]


def overview(group: ConsistencyGroup, now: datetime) -> dict[str, Any]:
    return {
        "group": group.name,
        "slo": effective_slo(group),
        "g_serve": (group.summary.get("goodput") or {}).get("g_serve_requests_per_s"),
        "workers": workers(group),
        "versions": versions(group, now),
        "series": series(group, now),
    }
