"""The audit chain is extended by a sealer (the sweeper), no longer at every commit.

The deferred seal trigger took one advisory lock at every commit that wrote an event, so
all such commits queued behind each other. Events stay append-only from the moment they
are written: the database refuses every DELETE, and every UPDATE except the one that seals
an event not sealed yet, changing nothing but `seq`, `prev_hash` and `hash`.
"""

from django.db import migrations, models

PG_FORWARD = r"""
DROP TRIGGER ledger_audit_seal ON ledger_auditevent;
DROP FUNCTION ledger_audit_seal();

CREATE OR REPLACE FUNCTION ledger_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.seq IS NULL AND NEW.seq IS NOT NULL
       AND (to_jsonb(NEW) - 'seq' - 'prev_hash' - 'hash') = (to_jsonb(OLD) - 'seq' - 'prev_hash' - 'hash') THEN
        RETURN NEW;  -- the seal (AuditEventManager.seal)
    END IF;
    RAISE EXCEPTION USING MESSAGE = 'audit events are append-only: ' || TG_OP || ' refused',
                          ERRCODE = 'insufficient_privilege';
END $$;
"""

PG_BACKWARD = r"""
CREATE OR REPLACE FUNCTION ledger_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.seq IS NULL AND pg_trigger_depth() > 1
       AND (to_jsonb(NEW) - 'seq' - 'prev_hash' - 'hash') = (to_jsonb(OLD) - 'seq' - 'prev_hash' - 'hash') THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION USING MESSAGE = 'audit events are append-only: ' || TG_OP || ' refused',
                          ERRCODE = 'insufficient_privilege';
END $$;

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
"""

# SQLite: the same rule, spelled out column by column.
CONTENT_COLUMNS = ["id", "occurred_at", "actor", "verb", "object_type", "object_id", "object_label", "before",
                   "after", "reason", "request_id", "content_hash"]
SQLITE_FORWARD = [
    "DROP TRIGGER ledger_audit_no_update;",
    "CREATE TRIGGER ledger_audit_no_update BEFORE UPDATE ON ledger_auditevent "
    "WHEN OLD.seq IS NOT NULL OR NEW.seq IS NULL OR "
    + " OR ".join(f"NEW.{c} IS NOT OLD.{c}" for c in CONTENT_COLUMNS)
    + " BEGIN SELECT RAISE(ABORT, 'audit events are append-only (UPDATE refused)'); END;",
]
SQLITE_BACKWARD = [
    "DROP TRIGGER ledger_audit_no_update;",
    "CREATE TRIGGER ledger_audit_no_update BEFORE UPDATE ON ledger_auditevent "
    "BEGIN SELECT RAISE(ABORT, 'audit events are append-only (UPDATE refused)'); END;",
]


def forward(apps, schema_editor):
    statements = [PG_FORWARD] if schema_editor.connection.vendor == "postgresql" else SQLITE_FORWARD
    for sql in statements:
        schema_editor.execute(sql)


def backward(apps, schema_editor):
    statements = [PG_BACKWARD] if schema_editor.connection.vendor == "postgresql" else SQLITE_BACKWARD
    for sql in statements:
        schema_editor.execute(sql)


class Migration(migrations.Migration):
    dependencies = [("ledger", "0009_stricter_checks")]
    operations = [
        migrations.RunPython(forward, backward),
        migrations.AddIndex(
            model_name="auditevent",
            index=models.Index(condition=models.Q(("seq__isnull", True)), fields=["id"], name="audit_unsealed_idx"),
        ),
    ]
