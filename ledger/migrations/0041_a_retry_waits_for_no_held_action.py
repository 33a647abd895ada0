"""A retried failure waits only for what runs or waits for a person on its target or customer,
not for an action held there: that one may be held behind the failure itself (a failure that may
be retried keeps what it held), and the retry, held behind it in turn, left both waiting for good.
(ledger.dbrules.REQUEUE_SAME_SUBJECT and its SQLite pair; SQL frozen as `manage.py dbrules
ledger` printed it.)"""

from django.db import migrations

PG_FORWARD = r"""
CREATE OR REPLACE FUNCTION ledger_action_requeue_same_subject() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM ledger_lock_subjects(NEW.target, NEW.customer);
    IF EXISTS (SELECT 1 FROM ledger_action a WHERE a.id <> NEW.id AND a.target = NEW.target AND a.status IN ('queued', 'awaiting_approval', 'pending', 'unknown', 'needs_review'))
       OR (NEW.customer <> '' AND EXISTS (
           SELECT 1 FROM ledger_action a WHERE a.id <> NEW.id AND a.customer = NEW.customer AND a.status IN ('queued', 'awaiting_approval', 'pending', 'unknown', 'needs_review')))
    THEN
        RAISE EXCEPTION USING MESSAGE = 'another action is in flight for the same target or customer: '
                                        || NEW.operation_key || ' must be held, not queued',
                              ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END $$;
"""
PG_BACKWARD = r"""
CREATE OR REPLACE FUNCTION ledger_action_requeue_same_subject() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM ledger_lock_subjects(NEW.target, NEW.customer);
    IF EXISTS (SELECT 1 FROM ledger_action a WHERE a.id <> NEW.id AND a.target = NEW.target AND a.status IN ('queued', 'awaiting_approval', 'held', 'pending', 'unknown', 'needs_review'))
       OR (NEW.customer <> '' AND EXISTS (
           SELECT 1 FROM ledger_action a WHERE a.id <> NEW.id AND a.customer = NEW.customer AND a.status IN ('queued', 'awaiting_approval', 'held', 'pending', 'unknown', 'needs_review')))
    THEN
        RAISE EXCEPTION USING MESSAGE = 'another action is in flight for the same target or customer: '
                                        || NEW.operation_key || ' must be held, not queued',
                              ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END $$;
"""
SQLITE_FORWARD = r"""CREATE TRIGGER ledger_action_requeue_same_subject BEFORE UPDATE OF status ON ledger_action
WHEN OLD.status = 'failed' AND NEW.status = 'queued' AND (
    EXISTS (SELECT 1 FROM ledger_action a WHERE a.id <> NEW.id AND a.target = NEW.target AND a.status IN ('queued', 'awaiting_approval', 'pending', 'unknown', 'needs_review'))
    OR (NEW.customer <> '' AND EXISTS (
        SELECT 1 FROM ledger_action a WHERE a.id <> NEW.id AND a.customer = NEW.customer AND a.status IN ('queued', 'awaiting_approval', 'pending', 'unknown', 'needs_review'))))
BEGIN
    SELECT RAISE(ABORT, 'another action is in flight for the same target or customer: it must be held, not queued');
END"""
SQLITE_BACKWARD = r"""CREATE TRIGGER ledger_action_requeue_same_subject BEFORE UPDATE OF status ON ledger_action
WHEN OLD.status = 'failed' AND NEW.status = 'queued' AND (
    EXISTS (SELECT 1 FROM ledger_action a WHERE a.id <> NEW.id AND a.target = NEW.target AND a.status IN ('queued', 'awaiting_approval', 'held', 'pending', 'unknown', 'needs_review'))
    OR (NEW.customer <> '' AND EXISTS (
        SELECT 1 FROM ledger_action a WHERE a.id <> NEW.id AND a.customer = NEW.customer AND a.status IN ('queued', 'awaiting_approval', 'held', 'pending', 'unknown', 'needs_review'))))
BEGIN
    SELECT RAISE(ABORT, 'another action is in flight for the same target or customer: it must be held, not queued');
END"""


def install(trigger, function):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(function)
        else:
            schema_editor.execute("DROP TRIGGER IF EXISTS ledger_action_requeue_same_subject")
            schema_editor.execute(trigger)
    return run


class Migration(migrations.Migration):
    dependencies = [("ledger", "0040_archives_signed_and_append_only")]
    operations = [migrations.RunPython(install(SQLITE_FORWARD, PG_FORWARD), install(SQLITE_BACKWARD, PG_BACKWARD))]
