"""`faultline manage api_token create|revoke USER`: user API tokens, shown once."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from console.actions import issue_api_token, revoke_api_tokens


class Command(BaseCommand):
    help = "Create (printed once; only its hash is stored) or revoke a user's API tokens."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["create", "revoke"])
        parser.add_argument("username")
        parser.add_argument("--name", default="", help="what the token is for")
        parser.add_argument("--prefix", default="", help="revoke only the token with this prefix")

    def handle(self, *args: Any, **options: Any) -> None:
        username = options["username"]
        if not get_user_model().objects.filter(username=username).exists():
            raise CommandError(f"no user named {username!r}: create one with `faultline user`")
        now = timezone.now()
        if options["action"] == "create":
            token = issue_api_token(username=username, name=options["name"], actor="cli", now=now)
            self.stdout.write(f"API token for {username} (shown once; store it now):\n{token}")
        else:
            count = revoke_api_tokens(
                username=username, actor="cli", now=now, prefix=options["prefix"]
            )
            self.stdout.write(f"revoked {count} token(s) of {username}")
