"""The audit log is append-only at the database: UPDATE and DELETE raise.

Enforced by Postgres, not by the ORM, so neither a bug, a shell session nor a raw SQL
statement from the service role can rewrite history. (TRUNCATE stays possible for the
table owner: test databases are flushed that way.)
"""

from django.db import migrations

FORWARD = """
CREATE OR REPLACE FUNCTION console_auditlog_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'console_auditlog is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER console_auditlog_append_only
    BEFORE UPDATE OR DELETE ON console_auditlog
    FOR EACH ROW EXECUTE FUNCTION console_auditlog_append_only();
"""

BACKWARD = """
DROP TRIGGER IF EXISTS console_auditlog_append_only ON console_auditlog;
DROP FUNCTION IF EXISTS console_auditlog_append_only();
"""


class Migration(migrations.Migration):
    dependencies = [("console", "0003_remediation")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
