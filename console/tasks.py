"""Celery tasks of the console: diagnosis, the sweep, recovery costs. Thin wrappers.

Stable explicit names; idempotent (a redelivered task re-diagnoses and converges on the same
incidents because the database allows one open incident per fingerprint). Nothing imports
this module but Celery's autodiscovery: enqueue through console.scheduling by name.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from celery import Task, shared_task
from django.conf import settings
from django.core.cache import cache
from django.db import OperationalError
from django.utils import timezone

from console import actions, locks, pipeline, scheduling

log = logging.getLogger(__name__)
# Urgent retries beyond the idle-transaction timeout, for the stuck holder's rollback.
URGENT_RETRY_MARGIN = 10


@shared_task(
    bind=True,
    name=scheduling.DIAGNOSE_GROUP,
    acks_late=True,
    max_retries=None,
    default_retry_delay=1,
)
def diagnose_group(self: Task, group: str, lane: str = "", node: str = "") -> None:
    """`lane`: scheduling.URGENT for a run on the urgent lane (its own debounce key): the
    run judges the nodes that reported an urgent event (`node`, and any other of the group's
    in the last minute), not the whole group (pipeline.diagnose_urgent). An ordinary pass
    queues the check its verdicts next depend on (check_group).

    An urgent run that found its rows held by a pass (console.locks) retries every second
    until Postgres has ended a stuck holder's transaction (FAULTLINE_DB_IDLE_IN_TRANSACTION_S)
    and a little beyond: each try waits half a second at most, so a stuck pass delays the
    Xid by its own lifetime at worst, never the lane behind it."""
    urgent = lane == scheduling.URGENT
    _clear(scheduling.urgent_key(group) if urgent else scheduling.pending_key(group))
    if not urgent:
        _diagnose(group)
        return
    try:
        pipeline.diagnose_urgent(group_name=group, node=node or None, now=timezone.now())
    except OperationalError as exc:
        if not locks.held_elsewhere(exc):
            raise
        tries = settings.DB_IDLE_IN_TRANSACTION_S + URGENT_RETRY_MARGIN
        if self.request.retries >= tries:
            log.warning(
                "urgent lane: %s still held after %d tries; the sweep judges it", group, tries
            )
            return
        raise self.retry(countdown=1, max_retries=tries) from exc


@shared_task(name=scheduling.DIAGNOSE_GROUPS, acks_late=True)
def diagnose_groups(groups: list[str]) -> list[float]:
    """The sweep's runs, many groups to a message (scheduling.schedule_sweep): each the
    ordinary run diagnose_group makes, in order; one group's failure is logged and the
    rest still run. Returns each pass's seconds (faultline.metrics counts them as passes)."""
    took: list[float] = []
    for group in groups:
        started = time.perf_counter()
        _clear(scheduling.pending_key(group))
        try:
            _diagnose(group)
        except Exception:
            log.exception("diagnose_groups: the pass of %s failed", group)
            continue
        took.append(time.perf_counter() - started)
    return took


def _clear(key: str) -> None:
    """The run started: a batch from now on schedules the next one."""
    try:
        cache.delete(key)
    except Exception:  # a stale debounce key only delays the next run
        log.warning("diagnose_group: could not clear debounce key", exc_info=True)


@shared_task(name=scheduling.CHECK_GROUP, acks_late=True, max_retries=3, default_retry_delay=1)
def check_group(group: str, at: float) -> bool:
    """The pass scheduling.schedule_check queued for deadline `at` (epoch s): run only if
    the deadline still holds (no later pass moved it). True: it ran (counted as a pass,
    faultline.metrics)."""
    if not scheduling.check_still_due(group, at):
        return False
    _diagnose(group)
    return True


def _diagnose(group: str) -> None:
    try:
        due = pipeline.diagnose(group_name=group, now=timezone.now())
    except OperationalError as exc:
        if not locks.held_elsewhere(exc):
            raise
        # Another pass (or a transaction stuck holding the group's rows) kept them past
        # FAULTLINE_DB_LOCK_TIMEOUT_MS: the next batch or sweep runs the group again.
        log.warning(
            "diagnosis %s: its rows are held by another transaction; left to the next pass", group
        )
        return
    if due is not None and settings.DIAGNOSIS_CHECKS:
        scheduling.schedule_check(group, due)


@shared_task(name="console.measure_recovery_costs", acks_late=True, expires=60)
def measure_recovery_costs() -> None:
    """Resolved incidents' recovery costs, until final: apart from diagnosis, whose passes
    must not wait for accounting (pipeline.measure_recovery). It may wait in the queue
    behind diagnoses: on a saturated worker (16k ranks, bench/detect.py) a run queued for
    more than 10 s, and with a 10 s expiry one of ~48 ran. A late run is still worth
    running; a run that finds nothing due costs one query."""
    pipeline.measure_recovery(now=timezone.now())


@shared_task(name="console.sweep_nodes", acks_late=True, expires=5)
def sweep_nodes() -> None:
    """Fleet health's sweep: nodes whose agent went quiet are marked down (each opens its
    silent-node incident), node conditions that cleared resolve, node incidents go to the
    remediation policy (whether or not a group runs there), waiting actions are routed to
    an agent that can run them, and repaired nodes whose validation window passed are
    proposed back. Beat sends it to the housekeeping queue (console.scheduling.HOUSEKEEPING_QUEUE):
    in the one-second sweep on the default queue it waited behind diagnosis passes, and at
    16k ranks 16 of ~480 ran in 8 minutes, so a dead node's incident opened late. At rest
    it is seven queries (three before node incidents were planned here: ~5 ms at 2,048
    nodes, bench/sweep.py; the query count is tests/server/remediation/
    test_node_remediation.py's); a late run is dropped, the next second's covers it."""
    now = timezone.now()
    for name in pipeline.mark_silent_nodes(now=now):
        log.info("sweep: node %s stopped reporting", name)
    for name in actions.settle_conditions(now=now):
        log.info("sweep: a condition of node %s cleared", name)
    for action_id in actions.remediate_nodes(now=now):
        log.info("sweep: proposed action %s for a node incident", action_id)
    for action_id in actions.route_waiting(now=now):
        log.info("sweep: action %s routed to another agent", action_id)
    for action_id in actions.propose_returns(now=now):
        log.info("sweep: proposed action %s to return validated hardware", action_id)


@shared_task(name="console.sweep", acks_late=True, expires=5)
def sweep() -> None:
    """Silence emits no records: re-judge every recently active group (hang thresholds,
    stalls) with no new record. A job whose every rank blocks in a collective usually
    sends none (its loop is blocked; its agents send GPU samples), so this is what finds
    it: on the housekeeping queue, not behind other groups' passes. It only schedules
    (the diagnoses run on the default queue): one Redis round trip for every group's
    debounce claim and a message per SWEEP_CHUNK groups due (scheduling.schedule_sweep;
    a send per group took 1.6 s of each second at 2,048 jobs, bench/sweep.py)."""
    now = timezone.now()
    # Queue, don't run inline: workers diagnose groups in parallel, and the debounce key
    # keeps at most one pending diagnosis per group however often the sweep fires.
    scheduling.schedule_sweep(pipeline.groups_to_sweep(now=now, window=timedelta(minutes=30)))


@shared_task(
    name=scheduling.LATCH_ALERT_FAULTS, acks_late=True, max_retries=3, default_retry_delay=1
)
def latch_alert_faults(alert_ids: list[int] | None = None) -> int:
    """The Xid alerts a large Alertmanager delivery left to latch: those named, or (beat's
    run every 5 s) the oldest still waiting. Idempotent."""
    return actions.latch_alert_faults(alert_ids=alert_ids, now=timezone.now())
