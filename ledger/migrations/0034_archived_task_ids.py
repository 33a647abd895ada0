"""The task ids whose finished tasks were archived with their steps and actions
(ledger.retention.ArchivedTask), and the rule that none of them is recorded again
(ledger.dbrules.ARCHIVED_TASK_REFUSED and its SQLite pair; SQL frozen as `manage.py dbrules
ledger` printed it). A new, empty table and a trigger: safe on a populated ledger."""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models

FORWARD = r"""
CREATE OR REPLACE FUNCTION ledger_task_id_archived() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM ledger_archivedtask k WHERE k.task_id = NEW.task_id) THEN
        RAISE EXCEPTION USING MESSAGE = 'operation_key_archived: ' || NEW.task_id,
                              ERRCODE = 'unique_violation';
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER ledger_task_id_archived AFTER INSERT ON ledger_task
    FOR EACH ROW EXECUTE FUNCTION ledger_task_id_archived();
"""
BACKWARD = """
DROP TRIGGER ledger_task_id_archived ON ledger_task;
DROP FUNCTION ledger_task_id_archived();
"""
SQLITE_FORWARD = """CREATE TRIGGER ledger_task_id_archived BEFORE INSERT ON ledger_task
WHEN EXISTS (SELECT 1 FROM ledger_archivedtask k WHERE k.task_id = NEW.task_id)
BEGIN
    SELECT RAISE(ABORT, 'operation_key_archived');
END"""
SQLITE_BACKWARD = "DROP TRIGGER ledger_task_id_archived"


def forward(apps, schema_editor):
    schema_editor.execute(FORWARD if schema_editor.connection.vendor == "postgresql" else SQLITE_FORWARD)


def backward(apps, schema_editor):
    schema_editor.execute(BACKWARD if schema_editor.connection.vendor == "postgresql" else SQLITE_BACKWARD)


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0033_webhook_events_partitioned'),
    ]

    operations = [
        migrations.CreateModel(
            name='ArchivedTask',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('created_at', models.DateTimeField()),
                ('archived_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('archive_sha256', models.CharField(max_length=64)),
                ('task_id', models.CharField(max_length=255, unique=True)),
                ('agent', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='ledger.agent')),
            ],
            options={
                'abstract': False,
            },
        ),
        migrations.RunPython(forward, backward),
    ]
