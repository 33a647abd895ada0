"""The database refuses an overlapping pending or confirmed booking of the same resource.

An exclusion constraint (PostgreSQL, with btree_gist for the equality on the resource).
SQLite has none: there the intake's overlap check under its IMMEDIATE transaction holds.
"""

from django.db import migrations

FORWARD = """
CREATE EXTENSION IF NOT EXISTS btree_gist;
ALTER TABLE ledger_booking ADD CONSTRAINT booking_no_overlap EXCLUDE USING gist (
    resource WITH =, tstzrange(start, "end", '[)') WITH &&
) WHERE (status IN ('pending', 'confirmed'));
"""
BACKWARD = "ALTER TABLE ledger_booking DROP CONSTRAINT booking_no_overlap;"


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FORWARD)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(BACKWARD)


class Migration(migrations.Migration):
    dependencies = [("ledger", "0007_booking")]
    operations = [migrations.RunPython(forward, backward)]
