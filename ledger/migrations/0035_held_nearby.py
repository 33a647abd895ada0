"""The look a settle reads back with its UPDATE (ledger.models.HELD_NEARBY), as a function on
PostgreSQL (ledger.dbrules.HELD_NEARBY): its query reads what is committed once the UPDATE has
its row. SQL frozen as `manage.py dbrules ledger` printed it; a new function, nothing else."""

from django.db import migrations

FORWARD = r"""
CREATE OR REPLACE FUNCTION ledger_held_nearby(p_id bigint, p_target text, p_customer text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM ledger_action h WHERE h.status = 'held' AND h.id <> p_id AND (h.target = p_target OR (p_customer <> '' AND h.customer = p_customer)));
END $$;
"""
BACKWARD = "DROP FUNCTION ledger_held_nearby(bigint, text, text);"


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FORWARD)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(BACKWARD)


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0034_archived_task_ids'),
    ]

    operations = [
        migrations.RunPython(forward, backward),
    ]
