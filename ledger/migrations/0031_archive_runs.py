"""The archive's runs (ledger.retention.Archive), and the one delete the audit trail allows:
sealed events before the checkpoint the newest run names (ledger.dbrules.AUDIT_APPEND_ONLY and
ledger_audit_no_delete; SQL frozen as `manage.py dbrules ledger` printed it). A new, empty table
and a replaced rule: safe on a populated ledger, and until an archive runs nothing may be deleted."""

import importlib

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models

FORWARD = r"""
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
    IF TG_OP = 'DELETE' AND OLD.seq < (SELECT max(c.seq) FROM ledger_archive a JOIN ledger_chaincheckpoint c ON c.id = a.checkpoint_id) THEN
        RETURN OLD;  -- archived (dlq.archive)
    END IF;
    RAISE EXCEPTION USING MESSAGE = 'audit events are append-only: ' || TG_OP || ' refused',
                          ERRCODE = 'insufficient_privilege';
END $$;
"""
# Back to the rule of 0012 (and 0002's SQLite trigger), which allowed no delete.
BACKWARD = importlib.import_module("ledger.migrations.0012_audit_seal_checked_by_the_database").PG_FORWARD
SQLITE_FORWARD = ["DROP TRIGGER ledger_audit_no_delete",
                  "CREATE TRIGGER ledger_audit_no_delete BEFORE DELETE ON ledger_auditevent WHEN OLD.seq IS NULL OR OLD.seq >= coalesce((SELECT max(c.seq) FROM ledger_archive a JOIN ledger_chaincheckpoint c ON c.id = a.checkpoint_id), 0) BEGIN SELECT RAISE(ABORT, 'audit events are append-only (DELETE refused)'); END"]
SQLITE_BACKWARD = ["DROP TRIGGER ledger_audit_no_delete",
                   importlib.import_module("ledger.migrations.0002_audit_append_only").SQLITE_FORWARD[1]]


def rules(*, postgresql, sqlite):
    def run(apps, schema_editor):
        for sql in [postgresql] if schema_editor.connection.vendor == "postgresql" else sqlite:
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0030_archived_keys'),
    ]

    operations = [
        migrations.CreateModel(
            name='Archive',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('file', models.CharField(max_length=500)),
                ('sha256', models.CharField(max_length=64)),
                ('removed', models.JSONField(default=dict)),
                ('archived_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('checkpoint', models.OneToOneField(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='archive', to='ledger.chaincheckpoint')),
            ],
            options={
                'ordering': ['-id'],
            },
        ),
        migrations.RunPython(rules(postgresql=FORWARD, sqlite=SQLITE_FORWARD),
                             rules(postgresql=BACKWARD, sqlite=SQLITE_BACKWARD)),
    ]
