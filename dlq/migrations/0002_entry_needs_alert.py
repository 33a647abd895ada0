"""A dead-letter entry without an alert is a defect, so the database refuses to commit one.

A deferred constraint trigger checks at commit, when the entry's transaction has had the
chance to write its alert. (PostgreSQL only; SQLite runs the same code path, unchecked.)
"""

from django.db import migrations

FORWARD = r"""
CREATE FUNCTION dlq_entry_needs_alert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM dlq_alert WHERE dead_letter_id = NEW.id) THEN
        RAISE EXCEPTION USING MESSAGE = 'dead-letter entry ' || NEW.id || ' has no alert',
                              ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NULL;
END $$;

CREATE CONSTRAINT TRIGGER dlq_entry_needs_alert AFTER INSERT ON dlq_deadletter
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION dlq_entry_needs_alert();
"""
BACKWARD = """
DROP TRIGGER dlq_entry_needs_alert ON dlq_deadletter;
DROP FUNCTION dlq_entry_needs_alert();
"""


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FORWARD)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(BACKWARD)


class Migration(migrations.Migration):
    dependencies = [("dlq", "0001_initial")]
    operations = [migrations.RunPython(forward, backward)]
