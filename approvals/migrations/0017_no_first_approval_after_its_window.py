"""No approval is recorded for an item once its window has closed (`expires_at`, on the database's
clock): the first of two approvals, given then, would have stood as a stray row. SQL frozen here as
`manage.py dbrules approvals` printed it."""

from django.db import migrations

PG_FORWARD = r"""
CREATE OR REPLACE FUNCTION approvals_approval_not_after_expiry() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM approvals_reviewitem i WHERE i.id = NEW.item_id AND i.expires_at IS NOT NULL AND i.expires_at <= clock_timestamp()) THEN
        RAISE EXCEPTION USING MESSAGE = 'an approval is not given after its window closed',
                              ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER approvals_approval_not_after_expiry BEFORE INSERT ON approvals_approval
    FOR EACH ROW EXECUTE FUNCTION approvals_approval_not_after_expiry();
"""
PG_BACKWARD = """
DROP TRIGGER IF EXISTS approvals_approval_not_after_expiry ON approvals_approval;
DROP FUNCTION IF EXISTS approvals_approval_not_after_expiry();
"""
SQLITE_FORWARD = r"""CREATE TRIGGER approvals_approval_not_after_expiry BEFORE INSERT ON approvals_approval
WHEN EXISTS (SELECT 1 FROM approvals_reviewitem i WHERE i.id = NEW.item_id AND i.expires_at IS NOT NULL AND i.expires_at <= strftime('%Y-%m-%d %H:%M:%f', 'now'))
BEGIN
    SELECT RAISE(ABORT, 'an approval is not given after its window closed');
END"""
SQLITE_BACKWARD = "DROP TRIGGER IF EXISTS approvals_approval_not_after_expiry"


def forward(apps, schema_editor):
    schema_editor.execute(PG_FORWARD if schema_editor.connection.vendor == "postgresql" else SQLITE_FORWARD)


def backward(apps, schema_editor):
    schema_editor.execute(PG_BACKWARD if schema_editor.connection.vendor == "postgresql" else SQLITE_BACKWARD)


class Migration(migrations.Migration):

    dependencies = [
        ('approvals', '0016_no_approval_after_its_window'),
    ]

    operations = [
        migrations.RunPython(forward, backward),
    ]
