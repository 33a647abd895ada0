"""The database, not the code, keeps the audit trail append-only and chained.

PostgreSQL: a deferred constraint trigger seals each event at commit (seq, prev_hash,
hash = sha256(prev_hash || content_hash || seq)) under one advisory lock, so events are
chained in commit order and the lock is the last one any transaction takes. A second
trigger refuses every UPDATE and DELETE except that seal. SQLite: the chain is extended in
Python (writers are serialised there); triggers refuse UPDATE and DELETE.
"""

from django.db import migrations

PG_FORWARD = r"""
CREATE FUNCTION ledger_audit_seal() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    last_seq bigint;
    last_hash text;
BEGIN
    PERFORM pg_advisory_xact_lock(361478, 1);
    SELECT seq, hash INTO last_seq, last_hash FROM ledger_auditevent
        WHERE seq IS NOT NULL ORDER BY seq DESC LIMIT 1;
    last_seq := COALESCE(last_seq, 0) + 1;
    last_hash := COALESCE(last_hash, '');
    UPDATE ledger_auditevent
       SET seq = last_seq,
           prev_hash = last_hash,
           hash = encode(sha256(convert_to(last_hash || NEW.content_hash || last_seq::text, 'UTF8')), 'hex')
     WHERE id = NEW.id;
    RETURN NULL;
END $$;

CREATE CONSTRAINT TRIGGER ledger_audit_seal AFTER INSERT ON ledger_auditevent
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION ledger_audit_seal();

CREATE FUNCTION ledger_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.seq IS NULL AND pg_trigger_depth() > 1
       AND (to_jsonb(NEW) - 'seq' - 'prev_hash' - 'hash') = (to_jsonb(OLD) - 'seq' - 'prev_hash' - 'hash') THEN
        RETURN NEW;  -- the seal, from ledger_audit_seal
    END IF;
    RAISE EXCEPTION USING MESSAGE = 'audit events are append-only: ' || TG_OP || ' refused',
                          ERRCODE = 'insufficient_privilege';
END $$;

CREATE TRIGGER ledger_audit_append_only BEFORE UPDATE OR DELETE ON ledger_auditevent
    FOR EACH ROW EXECUTE FUNCTION ledger_audit_append_only();
"""

PG_BACKWARD = r"""
DROP TRIGGER ledger_audit_append_only ON ledger_auditevent;
DROP FUNCTION ledger_audit_append_only();
DROP TRIGGER ledger_audit_seal ON ledger_auditevent;
DROP FUNCTION ledger_audit_seal();
"""

SQLITE_FORWARD = [
    "CREATE TRIGGER ledger_audit_no_update BEFORE UPDATE ON ledger_auditevent "
    "BEGIN SELECT RAISE(ABORT, 'audit events are append-only (UPDATE refused)'); END;",
    "CREATE TRIGGER ledger_audit_no_delete BEFORE DELETE ON ledger_auditevent "
    "BEGIN SELECT RAISE(ABORT, 'audit events are append-only (DELETE refused)'); END;",
]
SQLITE_BACKWARD = ["DROP TRIGGER ledger_audit_no_update;", "DROP TRIGGER ledger_audit_no_delete;"]


def forward(apps, schema_editor):
    statements = [PG_FORWARD] if schema_editor.connection.vendor == "postgresql" else SQLITE_FORWARD
    for sql in statements:
        schema_editor.execute(sql)


def backward(apps, schema_editor):
    statements = [PG_BACKWARD] if schema_editor.connection.vendor == "postgresql" else SQLITE_BACKWARD
    for sql in statements:
        schema_editor.execute(sql)


class Migration(migrations.Migration):
    dependencies = [("ledger", "0001_initial")]
    operations = [migrations.RunPython(forward, backward)]
