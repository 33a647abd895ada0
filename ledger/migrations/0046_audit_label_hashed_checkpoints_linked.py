"""An event's content hash covers its object_label, and each checkpoint is linked to the one before it.

`AuditEvent.hash_version`: 1, in the database, for every event before (its content hash is of its
fields without the label, and stays so: nothing is hashed again), and for one the code before writes
during the upgrade; the code writes 2 (ledger.audit.content_fields). A column with a constant default,
added to the partitioned trail's parent: PostgreSQL adds it to every partition without rewriting a row
(a partition made later takes the default from the parent: ledger.partitions). The seal's rule compares
the whole row but its links (ledger.dbrules.AUDIT_APPEND_ONLY), so the new column is covered as it is;
SQLite's spells the columns out (AUDIT_CONTENT_COLUMNS), and the column's addition remakes the table
there, which drops its triggers: both are made again below (SQL frozen as `manage.py dbrules ledger`
printed it). Backwards, SQLite's update rule goes back to 0032's first: SQLite drops no column a
trigger names.

`ChainCheckpoint.every`, `prev_seq`, `prev_hash`, `link_signature`: null for the checkpoints before,
which verify as they always did. Nullable columns without a default: no table is rewritten or remade.
"""

import importlib

from django.db import migrations, models

SQLITE_FORWARD = [
    "DROP TRIGGER IF EXISTS ledger_audit_no_update",
    "CREATE TRIGGER ledger_audit_no_update BEFORE UPDATE ON ledger_auditevent WHEN OLD.seq IS NOT NULL OR NEW.seq IS NULL OR NEW.id IS NOT OLD.id OR NEW.occurred_at IS NOT OLD.occurred_at OR NEW.actor IS NOT OLD.actor OR NEW.verb IS NOT OLD.verb OR NEW.object_type IS NOT OLD.object_type OR NEW.object_id IS NOT OLD.object_id OR NEW.object_label IS NOT OLD.object_label OR NEW.before IS NOT OLD.before OR NEW.after IS NOT OLD.after OR NEW.reason IS NOT OLD.reason OR NEW.request_id IS NOT OLD.request_id OR NEW.content_hash IS NOT OLD.content_hash OR NEW.hash_version IS NOT OLD.hash_version OR EXISTS (SELECT 1 FROM ledger_auditevent e WHERE e.seq = NEW.seq) BEGIN SELECT RAISE(ABORT, 'audit events are append-only (UPDATE refused)'); END",  # noqa: E501
    "DROP TRIGGER IF EXISTS ledger_audit_no_delete",
    "CREATE TRIGGER ledger_audit_no_delete BEFORE DELETE ON ledger_auditevent WHEN OLD.seq IS NULL OR OLD.seq >= coalesce((SELECT max(c.seq) FROM ledger_archive a JOIN ledger_chaincheckpoint c ON c.id = a.checkpoint_id), 0) BEGIN SELECT RAISE(ABORT, 'audit events are append-only (DELETE refused)'); END",  # noqa: E501
]


SQLITE_BACKWARD = importlib.import_module("ledger.migrations.0032_audit_trail_partitioned").SQLITE_RULE


def sqlite_rules(statements):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor != "postgresql":
            for sql in statements:
                schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):

    dependencies = [
        ("ledger", "0045_no_version_of_an_action_sent_before"),
    ]

    operations = [
        migrations.AddField(
            model_name="auditevent",
            name="hash_version",
            field=models.SmallIntegerField(db_default=1, default=2),
        ),
        migrations.AddField(
            model_name="chaincheckpoint",
            name="every",
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="chaincheckpoint",
            name="prev_seq",
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="chaincheckpoint",
            name="prev_hash",
            field=models.CharField(blank=True, max_length=64, null=True),
        ),
        migrations.AddField(
            model_name="chaincheckpoint",
            name="link_signature",
            field=models.CharField(blank=True, max_length=100, null=True),
        ),
        migrations.RunPython(sqlite_rules(SQLITE_FORWARD), sqlite_rules(SQLITE_BACKWARD)),
    ]
