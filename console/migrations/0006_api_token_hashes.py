"""User API tokens as SHA-256 hashes; existing DRF tokens are moved over.

DRF's `authtoken_token` kept each token in clear and the admin listed it. Forward: every
row there is copied as its hash (same user, same token keeps working) and the clear rows
are deleted. Backward: only the new table is dropped; the clear tokens cannot be recovered
from their hashes, so users issue new ones (`faultline manage api_token create USER`).
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

MOVE = """
INSERT INTO console_apitoken (user_id, name, key_hash, prefix, created_at)
SELECT user_id, 'migrated from authtoken', encode(sha256(convert_to(key, 'UTF8')), 'hex'),
       left(key, 8), created
FROM authtoken_token
ON CONFLICT (key_hash) DO NOTHING;
DELETE FROM authtoken_token;
"""


def hash_drf_tokens(apps, schema_editor):  # type: ignore[no-untyped-def]  # Django migration signature
    connection = schema_editor.connection
    if "authtoken_token" in connection.introspection.table_names():
        with connection.cursor() as cursor:
            cursor.execute(MOVE)


class Migration(migrations.Migration):
    dependencies = [
        ("console", "0005_group_slo"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="ApiToken",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("name", models.CharField(blank=True, default="", max_length=64)),
                ("key_hash", models.CharField(max_length=64, unique=True)),
                ("prefix", models.CharField(max_length=8)),
                ("created_at", models.DateTimeField()),
                ("last_used_at", models.DateTimeField(blank=True, null=True)),
                (
                    "user",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
        ),
        # Reverse is a no-op by necessity: a hash does not give the token back.
        migrations.RunPython(hash_drf_tokens, migrations.RunPython.noop),
    ]
