"""The what-if's daily summaries (approvals.summaries): the summary rows, one mark per day, and
on PostgreSQL the triggers that mark a day stale when an action of it changes after the day is
over (approvals/dbrules.py, frozen here as `manage.py dbrules approvals` printed it). SQLite
has no summaries (the what-if reads rows there), so nothing is installed on it."""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models

BEFORE_TODAY = "date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'"
PG_FORWARD = r"""
CREATE OR REPLACE FUNCTION approvals_summary_day_changed(p_at timestamptz) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF p_at < date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' THEN
        INSERT INTO approvals_summaryday (day, stale, summarised_at)
             VALUES ((p_at AT TIME ZONE 'UTC')::date, true, now())
        ON CONFLICT (day) DO UPDATE SET stale = true;
    END IF;
END $$;
CREATE OR REPLACE FUNCTION approvals_summary_stale() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM approvals_summary_day_changed(NEW.created_at);
    ELSE
        PERFORM approvals_summary_day_changed(OLD.created_at);
    END IF;
    RETURN NULL;
END $$;
CREATE OR REPLACE FUNCTION approvals_summary_asked_stale() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM approvals_summary_day_changed(a.created_at) FROM ledger_action a WHERE a.id = NEW.action_id;
    ELSE
        PERFORM approvals_summary_day_changed(a.created_at) FROM ledger_action a WHERE a.id = OLD.action_id;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER approvals_summary_stale_insert AFTER INSERT ON ledger_action
    FOR EACH ROW WHEN (NEW.created_at < {before_today}) EXECUTE FUNCTION approvals_summary_stale();
CREATE TRIGGER approvals_summary_stale_change
    AFTER UPDATE OF status, amount, customer, supersedes_id, action_type, currency, created_at OR DELETE ON ledger_action
    FOR EACH ROW WHEN (OLD.created_at < {before_today}) EXECUTE FUNCTION approvals_summary_stale();
CREATE TRIGGER approvals_summary_asked_stale AFTER INSERT OR DELETE ON approvals_reviewitem
    FOR EACH ROW EXECUTE FUNCTION approvals_summary_asked_stale();
""".format(before_today=BEFORE_TODAY)

PG_BACKWARD = """
DROP TRIGGER approvals_summary_asked_stale ON approvals_reviewitem;
DROP TRIGGER approvals_summary_stale_change ON ledger_action;
DROP TRIGGER approvals_summary_stale_insert ON ledger_action;
DROP FUNCTION approvals_summary_asked_stale();
DROP FUNCTION approvals_summary_stale();
DROP FUNCTION approvals_summary_day_changed(timestamptz);
"""


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_FORWARD)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_BACKWARD)


class Migration(migrations.Migration):

    dependencies = [
        ('approvals', '0008_approvals_bound_edited_expired'),
        ('ledger', '0029_one_chain_walk_running'),
    ]

    operations = [
        migrations.CreateModel(
            name='SummaryDay',
            fields=[
                ('day', models.DateField(primary_key=True, serialize=False)),
                ('stale', models.BooleanField(default=False)),
                ('summarised_at', models.DateTimeField(default=django.utils.timezone.now)),
            ],
        ),
        migrations.CreateModel(
            name='ActionSummary',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('action_type', models.CharField(max_length=40)),
                ('currency', models.CharField(max_length=3)),
                ('amount', models.DecimalField(decimal_places=3, max_digits=18, null=True)),
                ('total_before', models.DecimalField(decimal_places=3, max_digits=18)),
                ('n', models.PositiveIntegerField()),
                ('asked', models.PositiveIntegerField()),
                ('n_upto', models.PositiveIntegerField(default=0)),
                ('asked_upto', models.PositiveIntegerField(default=0)),
                ('day', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='rows', to='approvals.summaryday')),
            ],
            options={
                'indexes': [models.Index(fields=['action_type', 'currency', 'day', 'total_before', 'amount'], name='summary_lookup_idx')],
            },
        ),
        migrations.RunPython(forward, backward),
    ]
