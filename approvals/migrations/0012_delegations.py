"""Delegations (approvals.delegation): a person's review items offered to a delegate for a
period. A decision or approval a delegate takes for someone names that person (decided_for,
on_behalf_of), and the four-eyes rules hold for both of them: neither owns the agent that
asked, and one person and their delegate give one approval between them. SQL frozen here as
`manage.py dbrules approvals` printed it; new nullable columns and a new table, safe on a
populated ledger."""

import importlib

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models

PG_FORWARD = r"""
CREATE OR REPLACE FUNCTION approvals_four_eyes_approval() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM ledger_action a JOIN ledger_agent g ON g.id = a.agent_id
                WHERE a.id = (SELECT action_id FROM approvals_reviewitem WHERE id = NEW.item_id) AND g.owner_id IN (NEW.user_id, NEW.on_behalf_of_id)) THEN
        RAISE EXCEPTION USING MESSAGE = 'four eyes: the owner of the agent that asked may not approve it',
                              ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF EXISTS (SELECT 1 FROM approvals_approval p WHERE p.item_id = NEW.item_id
                AND (p.user_id IN (NEW.user_id, NEW.on_behalf_of_id) OR p.on_behalf_of_id IN (NEW.user_id, NEW.on_behalf_of_id))) THEN
        RAISE EXCEPTION USING MESSAGE = 'four eyes: a person and their delegate give one approval between them',
                              ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE OR REPLACE FUNCTION approvals_four_eyes_decision() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.decided_by_id IS NOT NULL AND EXISTS (SELECT 1 FROM ledger_action a JOIN ledger_agent g ON g.id = a.agent_id
                WHERE a.id = NEW.action_id AND g.owner_id IN (NEW.decided_by_id, NEW.decided_for_id)) THEN
        RAISE EXCEPTION USING MESSAGE = 'four eyes: the owner of the agent that asked may not decide it',
                              ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF NEW.status = 'approved' AND NEW.approvals_needed > 1 AND (SELECT count(*) FROM approvals_approval WHERE item_id = NEW.id) < NEW.approvals_needed THEN
        RAISE EXCEPTION USING MESSAGE = 'four eyes: this item needs its approvals from different people',
                              ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END $$;
"""
# Back to 0006's functions (its triggers stay: they call the functions by name).
FOUR_EYES = importlib.import_module("approvals.migrations.0006_four_eyes_held_by_the_database")
PG_BACKWARD = FOUR_EYES.PG_FORWARD.split("CREATE TRIGGER", 1)[0]

# On SQLite the triggers go before the columns change and come back after: a trigger that names
# another table breaks a table's rebuild (a column removed, going back).
SQLITE_DROP = ["DROP TRIGGER approvals_four_eyes_approval", "DROP TRIGGER approvals_four_eyes_decision"]
SQLITE_CREATE = [r"""CREATE TRIGGER approvals_four_eyes_approval BEFORE INSERT ON approvals_approval
WHEN EXISTS (SELECT 1 FROM ledger_action a JOIN ledger_agent g ON g.id = a.agent_id
                WHERE a.id = (SELECT action_id FROM approvals_reviewitem WHERE id = NEW.item_id) AND g.owner_id IN (NEW.user_id, NEW.on_behalf_of_id)) OR EXISTS (SELECT 1 FROM approvals_approval p WHERE p.item_id = NEW.item_id
                AND (p.user_id IN (NEW.user_id, NEW.on_behalf_of_id) OR p.on_behalf_of_id IN (NEW.user_id, NEW.on_behalf_of_id)))
BEGIN
    SELECT RAISE(ABORT, 'four eyes: the owner of the agent that asked may not approve it, and a person and their delegate give one approval between them');
END""",
                 r"""CREATE TRIGGER approvals_four_eyes_decision BEFORE UPDATE OF status ON approvals_reviewitem
WHEN (NEW.decided_by_id IS NOT NULL AND EXISTS (SELECT 1 FROM ledger_action a JOIN ledger_agent g ON g.id = a.agent_id
                WHERE a.id = NEW.action_id AND g.owner_id IN (NEW.decided_by_id, NEW.decided_for_id)))
    OR (NEW.status = 'approved' AND NEW.approvals_needed > 1 AND (SELECT count(*) FROM approvals_approval WHERE item_id = NEW.id) < NEW.approvals_needed)
BEGIN
    SELECT RAISE(ABORT, 'four eyes: the owner of the agent that asked may not decide it, and two approvals come from two people');
END"""]


def triggers_dropped(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        for sql in SQLITE_DROP:
            schema_editor.execute(sql)


def triggers_restored(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        for sql in FOUR_EYES.SQLITE_FORWARD:
            schema_editor.execute(sql)


def forward(apps, schema_editor):
    for sql in [PG_FORWARD] if schema_editor.connection.vendor == "postgresql" else SQLITE_CREATE:
        schema_editor.execute(sql)


def backward(apps, schema_editor):
    for sql in [PG_BACKWARD] if schema_editor.connection.vendor == "postgresql" else SQLITE_DROP:
        schema_editor.execute(sql)


class Migration(migrations.Migration):

    dependencies = [
        ('approvals', '0011_decision_links'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RunPython(triggers_dropped, triggers_restored),
        migrations.AddField(
            model_name='approval',
            name='on_behalf_of',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL),
        ),
        migrations.AddField(
            model_name='reviewitem',
            name='decided_for',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL),
        ),
        migrations.CreateModel(
            name='Delegation',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('starts_at', models.DateTimeField()),
                ('ends_at', models.DateTimeField()),
                ('reason', models.TextField()),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('revoked_at', models.DateTimeField(blank=True, null=True)),
                ('delegate', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='delegations_taken', to=settings.AUTH_USER_MODEL)),
                ('person', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='delegations_given', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'ordering': ['-starts_at', '-id'],
                'indexes': [models.Index(fields=['delegate', 'ends_at'], name='delegation_taken_idx'), models.Index(fields=['person', 'ends_at'], name='delegation_given_idx')],
                'constraints': [models.CheckConstraint(condition=models.Q(('ends_at__gt', models.F('starts_at'))), name='delegation_ends_after_start'), models.CheckConstraint(condition=models.Q(('delegate', models.F('person')), _negated=True), name='delegation_not_to_oneself')],
            },
        ),
        migrations.RunPython(forward, backward),
    ]
