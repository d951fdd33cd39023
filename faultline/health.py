"""/healthz (the process serves) and /readyz (database, its writes, broker, migrations): no
secrets."""

from __future__ import annotations

from django.core.cache import cache
from django.db import DatabaseError, connection
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpRequest, JsonResponse

from faultline import dbwrites


def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


def _database_reachable() -> bool:
    """One direct connection with a 2 s timeout. Asked first, the connection pool would wait
    its full 10 s while Postgres is down, far past any probe's timeout."""
    import psycopg

    try:
        with psycopg.connect(**{**connection.get_connection_params(), "connect_timeout": 2}):
            return True
    except psycopg.Error:
        return False


# The number of applied migrations at which this process last found no plan left. Building the
# migration graph cost 13-30 s per probe on a loaded box (a probe's timeout is seconds), and
# in a running service the answer changes only when someone migrates: then the count moves.
_migrated_at: int | None = None


def _migrations_applied() -> bool:
    global _migrated_at
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM django_migrations")
        applied = cursor.fetchone()[0]
    if applied == _migrated_at:
        return True
    executor = MigrationExecutor(connection)
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    _migrated_at = None if plan else applied
    return not plan


def readyz(request: HttpRequest) -> JsonResponse:
    checks: dict[str, bool] = {}
    try:
        if not _database_reachable():
            raise DatabaseError("database unreachable")
        checks["database"] = True
        checks["migrations"] = _migrations_applied()
    except DatabaseError:
        checks["database"] = False
        checks["migrations"] = False
    reasons: dict[str, str] = {}
    try:
        cache.set("readyz", "1", timeout=5)
        checks["broker"] = cache.get("readyz") == "1"
        # Reachable is not writable: a full volume still answers SELECT 1. The writers
        # remember their last refusal (faultline.dbwrites); a probe write here would need
        # a page Postgres has not got yet to fail, which no tiny probe reliably needs.
        refused = dbwrites.recent()
        checks["database_writes"] = refused is None
        if refused is not None:
            reasons["database_writes"] = (
                f"writes refused: {refused['reason']} (SQLSTATE {refused['sqlstate']}), "
                f"last {refused['seconds_ago']:.0f}s ago"
            )
    except Exception:  # noqa: BLE001 - any broker failure means not ready
        checks["broker"] = False
    ready = all(checks.values())
    body: dict[str, object] = {"ready": ready, "checks": checks}
    if reasons:
        body["reasons"] = reasons
    return JsonResponse(body, status=200 if ready else 503)
