"""POST /api/v1/ingest: authenticate, bound, validate the whole batch, store, hand off.

A thin adapter: the contract lives in agents.protocol, storage in ingest.store, the
after-commit hand-off in console.live. No DRF serializer on this path (8x slower here).
"""

from __future__ import annotations

import logging
import zlib

from django.conf import settings
from django.db import DatabaseError, DataError, OperationalError
from django.http import HttpRequest, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from agents import protocol
from console import live, scheduling
from faultline import dbwrites, metrics
from ingest import ratelimit
from ingest.agent_actions import actions_for_node
from ingest.auth import (
    CredentialRevokedError,
    authenticate_cached,
    forget_credential,
    launcher_refusal,
)
from ingest.store import AgentNotOwnedError, RecordError, store

log = logging.getLogger(__name__)


def _error(status: int, message: str, **extra: object) -> JsonResponse:
    response = JsonResponse({"error": message, **extra}, status=status)
    if status in (429, 503):
        response["Retry-After"] = str(extra.get("retry_after", 5))
    return response


def _body(request: HttpRequest) -> bytes:
    raw = request.body
    if request.headers.get("Content-Encoding", "").lower() == "gzip":
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        data = inflater.decompress(raw, protocol.MAX_BATCH_BYTES + 1)
        if len(data) > protocol.MAX_BATCH_BYTES or inflater.unconsumed_tail:
            raise OverflowError
        return data
    return raw


def _unavailable(exc: OperationalError) -> JsonResponse:
    """503 for a database that cannot take the batch now; a full disk (or memory) is named,
    counted and given a longer Retry-After, since only an operator can clear it."""
    refused = dbwrites.refusal(exc)
    if refused is not None:
        reason, sqlstate = refused
        dbwrites.record(reason, sqlstate)
        log.error("ingest: the database refused the batch's writes: %s (%s)", reason, sqlstate)
        return _error(
            503,
            f"database refused writes ({reason}): nothing of the batch was stored; retry later",
            retry_after=dbwrites.RETRY_AFTER_S,
        )
    log.warning("ingest: database unavailable", exc_info=True)
    return _error(503, "database unavailable: retry later", retry_after=5)


@csrf_exempt
@require_POST
def ingest(request: HttpRequest) -> JsonResponse:
    try:
        # Cached: the store confirms in the batch's transaction that it is still live.
        credential = authenticate_cached(request.headers.get("Authorization", ""))
    except OperationalError as exc:
        return _unavailable(exc)
    if credential is None:
        return _error(401, "missing, unknown or revoked agent token")
    if ratelimit.known_over(credential.pk):
        return _error(429, "agent rate limit exceeded", retry_after=60)
    length = int(request.headers.get("Content-Length") or 0)
    if length > protocol.MAX_BATCH_BYTES:
        return _error(413, f"batch is {length} bytes; the limit is {protocol.MAX_BATCH_BYTES}")
    try:
        body = _body(request)
    except (OverflowError, zlib.error):
        return _error(413, "gzip body is invalid or inflates beyond the batch size limit")
    try:
        batch = protocol.decode_batch(body)
    except protocol.ContractError as exc:
        if ratelimit.over_limit(credential.pk):  # a refused batch still counts
            return _error(429, "agent rate limit exceeded", retry_after=60)
        return JsonResponse(exc.as_dict(), status=400)
    # Batches and records in one Redis round trip, once the record count is known.
    over = ratelimit.over_limits(credential.pk, len(batch.records))
    if over is not None:
        return _error(429, f"agent {over} rate limit exceeded", retry_after=60)
    if batch.agent.node != credential.node.name:
        return _error(
            403,
            f"this token belongs to node {credential.node.name!r}, "
            f"the batch names {batch.agent.node!r}",
        )
    refused = launcher_refusal(credential, batch.records)
    if refused is not None:
        return _error(403, refused)
    try:
        result = store(
            node=credential.node,
            batch=batch,
            now=timezone.now(),
            max_future_s=settings.INGEST_MAX_FUTURE_S,
            want_card=live.push_due(credential.node.name),
            launcher_group=credential.launcher_group,
            credential_id=credential.pk,
        )
    except CredentialRevokedError:
        forget_credential(credential.token_hash)
        return _error(401, "missing, unknown or revoked agent token")
    except AgentNotOwnedError as exc:
        return _error(403, str(exc))
    except RecordError as exc:
        return JsonResponse(exc.as_dict(), status=400)
    except DataError as exc:
        # A number the contract allows but a live-state column cannot hold: the agent's
        # fault, so 400 (a retry would fail the same way), and nothing was stored.
        return _error(400, f"batch: a value is out of range for storage ({exc})")
    except OperationalError as exc:
        return _unavailable(exc)
    except DatabaseError:
        log.exception("ingest: batch rejected by the database")
        return _error(503, "batch could not be stored: retry later", retry_after=5)
    if not result.duplicate:
        scheduling.mark_young(result.new_groups, node=credential.node.name)  # before scheduling
        metrics.INGEST_RECORDS.inc(len(batch.records))
        live.after_ingest(
            groups=result.groups,
            nodes=result.nodes,
            urgent=result.device_events > 0,
            card=result.card,
        )
    return JsonResponse(
        {
            "ack_seq": result.ack_seq,
            "duplicate": result.duplicate,
            # Cheap (read with the receipt): how an agent finds batches a failover lost.
            "high_water": result.receipts.high_water,
            "gaps": result.receipts.gaps,
            "actions": actions_for_node(credential) if result.actions_pending else [],
        },
        status=202,
    )
