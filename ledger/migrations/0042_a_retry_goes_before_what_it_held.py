"""A failed action's new attempt is refused only while another action runs on its target or customer,
or one is held there since before it was requested: a failure that may be retried keeps what it held,
and its retry goes on before them (decision 18). SQL frozen here as `manage.py dbrules ledger` printed
it; backwards, 0015's rule (every action in flight, held ones too)."""

from django.db import migrations

PG_FUNCTION = r"""
CREATE OR REPLACE FUNCTION ledger_action_requeue_same_subject() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM ledger_lock_subjects(NEW.target, NEW.customer);
    IF EXISTS (SELECT 1 FROM ledger_action a WHERE a.id <> NEW.id AND a.target = NEW.target AND {ahead})
       OR (NEW.customer <> '' AND EXISTS (
           SELECT 1 FROM ledger_action a WHERE a.id <> NEW.id AND a.customer = NEW.customer AND {ahead}))
    THEN
        RAISE EXCEPTION USING MESSAGE = 'another action is in flight for the same target or customer: '
                                        || NEW.operation_key || ' must be held, not queued',
                              ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END $$;
"""
SQLITE_TRIGGER = r"""CREATE TRIGGER ledger_action_requeue_same_subject BEFORE UPDATE OF status ON ledger_action
WHEN OLD.status = 'failed' AND NEW.status = 'queued' AND (
    EXISTS (SELECT 1 FROM ledger_action a WHERE a.id <> NEW.id AND a.target = NEW.target AND {ahead})
    OR (NEW.customer <> '' AND EXISTS (
        SELECT 1 FROM ledger_action a WHERE a.id <> NEW.id AND a.customer = NEW.customer AND {ahead})))
BEGIN
    SELECT RAISE(ABORT, 'another action is in flight for the same target or customer: it must be held, not queued');
END"""
BEFORE_IT = ("(a.status IN ('queued', 'awaiting_approval', 'pending', 'unknown', 'needs_review') "
             "OR (a.status = 'held' AND a.id < NEW.id))")
IN_FLIGHT = "a.status IN ('queued', 'awaiting_approval', 'held', 'pending', 'unknown', 'needs_review')"


def _install(ahead):
    def install(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(PG_FUNCTION.replace("{ahead}", ahead))
            return
        schema_editor.execute("DROP TRIGGER IF EXISTS ledger_action_requeue_same_subject")
        schema_editor.execute(SQLITE_TRIGGER.replace("{ahead}", ahead))
    return install


class Migration(migrations.Migration):

    dependencies = [
        ("ledger", "0041_grants_bound_to_the_connector"),
    ]

    operations = [
        migrations.RunPython(_install(BEFORE_IT), _install(IN_FLIGHT)),
    ]
