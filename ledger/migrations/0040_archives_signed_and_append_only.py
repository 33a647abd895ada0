"""An archive run's row is signed as it is written and append-only in the database
(ledger.retention.Archive, ledger.dbrules.ARCHIVE_APPEND_ONLY and its SQLite pair; SQL frozen as
`manage.py dbrules ledger` printed it): the chain's checks start from the checkpoint it names.
The rows written so far are signed here, before the rule stops their change; and a row without a
signature is refused from now on: one that a run on the code before this wrote while the database
was already migrated would let the run's events go, and, append-only and unsigned, leave the
chain's checks reporting them missing for good. (That run then rolls back, leaving its file an
orphan no row names.)"""

from django.db import migrations, models

FORWARD = r"""
CREATE OR REPLACE FUNCTION ledger_archive_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING MESSAGE = 'archive runs are append-only: ' || TG_OP || ' refused',
                          ERRCODE = 'insufficient_privilege';
END $$;

CREATE TRIGGER ledger_archive_append_only BEFORE UPDATE OR DELETE ON ledger_archive
    FOR EACH ROW EXECUTE FUNCTION ledger_archive_append_only();

ALTER TABLE ledger_archive ADD CONSTRAINT ledger_archive_signed CHECK (signature IS NOT NULL);
"""
BACKWARD = """
ALTER TABLE ledger_archive DROP CONSTRAINT ledger_archive_signed;
DROP TRIGGER ledger_archive_append_only ON ledger_archive;
DROP FUNCTION ledger_archive_append_only();
"""
SQLITE_FORWARD = [
    "CREATE TRIGGER ledger_archive_no_update BEFORE UPDATE ON ledger_archive "
    "BEGIN SELECT RAISE(ABORT, 'archive runs are append-only (UPDATE refused)'); END",
    "CREATE TRIGGER ledger_archive_no_delete BEFORE DELETE ON ledger_archive "
    "BEGIN SELECT RAISE(ABORT, 'archive runs are append-only (DELETE refused)'); END",
    # A CHECK added to an SQLite table rebuilds it, which the audit trail's delete rule (naming
    # this table) forbids: a trigger holds the same rule.
    "CREATE TRIGGER ledger_archive_signed BEFORE INSERT ON ledger_archive WHEN NEW.signature IS NULL "
    "BEGIN SELECT RAISE(ABORT, 'an archive run is signed (an unsigned row refused)'); END",
]
SQLITE_BACKWARD = ["DROP TRIGGER ledger_archive_no_update", "DROP TRIGGER ledger_archive_no_delete",
                   "DROP TRIGGER ledger_archive_signed"]


def sign_and_close(apps, schema_editor):
    from ledger.retention import archive_signature

    Archive = apps.get_model("ledger", "Archive")
    for archive in Archive.objects.select_related("checkpoint"):
        archive.signature = archive_signature(archive.file, archive.sha256, archive.checkpoint)
        archive.save(update_fields=["signature"])
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FORWARD)
    else:
        for sql in SQLITE_FORWARD:
            schema_editor.execute(sql)


def open_again(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(BACKWARD)
    else:
        for sql in SQLITE_BACKWARD:
            schema_editor.execute(sql)


class Migration(migrations.Migration):
    dependencies = [("ledger", "0039_token_issued_by")]
    operations = [
        migrations.AddField("archive", "signature", models.CharField(max_length=100, null=True)),
        migrations.RunPython(sign_and_close, open_again),
    ]
