"""PostgreSQL checks every seal: only the next link of the chain may be written.

0010 let any client seal an unsealed event, with any `seq` and `hash`: a forged seal was
detectable later (`verify_chain`) but could not be undone. Now the trigger accepts a seal
only if `prev_hash` is the hash of the event sealed as `seq - 1` (or empty for `seq` 1)
and `hash = sha256(prev_hash || content_hash || seq)`, the formula of `ledger/audit.py`.
"""

from django.db import migrations

PG_FORWARD = r"""
CREATE OR REPLACE FUNCTION ledger_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    expected_prev text := '';
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.seq IS NULL AND NEW.seq IS NOT NULL
       AND (to_jsonb(NEW) - 'seq' - 'prev_hash' - 'hash') = (to_jsonb(OLD) - 'seq' - 'prev_hash' - 'hash') THEN
        IF NEW.seq > 1 THEN
            SELECT hash INTO expected_prev FROM ledger_auditevent WHERE seq = NEW.seq - 1;  -- NULL if none
        END IF;
        IF NEW.prev_hash IS DISTINCT FROM expected_prev
           OR NEW.hash <> encode(sha256(convert_to(NEW.prev_hash || NEW.content_hash || NEW.seq::text, 'UTF8')), 'hex')
        THEN
            RAISE EXCEPTION USING MESSAGE = 'audit events are append-only: a seal must be the next link of the chain',
                                  ERRCODE = 'insufficient_privilege';
        END IF;
        RETURN NEW;  -- the seal (AuditEventManager.seal)
    END IF;
    RAISE EXCEPTION USING MESSAGE = 'audit events are append-only: ' || TG_OP || ' refused',
                          ERRCODE = 'insufficient_privilege';
END $$;
"""

PG_BACKWARD = r"""
CREATE OR REPLACE FUNCTION ledger_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.seq IS NULL AND NEW.seq IS NOT NULL
       AND (to_jsonb(NEW) - 'seq' - 'prev_hash' - 'hash') = (to_jsonb(OLD) - 'seq' - 'prev_hash' - 'hash') THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION USING MESSAGE = 'audit events are append-only: ' || TG_OP || ' refused',
                          ERRCODE = 'insufficient_privilege';
END $$;
"""


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_FORWARD)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_BACKWARD)


class Migration(migrations.Migration):
    dependencies = [("ledger", "0011_fewer_indexes_on_the_write_path")]
    operations = [migrations.RunPython(forward, backward)]
