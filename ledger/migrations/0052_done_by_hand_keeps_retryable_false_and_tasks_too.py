"""Done by hand is final, held by the database, for more than an action's status and mark
(ledger.dbrules.done_by_hand_final; SQL frozen as `manage.py dbrules ledger` printed it).

An action done by hand (0051) keeps `retryable` false in its error too: the client and the MCP
server tell its agent from it whether it may retry. A task done by hand (its dead letter resolved:
ledger.tasks.task_actions_let_go) now has the same rule: its state, its last error's done_by_hand
mark and retryable false stay, or a raw update could queue it again and its runner would make what
the person made by hand (a step the work never reached has no action yet to refuse its retry).
Each trigger fires only for an update of the two columns of a row marked; deletes (the archive's)
are left alone, and no row breaks the rules when they are installed, as they look only at updates.
Reversed, the action's rule is 0051's again and the task's is dropped."""

import importlib

from django.db import migrations

DONE_BY_HAND_0051 = importlib.import_module("ledger.migrations.0051_done_by_hand_is_final")
rules = importlib.import_module("ledger.migrations.0048_audit_sealed_only_after_the_chains_end").rules

FORWARD = r"""
CREATE OR REPLACE FUNCTION ledger_action_done_by_hand_final() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status IS DISTINCT FROM OLD.status
       OR NEW.error -> 'done_by_hand' IS DISTINCT FROM 'true'::jsonb
       OR NEW.error -> 'retryable' IS DISTINCT FROM 'false'::jsonb THEN
        RAISE EXCEPTION USING MESSAGE = 'action ' || OLD.operation_key || ' was done by hand: its status, its done_by_hand mark and retryable false stay',
                              ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE OR REPLACE FUNCTION ledger_task_done_by_hand_final() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state IS DISTINCT FROM OLD.state
       OR NEW.last_error -> 'done_by_hand' IS DISTINCT FROM 'true'::jsonb
       OR NEW.last_error -> 'retryable' IS DISTINCT FROM 'false'::jsonb THEN
        RAISE EXCEPTION USING MESSAGE = 'task ' || OLD.task_id || ' was done by hand: its state, its done_by_hand mark and retryable false stay',
                              ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER ledger_task_done_by_hand_final BEFORE UPDATE OF state, last_error ON ledger_task
    FOR EACH ROW WHEN (OLD.last_error -> 'done_by_hand' = 'true'::jsonb)
    EXECUTE FUNCTION ledger_task_done_by_hand_final();
"""
BACKWARD = f"""
DROP TRIGGER ledger_task_done_by_hand_final ON ledger_task;
DROP FUNCTION ledger_task_done_by_hand_final();
{DONE_BY_HAND_0051.BACKWARD}
{DONE_BY_HAND_0051.FORWARD}
"""
SQLITE_FORWARD = [
    "DROP TRIGGER ledger_action_done_by_hand_final",
    """CREATE TRIGGER ledger_action_done_by_hand_final BEFORE UPDATE OF status, error ON ledger_action
WHEN OLD.status = 'failed' AND json_type(OLD.error, '$.done_by_hand') = 'true'
    AND (NEW.status IS NOT OLD.status OR json_type(NEW.error, '$.done_by_hand') IS NOT 'true'
         OR json_type(NEW.error, '$.retryable') IS NOT 'false')
BEGIN
    SELECT RAISE(ABORT, 'action done by hand: its status, its done_by_hand mark and retryable false stay');
END""",
    """CREATE TRIGGER ledger_task_done_by_hand_final BEFORE UPDATE OF state, last_error ON ledger_task
WHEN json_type(OLD.last_error, '$.done_by_hand') = 'true'
    AND (NEW.state IS NOT OLD.state OR json_type(NEW.last_error, '$.done_by_hand') IS NOT 'true'
         OR json_type(NEW.last_error, '$.retryable') IS NOT 'false')
BEGIN
    SELECT RAISE(ABORT, 'task done by hand: its state, its done_by_hand mark and retryable false stay');
END""",
]
SQLITE_BACKWARD = [
    "DROP TRIGGER ledger_task_done_by_hand_final",
    DONE_BY_HAND_0051.SQLITE_BACKWARD,
    DONE_BY_HAND_0051.SQLITE_FORWARD,
]


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0051_done_by_hand_is_final'),
    ]

    operations = [
        migrations.RunPython(rules(postgresql=FORWARD, sqlite=SQLITE_FORWARD),
                             rules(postgresql=BACKWARD, sqlite=SQLITE_BACKWARD)),
    ]
