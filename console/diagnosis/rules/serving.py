"""Serving rule family (minimal): per-worker windows against SLOs and serving contracts.

Owns `slo_breach` (with its likely cause: OOMs, KV pressure, a version canary, one slow
worker, overload), `ready_before_loaded`, `drained_worker_traffic`, `stale_version`,
`retry_storm` (per worker), `duplicate_finish` and `worker_lost` (a worker whose exit
its launcher reported, or gone silent for three of its own windows while holding requests:
they are lost work). Must not treat a window with zero
requests as a failure: a quiet period is not an outage.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from console.diagnosis.findings import CRITICAL, MAJOR, ROOT_CAUSE, worker_subject
from console.diagnosis.records import ServingSlo
from console.diagnosis.rules.base import Context
from console.diagnosis.snapshot import ServingWindow


def _emit(
    ctx: Context,
    w: ServingWindow,
    kind: str,
    severity: str,
    summary: str,
    evidence: dict[str, Any],
    unsafe: str | None = None,
) -> None:
    f = ctx.put(
        ctx.new(
            kind=kind,
            subject=worker_subject(ctx.snap.group, w.worker),
            role=ROOT_CAUSE,
            severity=severity,
            summary=f"Worker {w.worker}: {summary}",
            first_seen=w.ts,
            evidence={
                "worker": w.worker,
                "window_ts": w.ts,
                "model_version": w.model_version,
                "kv_schema": w.kv_schema,
                **evidence,
            },
        )
    )
    if unsafe:
        ctx.unsafe_reasons[f.id] = unsafe


def _majority(values: list[str | None]) -> str | None:
    counts = Counter(v for v in values if v is not None)
    if not counts:
        return None
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]


def _breach(slo: ServingSlo, win: Mapping[str, Any], requests: int) -> list[str]:
    """Which SLO terms this window broke, in words; empty when it met all of them."""
    out = []
    met = win.get("slo_met")
    if met is not None and met / requests < slo.goodput_target:
        out.append(
            f"{met}/{requests} requests met SLO ({met / requests:.1%} < {slo.goodput_target:.0%})"
        )
    for key, limit in (
        ("ttft_ms_p99", slo.ttft_ms_p99),
        ("tpot_ms_p99", slo.tpot_ms_p99),
        ("e2e_ms_p99", slo.e2e_ms_p99),
    ):
        value = win.get(key)
        if value is not None and value > limit:
            out.append(f"{key} {value:.0f} ms > {limit:.0f} ms")
    return out


def _breach_of(slo: ServingSlo, win: Mapping[str, Any]) -> list[str]:
    requests = int(win.get("requests") or 0)
    return _breach(slo, win, requests) if requests else []


def _likely_cause(
    ctx: Context, w: ServingWindow, fleet_model: str | None
) -> tuple[str, dict[str, Any], str | None]:
    """Name the most likely cause of a worker's breach from what its window and peers show."""
    win = w.window
    if int(win.get("oom") or 0) > 0:
        return f"worker OOMs ({win['oom']} in the window)", {}, None
    kv = win.get("kv_used_pct")
    if (kv is not None and kv >= 95) or (
        int(win.get("evictions") or 0) > 0 and int(win.get("preempted") or 0) > 0
    ):
        return (
            f"KV cache pressure (KV {kv if kv is not None else '?'}% used, "
            f"{win.get('evictions', 0)} evictions, {win.get('preempted', 0)} preempted)",
            {},
            None,
        )
    peers = [p for p in ctx.snap.serving if p.worker != w.worker and p.ready and not p.draining]
    healthy = [p for p in peers if not _breach_of(ctx.snap.slo, p.window)]
    if w.model_version and fleet_model and w.model_version != fleet_model and healthy:
        healthy_versions = sorted({p.model_version or "?" for p in healthy})
        return (
            f"version canary {w.model_version} (healthy workers serve "
            f"{', '.join(healthy_versions)})",
            {"canary_version": w.model_version, "healthy_versions": healthy_versions},
            "the new version breaches its SLO: roll back, do not promote automatically",
        )
    if peers and len(healthy) == len(peers):
        return "one slow worker (its peers meet the SLO)", {}, None
    return "group-wide overload (most workers breach)", {}, None


def _stale(w: ServingWindow, ready: list[ServingWindow], older_models: set[str]) -> bool:
    """An older model than the group's current, or a KV schema its same-model peers left."""
    if w.model_version in older_models:
        return True
    peers = [p for p in ready if p.worker != w.worker and p.model_version == w.model_version]
    counts = Counter(p.kv_schema for p in peers if p.kv_schema is not None)
    if not counts or w.kv_schema is None:
        return False
    schema, n = counts.most_common(1)[0]
    return n > len(peers) / 2 and n >= 2 and w.kv_schema != schema  # a clear majority only


# A worker is silent after max(SILENCE_WINDOWS x its own window seconds, SILENCE_FLOOR_S):
# its cadence, measured by the worker itself (a loop slowed by load reports longer windows,
# so its threshold stretches with it), and a floor for scheduler hiccups and the agent's
# batching (about a second). Judged at the node's newest delivered record while that node's
# agent lags the clock (replaying a backlog), as the progress rule does: late telemetry is
# not a lost worker.
SILENCE_WINDOWS = 3.0
SILENCE_FLOOR_S = 5.0
LOST_UNSAFE = "requests in flight were lost with the worker's KV cache: replay only if idempotent"


def silence_threshold_s(w: ServingWindow) -> float:
    """Seconds without a window after which worker `w` is silent (see SILENCE_WINDOWS)."""
    seconds = float(w.window.get("seconds") or 10.0)
    return max(SILENCE_WINDOWS * seconds, SILENCE_FLOOR_S)


def _judged_at(ctx: Context, w: ServingWindow) -> datetime:
    """The node's agent may be behind: judge what it has delivered so far."""
    return ctx.known_at(w.node)


def _lost_workers(ctx: Context) -> None:
    """A worker whose process exited (its launcher said so), or that stopped reporting
    while it held requests, lost them (and their KV)."""
    for w in ctx.snap.serving:
        in_flight = int(w.window.get("active") or 0) + int(w.window.get("queued") or 0)
        if w.window.get("exited"):
            if w.draining and in_flight == 0:
                continue  # a drained worker stopped on purpose: nothing was lost
            code = w.window.get("exit_code")
            _emit(
                ctx,
                w,
                "worker_lost",
                MAJOR,
                f"exited{'' if code is None else f' (code {code})'} holding {in_flight} "
                "in-flight request(s)",
                {"lost_requests": in_flight, "exited": True, "exit_code": code},
                LOST_UNSAFE,
            )
            continue
        silent_s = (_judged_at(ctx, w) - w.ts).total_seconds()
        threshold = silence_threshold_s(w)
        if silent_s <= threshold or in_flight == 0:
            continue
        _emit(
            ctx,
            w,
            "worker_lost",
            MAJOR,
            f"stopped reporting {silent_s:.0f}s ago holding {in_flight} in-flight request(s)",
            {
                "lost_requests": in_flight,
                "silent_s": round(silent_s, 1),
                "threshold_s": round(threshold, 1),
            },
            LOST_UNSAFE,
        )


def run(ctx: Context) -> None:
    cfg = ctx.cfg
    ready = [w for w in ctx.snap.serving if w.ready and not w.draining]
    model = _majority([w.model_version for w in ready])
    schema = _majority([w.kv_schema for w in ready])
    # Versions the group rolled away from (transitions carry model_version). A version
    # the group never ran is a canary, not stale: judge it by its SLO instead.
    history = [t.model_version for t in ctx.snap.transitions if t.model_version]
    older_models = set(history[:-1]) - set(history[-1:])
    _lost_workers(ctx)
    for w in ctx.snap.serving:
        win = w.window
        requests = int(win.get("requests") or 0)
        if w.ready and (w.model_version is None or w.kv_schema is None):
            _emit(
                ctx,
                w,
                "ready_before_loaded",
                CRITICAL,
                "reports ready before model and KV schema are loaded",
                {"ready": True},
                "readiness lies: traffic would hit an unloaded worker",
            )
        if w.draining and requests > 0:
            _emit(
                ctx,
                w,
                "drained_worker_traffic",
                MAJOR,
                f"took {requests} request(s) while draining",
                {"requests": requests},
            )
        if w.ready and not w.draining and _stale(w, ready, older_models):
            _emit(
                ctx,
                w,
                "stale_version",
                MAJOR,
                f"serves {w.model_version}/{w.kv_schema}, fleet serves {model}/{schema}",
                {"fleet_model_version": model, "fleet_kv_schema": schema},
                "stale model or KV schema must not rejoin traffic automatically",
            )
        if (win.get("duplicate_tokens") or 0) > 0:
            _emit(
                ctx,
                w,
                "duplicate_finish",
                MAJOR,
                f"{win['duplicate_tokens']} duplicated streamed token(s)",
                {"duplicate_tokens": win["duplicate_tokens"]},
                "duplicate output: replay is not idempotent",
            )
        if requests == 0:
            continue  # a quiet window is not a failure
        breach = _breach(ctx.snap.slo, win, requests)
        if breach:
            cause, evidence, unsafe = _likely_cause(ctx, w, model)
            _emit(
                ctx,
                w,
                "slo_breach",
                MAJOR,
                f"{'; '.join(breach)} — likely {cause}",
                {
                    "requests": requests,
                    "slo_met": win.get("slo_met"),
                    "slo": ctx.snap.slo.to_dict(),
                    "breached": breach,
                    "likely_cause": cause,
                    **evidence,
                    **{
                        k: win.get(k)
                        for k in (
                            "ttft_ms_p99",
                            "tpot_ms_p99",
                            "e2e_ms_p99",
                            "timeouts",
                            "oom",
                            "kv_used_pct",
                            "evictions",
                            "preempted",
                            "queued",
                        )
                    },
                },
                unsafe,
            )
        retries = int(win.get("retries") or 0)
        if retries >= cfg.serving_retry_min and retries / requests > cfg.serving_retry_ratio:
            _emit(
                ctx,
                w,
                "retry_storm",
                CRITICAL,
                f"{retries} retries for {requests} requests",
                {"retries": retries, "requests": requests, "ratio_limit": cfg.serving_retry_ratio},
                "retry storm: retries duplicate work and side effects",
            )


# -- serving states (what a serving group is, instead of the training state machine's) ------
SERVING, DEGRADED, DOWN, INITIALIZING = "serving", "degraded", "down", "initializing"
SERVING_STATES = (INITIALIZING, SERVING, DEGRADED, DOWN)


def _silent(w: ServingWindow, now: datetime) -> bool:
    """Exited, or no window for longer than the worker's silence threshold."""
    return bool(w.window.get("exited")) or (now - w.ts).total_seconds() > silence_threshold_s(w)


def serving_state(
    windows: tuple[ServingWindow, ...] | list[ServingWindow], slo: ServingSlo, now: Any
) -> dict[str, Any]:
    """A serving group's state from its workers' newest windows at `now`.

    `initializing` until the first window; `down` when no worker is reporting, ready and
    not draining; `degraded` when a worker is not ready, draining, silent or breaches the
    SLO; otherwise `serving`. A quiet window (no requests) is not a breach.
    """
    total = len(windows)
    if total == 0:
        return {
            "state": INITIALIZING,
            "reason": "no serving window yet",
            "workers": 0,
            "ready": 0,
            "breaching": 0,
        }
    live = [w for w in windows if not _silent(w, now)]
    ready = [w for w in live if w.ready and not w.draining]
    breaching = sorted(w.worker for w in ready if _breach_of(slo, w.window))
    counts = {"workers": total, "ready": len(ready), "breaching": len(breaching)}
    if not ready:
        return {"state": DOWN, "reason": f"0 of {total} worker(s) ready and reporting", **counts}
    missing = total - len(ready)
    if breaching or missing:
        parts = []
        if missing:
            parts.append(f"{missing} of {total} worker(s) not ready or silent")
        if breaching:
            parts.append(f"{len(breaching)} breach the SLO ({', '.join(breaching)})")
        return {"state": DEGRADED, "reason": "; ".join(parts), **counts}
    return {"state": SERVING, "reason": f"{total} worker(s) ready within SLO", **counts}
