"""The subjects' locks taken only if free (ledger.dbrules.TRY_LOCK_SUBJECTS), for a settle that
releases the actions it held (ledger.actions.held_release_when_settled). SQL frozen as `manage.py
dbrules ledger` printed it; a new function, nothing else. SQLite serialises writers: nothing to add."""

from django.db import migrations

FORWARD = r"""
CREATE OR REPLACE FUNCTION ledger_try_lock_subjects(p_target text, p_customer text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    RETURN (SELECT bool_and(pg_try_advisory_xact_lock(k)) FROM (
        SELECT DISTINCT hashtextextended(s, 0) AS k
          FROM unnest(ARRAY['target:' || p_target,
                            CASE WHEN p_customer <> '' THEN 'customer:' || p_customer END]) AS s
         WHERE s IS NOT NULL
         ORDER BY 1) AS keys);
END $$;
"""
BACKWARD = "DROP FUNCTION ledger_try_lock_subjects(text, text);"


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FORWARD)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(BACKWARD)


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0035_held_nearby'),
    ]

    operations = [
        migrations.RunPython(forward, backward),
    ]
