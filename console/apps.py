from __future__ import annotations

from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "console"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Bind shared tasks to Faultline's Celery app (broker = REDIS_URL) in every process
        # that loads Django, not only in the worker.
        import faultline.celery  # noqa: F401
