"""A day already stale is not marked stale again (approvals.dbrules.SUMMARY_DAY_CHANGED): an
archive run's deletes of one day's actions each rewrote the same summary row. SQL frozen here
as `manage.py dbrules approvals` printed it; PostgreSQL only, as in 0009."""

from django.db import migrations

FUNCTION = r"""
CREATE OR REPLACE FUNCTION approvals_summary_day_changed(p_at timestamptz) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF p_at < date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' THEN
        INSERT INTO approvals_summaryday (day, stale, summarised_at)
             VALUES ((p_at AT TIME ZONE 'UTC')::date, true, now())
        ON CONFLICT (day) DO UPDATE SET stale = true{only_once};
    END IF;
END $$;
"""


def install(only_once):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(FUNCTION.format(only_once=only_once))
    return run


class Migration(migrations.Migration):

    dependencies = [
        ('approvals', '0012_delegations'),
    ]

    operations = [
        migrations.RunPython(install(" WHERE NOT approvals_summaryday.stale"), install("")),
    ]
