"""The limits' version: one row, changed by the database on every change to approvals_limit
(any statement, any client), so that a process may keep the limits and know when its copy
is out of date. A version is never given twice, even after a rollback: on PostgreSQL it
comes from a sequence, on SQLite it is random (63 bits). Where the row is missing (a test
database emptied by TRUNCATE), the version reads as unknown and the limits are asked for
every time. As with 0014, a migration that rebuilds approvals_limit on SQLite drops its
triggers and must create them again."""

from django.db import migrations, models

PG_FORWARD = """
INSERT INTO approvals_limitsversion (id, version) VALUES (1, 0);
CREATE SEQUENCE approvals_limits_version_seq;
CREATE FUNCTION approvals_limits_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE approvals_limitsversion SET version = nextval('approvals_limits_version_seq');
    RETURN NULL;
END $$;
CREATE TRIGGER approvals_limits_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON approvals_limit
    FOR EACH STATEMENT EXECUTE FUNCTION approvals_limits_changed();
"""
PG_BACKWARD = """
DROP TRIGGER approvals_limits_changed ON approvals_limit;
DROP FUNCTION approvals_limits_changed();
DROP SEQUENCE approvals_limits_version_seq;
"""
SQLITE_FORWARD = ["INSERT INTO approvals_limitsversion (id, version) VALUES (1, 0);"] + [
    f"CREATE TRIGGER approvals_limits_{event.lower()} AFTER {event} ON approvals_limit "
    "BEGIN UPDATE approvals_limitsversion SET version = random(); END;"
    for event in ("INSERT", "UPDATE", "DELETE")
]
SQLITE_BACKWARD = [f"DROP TRIGGER approvals_limits_{event};" for event in ("insert", "update", "delete")]


def forward(apps, schema_editor):
    for sql in [PG_FORWARD] if schema_editor.connection.vendor == "postgresql" else SQLITE_FORWARD:
        schema_editor.execute(sql)


def backward(apps, schema_editor):
    for sql in [PG_BACKWARD] if schema_editor.connection.vendor == "postgresql" else SQLITE_BACKWARD:
        schema_editor.execute(sql)


class Migration(migrations.Migration):

    dependencies = [
        ("approvals", "0003_stricter_checks"),
    ]

    operations = [
        migrations.CreateModel(
            name="LimitsVersion",
            fields=[
                ("id", models.PositiveSmallIntegerField(default=1, primary_key=True, serialize=False)),
                ("version", models.BigIntegerField(default=0)),
            ],
            options={
                "constraints": [models.CheckConstraint(condition=models.Q(("id", 1)), name="limits_version_one_row")],
            },
        ),
        migrations.RunPython(forward, backward),
    ]
