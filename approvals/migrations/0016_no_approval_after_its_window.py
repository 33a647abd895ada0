"""An approval item is not approved or edited down once its window has closed (`expires_at`, on the
database's clock), even before the sweeper's pass expires it. SQL frozen here as `manage.py dbrules
approvals` printed it."""

from django.db import migrations

PG_FORWARD = r"""
CREATE OR REPLACE FUNCTION approvals_not_after_expiry() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status = 'open' AND NEW.status IN ('approved', 'edited') AND NEW.expires_at IS NOT NULL AND NEW.expires_at <= clock_timestamp() THEN
        RAISE EXCEPTION USING MESSAGE = 'an approval is not given after its window closed',
                              ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER approvals_not_after_expiry BEFORE UPDATE OF status ON approvals_reviewitem
    FOR EACH ROW EXECUTE FUNCTION approvals_not_after_expiry();
"""
PG_BACKWARD = """
DROP TRIGGER IF EXISTS approvals_not_after_expiry ON approvals_reviewitem;
DROP FUNCTION IF EXISTS approvals_not_after_expiry();
"""
SQLITE_FORWARD = r"""CREATE TRIGGER approvals_not_after_expiry BEFORE UPDATE OF status ON approvals_reviewitem
WHEN OLD.status = 'open' AND NEW.status IN ('approved', 'edited') AND NEW.expires_at IS NOT NULL AND NEW.expires_at <= strftime('%Y-%m-%d %H:%M:%f', 'now')
BEGIN
    SELECT RAISE(ABORT, 'an approval is not given after its window closed');
END"""
SQLITE_BACKWARD = "DROP TRIGGER IF EXISTS approvals_not_after_expiry"


def forward(apps, schema_editor):
    schema_editor.execute(PG_FORWARD if schema_editor.connection.vendor == "postgresql" else SQLITE_FORWARD)


def backward(apps, schema_editor):
    schema_editor.execute(PG_BACKWARD if schema_editor.connection.vendor == "postgresql" else SQLITE_BACKWARD)


class Migration(migrations.Migration):

    dependencies = [
        ('approvals', '0015_four_eyes_for_the_token_holder'),
    ]

    operations = [
        migrations.RunPython(forward, backward),
    ]
