"""Rules from one source (ledger/dbrules.py), and the same-object rule on a new attempt.

1. The in-flight status list is rendered from ActionStatus (in its order) rather than typed
   out; the insert trigger of 0014 is installed again as rendered.
2. A failed action goes back to `queued` only while nothing else is in flight on its target
   or customer: the database refuses that update otherwise (action_retry holds it instead),
   with the locks the insert takes (`ledger_lock_subjects`), whatever code writes it.

The SQL is frozen here as `manage.py dbrules ledger` printed it; tests/ledger/test_dbrules.py
compares the database with the current rendering.
"""

from django.db import migrations

PG_FORWARD = r"""
CREATE OR REPLACE FUNCTION ledger_action_same_subject() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM ledger_lock_subjects(NEW.target, NEW.customer);
    IF NEW.status IN ('queued', 'awaiting_approval') AND (
        EXISTS (SELECT 1 FROM ledger_action a WHERE a.target = NEW.target AND a.status IN ('queued', 'awaiting_approval', 'held', 'pending', 'unknown', 'needs_review'))
        OR (NEW.customer <> '' AND EXISTS (
            SELECT 1 FROM ledger_action a WHERE a.customer = NEW.customer AND a.status IN ('queued', 'awaiting_approval', 'held', 'pending', 'unknown', 'needs_review')))
    ) THEN
        NEW.status := 'held';
        NEW.next_attempt_at := NULL;
    END IF;
    RETURN NEW;
END $$;
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

CREATE TRIGGER ledger_action_requeue_same_subject BEFORE UPDATE OF status ON ledger_action
    FOR EACH ROW WHEN (OLD.status = 'failed' AND NEW.status = 'queued')
    EXECUTE FUNCTION ledger_action_requeue_same_subject();
"""

# (The insert trigger's earlier body listed the same statuses in another order: left as is.)
PG_BACKWARD = """
DROP TRIGGER ledger_action_requeue_same_subject ON ledger_action;
DROP FUNCTION ledger_action_requeue_same_subject();
"""

SQLITE_FORWARD = [
    r"""DROP TRIGGER IF EXISTS ledger_action_same_subject""",
    r"""CREATE TRIGGER ledger_action_same_subject AFTER INSERT ON ledger_action
WHEN NEW.status IN ('queued', 'awaiting_approval') AND (
    EXISTS (SELECT 1 FROM ledger_action a WHERE a.id <> NEW.id AND a.target = NEW.target AND a.status IN ('queued', 'awaiting_approval', 'held', 'pending', 'unknown', 'needs_review'))
    OR (NEW.customer <> '' AND EXISTS (
        SELECT 1 FROM ledger_action a WHERE a.id <> NEW.id AND a.customer = NEW.customer AND a.status IN ('queued', 'awaiting_approval', 'held', 'pending', 'unknown', 'needs_review'))))
BEGIN
    UPDATE ledger_action SET status = 'held', next_attempt_at = NULL WHERE id = NEW.id;
END""",
    r"""DROP TRIGGER IF EXISTS ledger_action_requeue_same_subject""",
    r"""CREATE TRIGGER ledger_action_requeue_same_subject BEFORE UPDATE OF status ON ledger_action
WHEN OLD.status = 'failed' AND NEW.status = 'queued' AND (
    EXISTS (SELECT 1 FROM ledger_action a WHERE a.id <> NEW.id AND a.target = NEW.target AND a.status IN ('queued', 'awaiting_approval', 'held', 'pending', 'unknown', 'needs_review'))
    OR (NEW.customer <> '' AND EXISTS (
        SELECT 1 FROM ledger_action a WHERE a.id <> NEW.id AND a.customer = NEW.customer AND a.status IN ('queued', 'awaiting_approval', 'held', 'pending', 'unknown', 'needs_review'))))
BEGIN
    SELECT RAISE(ABORT, 'another action is in flight for the same target or customer: it must be held, not queued');
END""",
]

SQLITE_BACKWARD = "DROP TRIGGER ledger_action_requeue_same_subject;"


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_FORWARD)
    else:
        for sql in SQLITE_FORWARD:
            schema_editor.execute(sql)


def backward(apps, schema_editor):
    schema_editor.execute(PG_BACKWARD if schema_editor.connection.vendor == "postgresql" else SQLITE_BACKWARD)


class Migration(migrations.Migration):
    dependencies = [("ledger", "0014_same_subject_held_by_the_database")]
    operations = [migrations.RunPython(forward, backward)]
