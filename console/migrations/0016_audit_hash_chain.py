"""The audit log's hash chain, sealed by Postgres at commit (console.auditchain).

Every row gets `chain_seq` (its place in the chain), `prev_hash` and `hash`. A deferred
constraint trigger seals each inserted row when its transaction commits: it takes the
chain's advisory lock, reads the tail and writes the three columns. Sealing at commit keeps
the lock for the commit alone (a transaction that audits and then waits on rows another
auditing transaction holds cannot deadlock on it), orders the chain by commit rather than
by id, and chains every writer, the ORM's, bulk inserts and raw SQL alike.

The seal's UPDATE is the one the append-only trigger lets through: only while the seal's
transaction-local flag is on, only on a row not sealed yet, and only the chain's columns.
The service's role cannot UPDATE the table at all (faultline.dbroles); the seal runs as the
table's owner (SECURITY DEFINER).

Existing rows are chained in id order here, with the append-only trigger off for this
migration's own statements (it runs as the owner, in one transaction).
"""

from django.db import migrations, models

# The seal's advisory lock key below is console.auditchain.LOCK_KEY ("AUDITLOG" as a
# bigint); the first row's prev_hash is 64 zeros (console.auditchain.GENESIS).

DIGEST = """
CREATE FUNCTION console_auditlog_digest(
    prev text, ts timestamptz, actor text, verb text, object_type text, object_id text,
    reason text, data jsonb
) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT encode(sha256(convert_to(jsonb_build_array(
        prev, to_char(ts AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        actor, verb, object_type, object_id, reason, data
    )::text, 'UTF8')), 'hex')
$$;
"""

APPEND_ONLY = """
CREATE OR REPLACE FUNCTION console_auditlog_append_only() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'UPDATE'
       AND current_setting('faultline.audit_sealing', true) = 'on'
       AND OLD.chain_seq IS NULL
       AND (NEW.id, NEW.ts, NEW.actor, NEW.verb, NEW.object_type, NEW.object_id, NEW.reason,
            NEW.data)
           IS NOT DISTINCT FROM
           (OLD.id, OLD.ts, OLD.actor, OLD.verb, OLD.object_type, OLD.object_id, OLD.reason,
            OLD.data)
    THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'console_auditlog is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
"""

APPEND_ONLY_BEFORE = """
CREATE OR REPLACE FUNCTION console_auditlog_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'console_auditlog is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
"""

SEAL = """
CREATE FUNCTION console_auditlog_seal() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
    mine xid;
    sealed bigint;
    seq bigint;
    prev text;
    r record;
    ids bigint[] := '{}';
    seqs bigint[] := '{}';
    prevs text[] := '{}';
    hashes text[] := '{}';
BEGIN
    SELECT a.chain_seq, a.xmin INTO sealed, mine FROM console_auditlog a WHERE a.id = NEW.id;
    IF NOT FOUND OR sealed IS NOT NULL THEN
        RETURN NULL;  -- sealed with the rest of its statement's rows
    END IF;
    PERFORM pg_advisory_xact_lock(2353872033611655075);
    -- A statement after the lock's: under READ COMMITTED its snapshot has the last
    -- holder's commit.
    SELECT a.chain_seq, a.hash INTO seq, prev FROM console_auditlog a
        WHERE a.chain_seq IS NOT NULL ORDER BY a.chain_seq DESC LIMIT 1;
    seq := coalesce(seq, 0);
    prev := coalesce(prev, repeat('0', 64));
    -- This row and every later one its (sub)transaction wrote, in one UPDATE; never a row
    -- another transaction wrote with the triggers off (xmin): that one stays out of the
    -- chain, and verify names it.
    FOR r IN SELECT a.id, a.ts, a.actor, a.verb, a.object_type, a.object_id, a.reason, a.data
             FROM console_auditlog a
             WHERE a.chain_seq IS NULL AND a.xmin = mine AND a.id >= NEW.id ORDER BY a.id
    LOOP
        seq := seq + 1;
        ids := ids || r.id;
        seqs := seqs || seq;
        prevs := prevs || prev;
        prev := console_auditlog_digest(prev, r.ts, r.actor, r.verb, r.object_type,
                                        r.object_id, r.reason, r.data);
        hashes := hashes || prev;
    END LOOP;
    PERFORM set_config('faultline.audit_sealing', 'on', true);
    UPDATE console_auditlog AS a SET chain_seq = u.seq, prev_hash = u.prev, hash = u.hash
        FROM unnest(ids, seqs, prevs, hashes) AS u(id, seq, prev, hash) WHERE a.id = u.id;
    PERFORM set_config('faultline.audit_sealing', 'off', true);
    RETURN NULL;
END;
$$;
CREATE CONSTRAINT TRIGGER console_auditlog_seal
    AFTER INSERT ON console_auditlog DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION console_auditlog_seal();
"""

BACKFILL = """
ALTER TABLE console_auditlog DISABLE TRIGGER console_auditlog_append_only;
DO $$
DECLARE
    r record;
    prev text := repeat('0', 64);
    n bigint := 0;
BEGIN
    FOR r IN SELECT id FROM console_auditlog ORDER BY id LOOP
        n := n + 1;
        UPDATE console_auditlog AS a SET chain_seq = n, prev_hash = prev,
            hash = console_auditlog_digest(prev, a.ts, a.actor, a.verb, a.object_type,
                                           a.object_id, a.reason, a.data)
            WHERE a.id = r.id RETURNING a.hash INTO prev;
    END LOOP;
END $$;
ALTER TABLE console_auditlog ENABLE TRIGGER console_auditlog_append_only;
"""

DROP_DIGEST = """
DROP FUNCTION IF EXISTS console_auditlog_digest(
    text, timestamptz, text, text, text, text, text, jsonb);
"""

DROP_SEAL = """
DROP TRIGGER IF EXISTS console_auditlog_seal ON console_auditlog;
DROP FUNCTION IF EXISTS console_auditlog_seal();
"""


class Migration(migrations.Migration):
    dependencies = [("console", "0015_sso_identity")]

    operations = [
        migrations.AddField(
            model_name="auditlog",
            name="chain_seq",
            field=models.BigIntegerField(blank=True, null=True, unique=True),
        ),
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
        migrations.RunSQL(DIGEST + BACKFILL, DROP_DIGEST),
        migrations.RunSQL(APPEND_ONLY + SEAL, DROP_SEAL + APPEND_ONLY_BEFORE),
    ]
