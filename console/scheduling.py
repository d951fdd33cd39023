"""Enqueue Celery tasks by their stable names, so no module imports a tasks module.

Owns the names of the tasks the console enqueues, the one call that sends them
(`current_app.send_task`; console.apps binds Faultline's Celery app, broker REDIS_URL)
and the per-group debounce of diagnosis, which keeps established groups ahead of young
ones (created in the last DIAGNOSIS_YOUNG_GROUP_S: an optional longer debounce and a
budget a second per node that created them, so one node's flood of invented groups
spends only its own budget and queues behind real jobs, young or old, never in front of
them; the sweep's runs of young groups have a budget of their own, so a node's idle
young groups cannot starve its newest job's batches; docs/security.md). An established
group's urgent diagnosis (a batch with a device event) also goes, without countdown, to
a queue of its own that a worker process of its own drains (URGENT_QUEUE; `faultline up`
and docker-compose run it), so a saturated ordinary worker's backlog, which it holds in
memory in countdown order, cannot sit in front of it. Only Celery's autodiscovery
imports `console.tasks`, `console.notify_tasks` and `ingest.tasks`. It must not decide
*what* to run: callers do, on commit. Scheduling a diagnosis never raises (the sweep
catches up).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from datetime import datetime
from typing import Any, Final

import redis
from celery import current_app
from django.conf import settings
from django.core.cache import cache
from django.db import transaction

log = logging.getLogger(__name__)

DIAGNOSE_GROUP: Final = "console.diagnose_group"
# A pass at the moment a verdict may change with no new record (schedule_check).
CHECK_GROUP: Final = "console.check_group"
# The sweep's runs, many groups to a message (schedule_sweep).
DIAGNOSE_GROUPS: Final = "console.diagnose_groups"
# Groups a sweep message carries at most: fewer messages (each ~0.6 ms to publish)...
SWEEP_CHUNK = 64
# ...yet at least this many messages (or one a group): every worker process of the
# ordinary queue gets some, so a few large groups are not judged one after another on one
# process while the others idle.
SWEEP_MESSAGES = 8
SEND_NOTIFICATION: Final = "console.send_notification"
# The urgent lane: established groups' device events. Its own worker consumes this queue
# alone; the ordinary worker never this one.
URGENT_QUEUE: Final = "diagnose-urgent"
URGENT: Final = "urgent"  # the task's lane argument: which debounce key it clears
# A deadline further ahead than this is left to later passes (the sweep's, every second,
# at least): a silent rank's comes closer with each, while a healthy group's oldest rank
# stays a threshold ahead (3 steps). So groups with long steps queue no check that their
# next step would void, and none is held in a worker's memory for long.
CHECK_HORIZON_S = 10.0
_CHECK_SAME_S = 0.001  # two deadlines this close are the same one
# Beat's sweeps (faultline.celery.BEAT_SCHEDULE: pages scheduled, silent nodes marked
# down, quiet groups re-judged, step bins rolled) go to a queue a worker of its own drains
# (`worker-housekeeping`, one process). On the default queue they waited behind diagnosis
# passes past their expiry: with a 16k-rank group 16 of ~480 sweeps and one escalation
# sweep in ~40 ran (bench/detect.py --ranks 16384), so a page could wait minutes. Shared
# with the lane's worker, the group sweep's send per group (~0.3 s a second for 256 jobs,
# bench/sweep.py) would have cost device events time, and the ordinary worker, draining it
# too, took sweeps it then held behind its passes.
HOUSEKEEPING_QUEUE: Final = "housekeeping"
# Pages and their resolves (console.send_notification) go to a queue a worker of its own
# drains (`worker-notify`, threads: a send waits on a remote endpoint up to 10 s and
# uses no CPU). On the default queue a page waited behind diagnosis passes: with the
# ordinary worker saturated (a 16k-rank group's passes back to back) or stuck, the
# incident opened in a second and its page went out when the passes let it. Not the
# housekeeping queue: a slow endpoint would hold the sweeps that notice silence.
NOTIFY_QUEUE: Final = "notify"
# An urgent run this late is no longer urgent (the ordinary lane has run since): a lane
# worker that was down must not start with a backlog of them.
URGENT_EXPIRES_S = 60

PENDING_TIMEOUT_S = 5

# Per process: when this process last queued each group's diagnosis. A batch within the
# debounce countdown of that is covered by the queued run (which starts no earlier than the
# countdown, and reads the database then), so it skips even the Redis round trip.
_queued_at: dict[str, float] = {}
# Per process: when a batch last found another's diagnosis of the group pending (queued,
# not started: it reads the database after that batch committed). Ordinary batches within
# the debounce window after that skip the Redis round trips; urgent ones still check.
_covered_at: dict[str, float] = {}


def enqueue(
    name: str,
    *args: Any,
    countdown: float | None = None,
    queue: str | None = None,
    expires: float | None = None,
) -> None:
    """Send task `name` with JSON `args` (to `queue`, else Celery's default); raises only
    what the broker raised."""
    options: dict[str, Any] = {"countdown": countdown}
    if queue is not None:
        options.update(queue=queue, expires=expires)
    current_app.send_task(name, args=list(args), **options)


# Xid alerts of a large Alertmanager delivery latched after it (console.actions.alertmanager);
# on the urgent lane: a GPU fault is what that lane exists for. Never expires.
LATCH_ALERT_FAULTS: Final = "console.latch_alert_faults"
ALERT_LATCH_CHUNK = 64


def schedule_alert_latches(alert_ids: list[int]) -> None:
    """Queue the latching of these alerts once the delivery commits, in chunks. Never
    raises: with the broker away, beat's run of the same task (every 5 s) finds them."""

    def send() -> None:
        try:
            for i in range(0, len(alert_ids), ALERT_LATCH_CHUNK):
                chunk = alert_ids[i : i + ALERT_LATCH_CHUNK]
                enqueue(LATCH_ALERT_FAULTS, chunk, queue=URGENT_QUEUE)
        except Exception:
            log.warning("alert latches not queued; beat's sweep will find them", exc_info=True)

    transaction.on_commit(send)


def send_notification(incident_id: int, key: str, channel: str, event: str) -> None:
    """A page never expires: late, it is still a page (the delivery row dedups it)."""
    enqueue(SEND_NOTIFICATION, incident_id, key, channel, event, queue=NOTIFY_QUEUE)


def pending_key(group: str) -> str:
    return f"diag-pending:{group}"


def urgent_key(group: str) -> str:
    return f"diag-urgent:{group}"


def young_key(group: str) -> str:
    return f"diag-young:{group}"


def mark_young(groups: list[str], *, node: str) -> None:
    """Ingest created these groups from `node`'s batch: for a while they wait behind
    established ones, on `node`'s young-diagnosis budget."""
    if not groups or settings.DIAGNOSIS_YOUNG_GROUP_S <= 0:
        return
    try:
        cache.set_many(
            dict.fromkeys(map(young_key, groups), node), settings.DIAGNOSIS_YOUNG_GROUP_S
        )
    except Exception:  # Redis down: they are diagnosed like any group
        log.warning("scheduling: could not mark %d new groups", len(groups), exc_info=True)


def _budget_spent(kind: str, node: str, limit: int) -> bool:
    """Count one diagnosis in this second's `kind` budget of `node`. Per node, not
    fleet-wide: a shared budget let one token's flood of invented groups spend it every
    second, leaving a real new job's first Xid to the sweep (seconds)."""
    key = f"diag-{kind}-budget:{node}:{int(time.time())}"
    cache.add(key, 0, timeout=5)
    return int(cache.incr(key)) > limit


def _young_budget_spent(creator: str, *, sweep: bool = False) -> bool:
    """Count one young group's diagnosis in the budget of the node that created it. The
    sweep's runs (silence: no new records) spend a budget of their own, half as large:
    sharing one let a node's idle young groups, swept every second, spend all of it at the
    top of each second, so its newest job's batches were never diagnosed (a drill's 20th
    job on one node: its fault not named in 25 s)."""
    if sweep:
        return _budget_spent("young-sweep", creator, max(1, settings.DIAGNOSIS_YOUNG_PER_S // 2))
    return _budget_spent("young", creator, settings.DIAGNOSIS_YOUNG_PER_S)


_client: tuple[int, redis.Redis] | None = None
_client_lock = threading.Lock()


def _redis() -> redis.Redis:
    """One client per process (gunicorn forks after import): Django's cache builds a
    client per call, which cost more than the round trip on ingest's hot path."""
    global _client
    with _client_lock:
        if _client is None or _client[0] != os.getpid():
            client = redis.Redis.from_url(
                settings.REDIS_URL, socket_timeout=1, socket_connect_timeout=1
            )
            _client = (os.getpid(), client)
        return _client[1]


def _young_and_claim(group: str, timeout_s: int) -> tuple[bool, bool]:
    """In one round trip: is the group young, and did this call set its pending key (the
    same keys as `cache.get(young_key)` and `cache.add(pending_key)`, so the task's
    `cache.delete` still clears it)."""
    return _young_and_claim_many([group], timeout_s)[0]


def _young_and_claim_many(groups: list[str], timeout_s: int) -> list[tuple[bool, bool]]:
    """`_young_and_claim` for every group, still in one round trip (the sweep's)."""
    pipe = _redis().pipeline(transaction=False)
    for group in groups:
        pipe.get(cache.make_key(young_key(group)))
        pipe.set(cache.make_key(pending_key(group)), 1, nx=True, ex=timeout_s)
    replies = pipe.execute()
    return [(replies[i] is not None, bool(replies[i + 1])) for i in range(0, len(replies), 2)]


def _schedule_urgent(group: str, node: str | None) -> None:
    """An established group's device event: one run on the urgent lane, at once, unless
    one is queued there and not started (it reads the database after this batch). Young
    groups stay on the ordinary lane and their creator's budget (a flood's invented groups
    must not reach this lane), and `node`'s urgent budget bounds one token's share of it
    (its own established groups' invented device events); over it, the ordinary lane."""
    pipe = _redis().pipeline(transaction=False)
    pipe.get(cache.make_key(young_key(group)))
    pipe.set(cache.make_key(urgent_key(group)), 1, nx=True, ex=PENDING_TIMEOUT_S)
    young, claimed = pipe.execute()
    if not claimed:
        return
    if young is not None or (
        node and _budget_spent("urgent", node, settings.DIAGNOSIS_URGENT_PER_S)
    ):
        cache.delete(urgent_key(group))
        return
    enqueue(DIAGNOSE_GROUP, group, URGENT, node or "", queue=URGENT_QUEUE, expires=URGENT_EXPIRES_S)


def schedule_diagnosis(group: str, *, urgent: bool = False, node: str | None = None) -> None:
    """Debounce: at most one pending diagnosis per group per debounce window; a young
    group's spends its creator node's budget (over it: the next batch or the sweep,
    within a second, comes back through here; the sweep's runs: schedule_sweep).
    Not `urgent` (no device event), a batch within the debounce window of finding a run
    pending skips even the check (ingest's hot path: two Redis round trips a batch
    otherwise). `urgent` (a device event reported by `node`) an established group also
    gets a run on the urgent lane; the ordinary one is scheduled as always (it covers
    what arrives after the urgent run read, and a lane worker that is down)."""
    if urgent and settings.DIAGNOSIS_URGENT_LANE:
        try:
            _schedule_urgent(group, node)
        except Exception:  # broker down: the ordinary lane and the sweep catch up
            log.warning("scheduling: no urgent diagnosis of %s", group, exc_info=True)
    delay_ms = settings.DIAGNOSIS_DEBOUNCE_MS
    now = time.monotonic()
    if now - _queued_at.get(group, -1e9) < delay_ms / 1000:
        return
    if not urgent and now - _covered_at.get(group, -1e9) < delay_ms / 1000:
        return
    try:
        # The task deletes this key when it starts, so a batch arriving during a run
        # schedules the next one; the timeout only guards against a lost task (a worker
        # killed holding it). Keep it short: the sweep also goes through this key, so a
        # lost task silences the group's diagnosis until the key expires (30 s measured
        # with 30; docs/reliability.md). A too-early expiry only costs one extra run.
        young, claimed = _young_and_claim(group, PENDING_TIMEOUT_S + delay_ms // 1000)
        if not claimed:
            _covered_at[group] = now
            return
        _queue_claimed(group, young=young, now=now, sweep=False)
    except Exception:  # broker down: the sweep catches up
        log.warning("scheduling: could not schedule diagnosis of %s", group, exc_info=True)


def _queue_claimed(group: str, *, young: bool, now: float, sweep: bool) -> None:
    """Queue one run of `group`, whose pending key this process just set."""
    delay_ms = settings.DIAGNOSIS_DEBOUNCE_MS
    if young:
        delay_ms = max(delay_ms, settings.DIAGNOSIS_YOUNG_DEBOUNCE_MS)
        # The longer countdown: as long a guard as before.
        cache.touch(pending_key(group), PENDING_TIMEOUT_S + delay_ms // 1000)
        # Who created it is read only when a run is due (once per window, not per batch).
        if _young_budget_spent(str(cache.get(young_key(group))), sweep=sweep):
            # Release the debounce key: holding it (until its timeout, 5 s) left a young
            # group over budget undiagnosed for seconds after the budget came back.
            cache.delete(pending_key(group))
            _queued_at[group] = now
            return
    enqueue(DIAGNOSE_GROUP, group, countdown=delay_ms / 1000)
    _queued_at[group] = now


def schedule_sweep(groups: list[str]) -> int:
    """The sweep's runs, for many groups at once: every debounce claim in one Redis round
    trip, and the established groups' runs up to SWEEP_CHUNK to a message
    (DIAGNOSE_GROUPS), in at least SWEEP_MESSAGES messages. A message and a round trip
    a group cost ~0.8 ms each: at 2,048 small jobs a sweep took 1.6 s of its one-second
    period (bench/sweep.py). Young groups keep the per-group path (their budget, their
    longer countdown). Returns how many established groups' runs it queued."""
    delay_ms = settings.DIAGNOSIS_DEBOUNCE_MS
    now = time.monotonic()
    window = delay_ms / 1000
    due = [
        g
        for g in groups
        if now - _queued_at.get(g, -1e9) >= window and now - _covered_at.get(g, -1e9) >= window
    ]
    if not due:
        return 0
    try:
        claims = _young_and_claim_many(due, PENDING_TIMEOUT_S + delay_ms // 1000)
    except Exception:  # broker down: the next tick tries again
        log.warning("scheduling: sweep of %d groups not scheduled", len(due), exc_info=True)
        return 0
    established: list[str] = []
    for g, (young, claimed) in zip(due, claims, strict=True):
        if not claimed:
            _covered_at[g] = now
        elif not young:
            established.append(g)
        else:
            try:
                _queue_claimed(g, young=True, now=now, sweep=True)
            except Exception:
                log.warning("scheduling: could not schedule diagnosis of %s", g, exc_info=True)
    queued = 0
    size = max(1, min(SWEEP_CHUNK, -(-len(established) // SWEEP_MESSAGES)))
    for i in range(0, len(established), size):
        chunk = established[i : i + size]
        try:
            enqueue(DIAGNOSE_GROUPS, chunk, countdown=window)
        except Exception:  # broker down: release the claims, the next tick tries again
            log.warning("scheduling: could not schedule %d groups' runs", len(chunk), exc_info=True)
            with contextlib.suppress(Exception):
                cache.delete_many([pending_key(g) for g in chunk])
            continue
        for g in chunk:
            _queued_at[g] = now
        queued += len(chunk)
    return queued


def check_key(group: str) -> str:
    return f"diag-check:{group}"


def check_queued_key(group: str) -> str:
    return f"diag-check-queued:{group}"


def schedule_check(group: str, at: datetime) -> None:
    """A pass just found that a verdict of `group` may change at `at` with no new record (a
    rank's hang threshold: Diagnosis.next_check): queue one pass for then, on the ordinary
    lane. Without it a silent rank is judged at the first sweep tick after its threshold,
    plus the debounce and any pass in front: at 16k ranks up to 2 s more (bench/detect.py).

    Only a deadline that two passes in a row computed is queued: in a healthy stepping
    group it moves forward every step (its oldest rank stepped), and queueing each one
    would send a message a pass for a check that always finds the deadline moved. The
    stable one is the silent rank's. One queued check per group and deadline; the sweep
    stays the safety net (a lost message costs at most its tick). Ordinary lane: the
    process that holds the group's live state (console.snapshots) runs it."""
    due = at.timestamp()
    delay = due - time.time()
    if delay > CHECK_HORIZON_S:
        return
    try:
        r = _redis()
        ttl = int(max(delay, 0.0)) + PENDING_TIMEOUT_S + 1
        pipe = r.pipeline(transaction=False)
        pipe.set(cache.make_key(check_key(group)), repr(due), ex=ttl, get=True)
        pipe.get(cache.make_key(check_queued_key(group)))
        previous, queued = pipe.execute()
        if previous is None or abs(float(previous) - due) > _CHECK_SAME_S:
            return  # not stable yet
        if queued is not None and abs(float(queued) - due) <= _CHECK_SAME_S:
            return  # already queued for this deadline
        r.set(cache.make_key(check_queued_key(group)), repr(due), ex=ttl)
        enqueue(CHECK_GROUP, group, due, countdown=max(delay, 0.0))
    except Exception:  # broker down: the sweep judges it at its next tick
        log.warning("scheduling: no deadline check of %s", group, exc_info=True)


def check_still_due(group: str, at: float) -> bool:
    """The queued check for deadline `at` is starting: run its pass only if it is still
    the group's queued check and no later pass moved the deadline past it (the rank
    stepped after all, or was judged, and the next deadline is another's)."""
    try:
        r = _redis()
        queued_key = cache.make_key(check_queued_key(group))
        pipe = r.pipeline(transaction=False)
        pipe.get(queued_key)
        pipe.get(cache.make_key(check_key(group)))
        queued, latest = pipe.execute()
        if queued is None or abs(float(queued) - at) > _CHECK_SAME_S:
            return False  # superseded by a sooner deadline's check
        r.delete(queued_key)
    except Exception:  # Redis down: a pass too many is harmless
        log.warning("scheduling: deadline check of %s unverified", group, exc_info=True)
        return True
    return latest is None or float(latest) <= at + _CHECK_SAME_S


def forget_recent() -> None:
    """Drop this process's memory of queued diagnoses (tests)."""
    _queued_at.clear()
    _covered_at.clear()
