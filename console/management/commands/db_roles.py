"""`manage.py db_roles`: grant the service's runtime role after migrations (faultline.dbroles)."""

from __future__ import annotations

import os
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections, transaction

from faultline.dbroles import APP_ROLE, RoleError, grant_app_role


class Command(BaseCommand):
    help = (
        "Create or fix the runtime role (SELECT/INSERT only on the audit log, DML elsewhere). "
        "Run as the schema owner after every migrate."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        default = "owner" if "owner" in settings.DATABASES else "default"
        parser.add_argument("--database", default=default, help=f"alias (default: {default})")
        parser.add_argument("--role", default=APP_ROLE)
        parser.add_argument(
            "--password-env",
            default="FAULTLINE_APP_DB_PASSWORD",
            help="environment variable holding the role's password (unset: keep it)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        password = os.environ.get(options["password_env"]) or None
        connection = connections[options["database"]]
        try:
            with transaction.atomic(using=options["database"]):
                owner = grant_app_role(connection, role=options["role"], password=password)
        except RoleError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(
            f"{options['role']}: SELECT/INSERT on the audit log, DML elsewhere; "
            f"{owner} owns the audit log"
        )
