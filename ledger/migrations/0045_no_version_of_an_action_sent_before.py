"""An action sent to its provider before is never edited into a version: the database refuses the
version's insert (ledger.dbrules.VERSION_OF_UNSENT and its SQLite pair; SQL frozen as `manage.py
dbrules ledger` printed it). A trigger on insert, fired only for a version: safe on a populated
ledger, and nothing else written pays for it."""

from django.db import migrations

FORWARD = r"""
CREATE OR REPLACE FUNCTION ledger_action_version_of_unsent() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM ledger_action o WHERE o.id = NEW.supersedes_id AND o.attempts > 0) THEN
        RAISE EXCEPTION USING MESSAGE = 'action ' || NEW.operation_key
                                        || ' is a version of an action sent to its provider before',
                              ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER ledger_action_version_of_unsent BEFORE INSERT ON ledger_action
    FOR EACH ROW WHEN (NEW.supersedes_id IS NOT NULL) EXECUTE FUNCTION ledger_action_version_of_unsent();
"""
BACKWARD = """
DROP TRIGGER ledger_action_version_of_unsent ON ledger_action;
DROP FUNCTION ledger_action_version_of_unsent();
"""
SQLITE_FORWARD = """CREATE TRIGGER ledger_action_version_of_unsent BEFORE INSERT ON ledger_action
WHEN NEW.supersedes_id IS NOT NULL
    AND EXISTS (SELECT 1 FROM ledger_action o WHERE o.id = NEW.supersedes_id AND o.attempts > 0)
BEGIN
    SELECT RAISE(ABORT, 'a version of an action sent to its provider before');
END"""
SQLITE_BACKWARD = "DROP TRIGGER ledger_action_version_of_unsent"


def forward(apps, schema_editor):
    schema_editor.execute(FORWARD if schema_editor.connection.vendor == "postgresql" else SQLITE_FORWARD)


def backward(apps, schema_editor):
    schema_editor.execute(BACKWARD if schema_editor.connection.vendor == "postgresql" else SQLITE_BACKWARD)


class Migration(migrations.Migration):

    dependencies = [
        ("ledger", "0044_refund_task_notify_in_one_spelling"),
    ]

    operations = [
        migrations.RunPython(forward, backward),
    ]
