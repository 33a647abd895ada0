"""A failed action a person did by hand (ledger.actions.action_done_by_hand) is final in the database:
an update that changes its status or takes off its `done_by_hand` mark is refused, whatever code or
statement writes it, since a retry would make the person's refund or booking again
(ledger.dbrules.DONE_BY_HAND_FINAL and its SQLite pair; SQL frozen as `manage.py dbrules ledger`
printed it). The trigger fires only for an update of the status or the error of a row already done by
hand: no other write pays for it, deletes (the archive's) are left alone, and no row breaks it when it
is installed, as it looks only at updates."""

from django.db import migrations

FORWARD = r"""
CREATE OR REPLACE FUNCTION ledger_action_done_by_hand_final() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status IS DISTINCT FROM OLD.status OR NEW.error -> 'done_by_hand' IS DISTINCT FROM 'true'::jsonb THEN
        RAISE EXCEPTION USING MESSAGE = 'action ' || OLD.operation_key || ' was done by hand: its status and its '
                                        || 'done_by_hand mark stay, or a retry would make its effect again',
                              ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER ledger_action_done_by_hand_final BEFORE UPDATE OF status, error ON ledger_action
    FOR EACH ROW WHEN (OLD.status = 'failed' AND OLD.error -> 'done_by_hand' = 'true'::jsonb)
    EXECUTE FUNCTION ledger_action_done_by_hand_final();
"""
BACKWARD = """
DROP TRIGGER ledger_action_done_by_hand_final ON ledger_action;
DROP FUNCTION ledger_action_done_by_hand_final();
"""
SQLITE_FORWARD = """CREATE TRIGGER ledger_action_done_by_hand_final BEFORE UPDATE OF status, error ON ledger_action
WHEN OLD.status = 'failed' AND json_type(OLD.error, '$.done_by_hand') = 'true'
    AND (NEW.status IS NOT OLD.status OR json_type(NEW.error, '$.done_by_hand') IS NOT 'true')
BEGIN
    SELECT RAISE(ABORT, 'an action done by hand keeps its status and its done_by_hand mark');
END"""
SQLITE_BACKWARD = "DROP TRIGGER ledger_action_done_by_hand_final"


def forward(apps, schema_editor):
    schema_editor.execute(FORWARD if schema_editor.connection.vendor == "postgresql" else SQLITE_FORWARD)


def backward(apps, schema_editor):
    schema_editor.execute(BACKWARD if schema_editor.connection.vendor == "postgresql" else SQLITE_BACKWARD)


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0050_shadow_rows_hold_no_decision'),
    ]

    operations = [
        migrations.RunPython(forward, backward),
    ]
