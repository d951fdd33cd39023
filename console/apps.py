"""The console app's startup: Celery binding and the operator's Xid catalog overrides."""

from __future__ import annotations

from django.apps import AppConfig
from django.conf import settings


def apply_xid_overrides() -> None:
    """Install FAULTLINE_XID_OVERRIDES (settings.XID_OVERRIDES_FILE) as this process's Xid
    catalog, or the stock one when unset. Ingest and diagnosis read it from agents/xid.py.
    A bad file stops startup with a message naming the file, the code and the key."""
    from agents import xid

    path = getattr(settings, "XID_OVERRIDES_FILE", None)
    xid.install(xid.load_overrides(path) if path else xid.CATALOG)


def check_objectives() -> None:
    """Validate FAULTLINE_OBJECTIVES (pool defaults of the recovery objectives) so
    a typo stops startup instead of failing the first diagnosis."""
    from console.policy.objectives import pool_defaults

    pool_defaults(getattr(settings, "FAULTLINE_OBJECTIVES", None))


def close_sockets_on_logout(sender: object, request: object, **kwargs: object) -> None:
    """A logout closes the websockets that session opened (console.consumers)."""
    from console import events

    key = getattr(getattr(request, "session", None), "session_key", None)
    if key:
        events.end_session(key)


class ConsoleConfig(AppConfig):
    name = "console"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Bind shared tasks to Faultline's Celery app (broker = REDIS_URL) in every process
        # that loads Django, not only in the worker.
        import faultline.celery  # noqa: F401

        apply_xid_overrides()
        check_objectives()
        from django.contrib.auth.signals import user_logged_out

        user_logged_out.connect(close_sockets_on_logout, dispatch_uid="faultline-ws-logout")
