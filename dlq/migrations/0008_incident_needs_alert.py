"""An incident without its alert would be a silent one, so the database refuses to commit it.

As for dead-letter entries (0002): a deferred constraint trigger checks at commit, when the
incident's transaction has had the chance to write its alert. PostgreSQL only; SQLite runs
the same code path, unchecked.
"""

from django.db import migrations

FORWARD = r"""
CREATE OR REPLACE FUNCTION dlq_incident_needs_alert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM dlq_alert WHERE incident_id = NEW.id) THEN
        RAISE EXCEPTION USING MESSAGE = 'incident ' || NEW.id || ' has no alert',
                              ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NULL;
END $$;

CREATE CONSTRAINT TRIGGER dlq_incident_needs_alert AFTER INSERT ON dlq_incident
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION dlq_incident_needs_alert();
"""
BACKWARD = """
DROP TRIGGER dlq_incident_needs_alert ON dlq_incident;
DROP FUNCTION dlq_incident_needs_alert();
"""


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FORWARD)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(BACKWARD)


class Migration(migrations.Migration):
    dependencies = [("dlq", "0007_incidents")]
    operations = [migrations.RunPython(forward, backward)]
