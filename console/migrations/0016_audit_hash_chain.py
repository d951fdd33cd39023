"""The audit log's hash chain: `prev_hash` and `hash` on every row, existing rows chained
in id order (console.auditchain).

The backfill updates rows the append-only trigger protects, so it disables that one trigger
for its own statements (the migration runs as the table's owner, in one transaction: no
other session ever sees the table without it).
"""

from typing import Any

from django.db import migrations, models

from console.auditchain import GENESIS, row_hash

PAGE = 5000


def backfill(apps: Any, schema_editor: Any) -> None:
    with schema_editor.connection.cursor() as cur:
        cur.execute("ALTER TABLE console_auditlog DISABLE TRIGGER console_auditlog_append_only")
        prev, last = GENESIS, 0
        while True:
            cur.execute(
                "SELECT id, ts, actor, verb, object_type, object_id, reason, data::text "
                "FROM console_auditlog WHERE id > %s ORDER BY id LIMIT %s",
                [last, PAGE],
            )
            page = cur.fetchall()
            if not page:
                break
            updates = []
            for row_id, ts, actor, verb, otype, oid, reason, data_text in page:
                digest = row_hash(
                    prev, ts=ts, actor=actor, verb=verb, object_type=otype, object_id=oid,
                    reason=reason, data_text=data_text,
                )  # fmt: skip
                updates.append((prev, digest, row_id))
                prev = digest
            cur.executemany(
                "UPDATE console_auditlog SET prev_hash = %s, hash = %s WHERE id = %s", updates
            )
            last = page[-1][0]
        cur.execute("ALTER TABLE console_auditlog ENABLE TRIGGER console_auditlog_append_only")


class Migration(migrations.Migration):
    dependencies = [("console", "0015_sso_identity")]

    operations = [
        migrations.AddField(
            model_name="auditlog",
            name="prev_hash",
            field=models.CharField(blank=True, db_default="", max_length=64),
        ),
        migrations.AddField(
            model_name="auditlog",
            name="hash",
            field=models.CharField(blank=True, db_default="", max_length=64),
        ),
        # Backwards: the columns go with the AddFields' reversal; nothing to undo here.
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
