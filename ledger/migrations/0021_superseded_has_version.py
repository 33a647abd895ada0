"""A superseded action is replaced by its version, or the database refuses to commit it: a
deferred constraint trigger checks at commit, when the version has been written
(ledger.dbrules.SUPERSEDED_HAS_VERSION). It fires only for a move to `superseded`, so the
ledger's other moves queue nothing. PostgreSQL only; SQLite runs the same code path, unchecked.
"""

from django.db import migrations

FORWARD = r"""
CREATE OR REPLACE FUNCTION ledger_action_superseded_has_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'superseded'
       AND NOT EXISTS (SELECT 1 FROM ledger_action v WHERE v.supersedes_id = NEW.id) THEN
        RAISE EXCEPTION USING MESSAGE = 'action ' || NEW.operation_key || ' is superseded by no version',
                              ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NULL;
END $$;

CREATE CONSTRAINT TRIGGER ledger_action_superseded_has_version AFTER UPDATE OF status ON ledger_action
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.status = 'superseded')
    EXECUTE FUNCTION ledger_action_superseded_has_version();
"""
BACKWARD = """
DROP TRIGGER ledger_action_superseded_has_version ON ledger_action;
DROP FUNCTION ledger_action_superseded_has_version();
"""


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FORWARD)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(BACKWARD)


class Migration(migrations.Migration):
    dependencies = [("ledger", "0020_approvals_bound_versions_expiry")]
    operations = [migrations.RunPython(forward, backward)]
