"""SSO accounts keyed by (issuer, sub) instead of the username claim.

Existing `sso:` accounts are linked to the identity that created them, read from their
first `sso_login` audit row (it records issuer and sub). An account no identity created
(or whose identity created an earlier account) stays unlinked: it can no longer sign in
through SSO, which is what a second account for one person must not do.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def link_existing(apps, schema_editor):
    User = apps.get_model(*settings.AUTH_USER_MODEL.split("."))
    AuditLog = apps.get_model("console", "AuditLog")
    SsoIdentity = apps.get_model("console", "SsoIdentity")
    users = {u.username: u for u in User.objects.filter(username__startswith="sso:")}
    linked = set()
    rows = AuditLog.objects.filter(verb="sso_login", actor__in=list(users)).order_by("ts", "id")
    first = {}
    for row in rows.iterator():
        first.setdefault(row.actor, row)  # the sign-in that created (or first used) it
    for name, row in sorted(first.items(), key=lambda kv: (kv[1].ts, kv[1].id)):
        data = row.data or {}
        issuer, sub = str(data.get("issuer") or "")[:255], str(data.get("sub") or "")[:255]
        if not sub or (issuer, sub) in linked or data.get("created") is False:
            continue
        linked.add((issuer, sub))
        SsoIdentity.objects.create(issuer=issuer, subject=sub, user=users[name], created_at=row.ts)


class Migration(migrations.Migration):
    dependencies = [
        ("console", "0014_group_ownership"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="SsoIdentity",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("issuer", models.CharField(max_length=255)),
                ("subject", models.CharField(max_length=255)),
                ("created_at", models.DateTimeField()),
                (
                    "user",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="sso_identity",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(fields=("issuer", "subject"), name="sso_identity_once")
                ],
            },
        ),
        # Reverse: the table goes with the model; nothing else was changed.
        migrations.RunPython(link_existing, migrations.RunPython.noop),
    ]
