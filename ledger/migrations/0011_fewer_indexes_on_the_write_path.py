import importlib

import django.db.models.deletion
from django.db import migrations, models

# On SQLite, altering `seq` rebuilds the table, and the rebuild drops its triggers: the
# append-only rules of 0002 (DELETE) and 0010 (UPDATE) are created again afterwards.
_no_delete = importlib.import_module("ledger.migrations.0002_audit_append_only").SQLITE_FORWARD[1]
_no_update = importlib.import_module("ledger.migrations.0010_audit_sealed_by_the_sweeper").SQLITE_FORWARD[1]


def sqlite_rules_again(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        for name, sql in (("ledger_audit_no_delete", _no_delete), ("ledger_audit_no_update", _no_update)):
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {name};")
            schema_editor.execute(sql)


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0010_audit_sealed_by_the_sweeper'),
    ]

    operations = [
        migrations.RunPython(migrations.RunPython.noop, sqlite_rules_again),  # (last, when reversed)
        migrations.AlterField(
            model_name='action',
            name='agent',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='actions', to='ledger.agent'),
        ),
        migrations.AlterField(
            model_name='auditevent',
            name='seq',
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddConstraint(
            model_name='auditevent',
            constraint=models.UniqueConstraint(condition=models.Q(('seq__isnull', False)), fields=('seq',), name='audit_seq_unique'),
        ),
        migrations.RunPython(sqlite_rules_again, migrations.RunPython.noop),
    ]
