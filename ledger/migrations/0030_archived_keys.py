"""The keys whose settled actions were archived (ledger.retention.ArchivedKey), and the rule
that none of them is recorded again (ledger.dbrules.ARCHIVED_KEY_REFUSED and its SQLite pair;
SQL frozen as `manage.py dbrules ledger` printed it). A new, empty table and a trigger: safe on
a populated ledger."""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models

FORWARD = r"""
CREATE OR REPLACE FUNCTION ledger_action_key_archived() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM ledger_archivedkey k WHERE k.operation_key = NEW.operation_key) THEN
        RAISE EXCEPTION USING MESSAGE = 'operation_key_archived: ' || NEW.operation_key,
                              ERRCODE = 'unique_violation';
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER ledger_action_key_archived AFTER INSERT ON ledger_action
    FOR EACH ROW EXECUTE FUNCTION ledger_action_key_archived();
"""
BACKWARD = """
DROP TRIGGER ledger_action_key_archived ON ledger_action;
DROP FUNCTION ledger_action_key_archived();
"""
SQLITE_FORWARD = """CREATE TRIGGER ledger_action_key_archived BEFORE INSERT ON ledger_action
WHEN EXISTS (SELECT 1 FROM ledger_archivedkey k WHERE k.operation_key = NEW.operation_key)
BEGIN
    SELECT RAISE(ABORT, 'operation_key_archived');
END"""
SQLITE_BACKWARD = "DROP TRIGGER ledger_action_key_archived"


def forward(apps, schema_editor):
    schema_editor.execute(FORWARD if schema_editor.connection.vendor == "postgresql" else SQLITE_FORWARD)


def backward(apps, schema_editor):
    schema_editor.execute(BACKWARD if schema_editor.connection.vendor == "postgresql" else SQLITE_BACKWARD)


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0029_one_chain_walk_running'),
    ]

    operations = [
        migrations.CreateModel(
            name='ArchivedKey',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('operation_key', models.CharField(max_length=255, unique=True)),
                ('created_at', models.DateTimeField()),
                ('archived_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('archive_sha256', models.CharField(max_length=64)),
                ('agent', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='ledger.agent')),
            ],
        ),
        migrations.RunPython(forward, backward),
    ]
