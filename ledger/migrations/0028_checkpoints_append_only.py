"""The chain's checkpoints are append-only in the database, as the audit events are
(ledger.dbrules.CHECKPOINT_APPEND_ONLY and its SQLite pair; SQL frozen as `manage.py dbrules
ledger` printed it): the daily check trusts a checkpoint instead of the events before it."""

from django.db import migrations

FORWARD = r"""
CREATE OR REPLACE FUNCTION ledger_checkpoint_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING MESSAGE = 'chain checkpoints are append-only: ' || TG_OP || ' refused',
                          ERRCODE = 'insufficient_privilege';
END $$;

CREATE TRIGGER ledger_checkpoint_append_only BEFORE UPDATE OR DELETE ON ledger_chaincheckpoint
    FOR EACH ROW EXECUTE FUNCTION ledger_checkpoint_append_only();
"""
BACKWARD = """
DROP TRIGGER ledger_checkpoint_append_only ON ledger_chaincheckpoint;
DROP FUNCTION ledger_checkpoint_append_only();
"""
SQLITE_FORWARD = [
    "CREATE TRIGGER ledger_checkpoint_no_update BEFORE UPDATE ON ledger_chaincheckpoint "
    "BEGIN SELECT RAISE(ABORT, 'chain checkpoints are append-only (UPDATE refused)'); END",
    "CREATE TRIGGER ledger_checkpoint_no_delete BEFORE DELETE ON ledger_chaincheckpoint "
    "BEGIN SELECT RAISE(ABORT, 'chain checkpoints are append-only (DELETE refused)'); END",
]
SQLITE_BACKWARD = ["DROP TRIGGER ledger_checkpoint_no_update", "DROP TRIGGER ledger_checkpoint_no_delete"]


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FORWARD)
    else:
        for sql in SQLITE_FORWARD:
            schema_editor.execute(sql)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(BACKWARD)
    else:
        for sql in SQLITE_BACKWARD:
            schema_editor.execute(sql)


class Migration(migrations.Migration):
    dependencies = [("ledger", "0027_audit_checkpoints")]
    operations = [migrations.RunPython(forward, backward)]
