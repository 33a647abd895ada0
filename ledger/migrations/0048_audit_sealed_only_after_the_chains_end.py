"""A seal only right after the chain's end (ledger.dbrules.AUDIT_APPEND_ONLY, on SQLite
ledger_audit_no_update; SQL frozen as `manage.py dbrules ledger` printed it).

The rule of 0032 took any seq no event held, with the link to the event at seq - 1 (or '' at seq 1).
Once an archive run had deleted seqs 1 to C-1, an unsealed event could be sealed at seq 1, after '',
and then deleted as archived: gone, with every check still passing from the run's checkpoint on
(SQLite's rule, which checks no link, took any archived seq). Now the seal's seq is the one after
the highest sealed, whose event no run deletes. A replaced rule: safe on a populated ledger, whose
sealer seals just so already.
"""

import importlib

from django.db import migrations

FORWARD = r"""
CREATE OR REPLACE FUNCTION ledger_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    end_seq bigint;
    end_hash text;
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.seq IS NULL AND NEW.seq IS NOT NULL
       AND (to_jsonb(NEW) - 'seq' - 'prev_hash' - 'hash') = (to_jsonb(OLD) - 'seq' - 'prev_hash' - 'hash') THEN
        -- The sealer's lock (ledger.locks.AUDIT_SEAL), already its own: seals take turns, so the
        -- check below sees every seal committed before this one.
        PERFORM pg_advisory_xact_lock(361478, 1);
        -- The chain's end (none: the seal is seq 1, after ''). The sealer's batch seals in seq
        -- order, a statement a row, so each row's seal follows the one before it.
        SELECT seq, hash INTO end_seq, end_hash FROM ledger_auditevent WHERE seq IS NOT NULL ORDER BY seq DESC LIMIT 1;
        IF NEW.seq <> coalesce(end_seq, 0) + 1
           OR NEW.prev_hash IS DISTINCT FROM coalesce(end_hash, '')
           OR NEW.hash <> encode(sha256(convert_to(NEW.prev_hash || NEW.content_hash || NEW.seq::text, 'UTF8')), 'hex')
        THEN
            RAISE EXCEPTION USING MESSAGE = 'audit events are append-only: a seal must be the next link of the chain',
                                  ERRCODE = 'insufficient_privilege';
        END IF;
        RETURN NEW;  -- the seal (AuditEventManager.seal)
    END IF;
    IF TG_OP = 'DELETE' AND OLD.seq < (SELECT max(c.seq) FROM ledger_archive a JOIN ledger_chaincheckpoint c ON c.id = a.checkpoint_id) THEN
        RETURN OLD;  -- archived (dlq.archive)
    END IF;
    RAISE EXCEPTION USING MESSAGE = 'audit events are append-only: ' || TG_OP || ' refused',
                          ERRCODE = 'insufficient_privilege';
END $$;
"""
# Back to the rules of 0032 (PostgreSQL) and 0046 (SQLite).
BACKWARD = importlib.import_module("ledger.migrations.0032_audit_trail_partitioned").PG_RULE
SQLITE_FORWARD = [
    "DROP TRIGGER IF EXISTS ledger_audit_no_update",
    "CREATE TRIGGER ledger_audit_no_update BEFORE UPDATE ON ledger_auditevent WHEN OLD.seq IS NOT NULL OR NEW.seq IS NULL OR NEW.id IS NOT OLD.id OR NEW.occurred_at IS NOT OLD.occurred_at OR NEW.actor IS NOT OLD.actor OR NEW.verb IS NOT OLD.verb OR NEW.object_type IS NOT OLD.object_type OR NEW.object_id IS NOT OLD.object_id OR NEW.object_label IS NOT OLD.object_label OR NEW.before IS NOT OLD.before OR NEW.after IS NOT OLD.after OR NEW.reason IS NOT OLD.reason OR NEW.request_id IS NOT OLD.request_id OR NEW.content_hash IS NOT OLD.content_hash OR NEW.hash_version IS NOT OLD.hash_version OR NEW.seq <> coalesce((SELECT max(e.seq) FROM ledger_auditevent e WHERE e.seq IS NOT NULL), 0) + 1 BEGIN SELECT RAISE(ABORT, 'audit events are append-only (UPDATE refused)'); END",  # noqa: E501
]
SQLITE_BACKWARD = importlib.import_module("ledger.migrations.0046_audit_label_hashed_checkpoints_linked").SQLITE_FORWARD[:2]


def rules(*, postgresql, sqlite):
    def run(apps, schema_editor):
        for sql in [postgresql] if schema_editor.connection.vendor == "postgresql" else sqlite:
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):

    dependencies = [
        ("ledger", "0047_no_print_while_awaiting_approval"),
    ]

    operations = [
        migrations.RunPython(rules(postgresql=FORWARD, sqlite=SQLITE_FORWARD),
                             rules(postgresql=BACKWARD, sqlite=SQLITE_BACKWARD)),
    ]
