"""The audit trail in partitions by ranges of id (PostgreSQL; ledger.partitions keeps them).

A unique index on a partitioned table must hold the partition key, so `audit_seq_unique` gives
way to a plain index on `seq`, and the seal's rule now refuses a seq already held, under the
sealer's own lock (ledger.dbrules.AUDIT_APPEND_ONLY; on SQLite ledger_audit_no_update).

The conversion works on a populated table without rewriting it: the table becomes the first
partition (ids below the next one), attached after a CHECK validated beforehand so the attach
need not scan it, under a parent that takes its name, its indexes and its trigger; the identity
becomes a sequence the parent owns, starting where the identity was. A default partition takes
any id above the partitions made so far (the sweeper makes them ahead: ledger.partitions).
Not reversible: going back would copy every event into a plain table.
"""

import importlib

from django.db import migrations, models

# The seal's rule of 0031, with the seq it seals checked as not yet held (SQL frozen as
# `manage.py dbrules ledger` printed it).
PG_RULE = r"""
CREATE OR REPLACE FUNCTION ledger_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    expected_prev text := '';
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.seq IS NULL AND NEW.seq IS NOT NULL
       AND (to_jsonb(NEW) - 'seq' - 'prev_hash' - 'hash') = (to_jsonb(OLD) - 'seq' - 'prev_hash' - 'hash') THEN
        -- The sealer's lock (ledger.locks.AUDIT_SEAL), already its own: seals take turns, so the
        -- check below sees every seal committed before this one.
        PERFORM pg_advisory_xact_lock(361478, 1);
        IF NEW.seq > 1 THEN
            SELECT hash INTO expected_prev FROM ledger_auditevent WHERE seq = NEW.seq - 1;  -- NULL if none
        END IF;
        IF NEW.prev_hash IS DISTINCT FROM expected_prev
           OR NEW.hash <> encode(sha256(convert_to(NEW.prev_hash || NEW.content_hash || NEW.seq::text, 'UTF8')), 'hex')
           OR EXISTS (SELECT 1 FROM ledger_auditevent WHERE seq = NEW.seq)
        THEN
            RAISE EXCEPTION USING MESSAGE = 'audit events are append-only: a seal must be the next link of the chain',
                                  ERRCODE = 'insufficient_privilege';
        END IF;
        RETURN NEW;  -- the seal (AuditEventManager.seal)
    END IF;
    IF TG_OP = 'DELETE' AND OLD.seq < (SELECT max(c.seq) FROM ledger_archive a JOIN ledger_chaincheckpoint c ON c.id = a.checkpoint_id) THEN
        RETURN OLD;  -- archived (dlq.archive)
    END IF;
    RAISE EXCEPTION USING MESSAGE = 'audit events are append-only: ' || TG_OP || ' refused',
                          ERRCODE = 'insufficient_privilege';
END $$;
"""
TRIGGER = ("CREATE TRIGGER ledger_audit_append_only BEFORE UPDATE OR DELETE ON ledger_auditevent "
           "FOR EACH ROW EXECUTE FUNCTION ledger_audit_append_only()")

CONTENT_COLUMNS = importlib.import_module("ledger.migrations.0010_audit_sealed_by_the_sweeper").CONTENT_COLUMNS
SQLITE_RULE = [
    "DROP TRIGGER ledger_audit_no_update",
    "CREATE TRIGGER ledger_audit_no_update BEFORE UPDATE ON ledger_auditevent "
    "WHEN OLD.seq IS NOT NULL OR NEW.seq IS NULL OR "
    + " OR ".join(f"NEW.{c} IS NOT OLD.{c}" for c in CONTENT_COLUMNS)
    + " OR EXISTS (SELECT 1 FROM ledger_auditevent e WHERE e.seq = NEW.seq)"
    + " BEGIN SELECT RAISE(ABORT, 'audit events are append-only (UPDATE refused)'); END",
]


def partition_by_id(cursor, table, triggers):
    """Turn `table` (an identity `id` primary key) into a table partitioned by ranges of id
    whose first partition is the table as it was; `triggers` are the CREATE TRIGGER statements
    to make on the parent (the table's own go with it, and are dropped from the partition)."""
    first, default, sequence = f"{table}_first", f"{table}_default", f"{table}_id_seq"
    cursor.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
    cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s AND indexname <> %s",
                   [table, f"{table}_pkey"])
    indexes = cursor.fetchall()
    cursor.execute(f"SELECT coalesce(max(id), 0) + 1 FROM {table}")
    bound = cursor.fetchone()[0]
    cursor.execute("SELECT pg_get_serial_sequence(%s, 'id')", [table])
    identity = cursor.fetchone()[0]
    cursor.execute(f"SELECT last_value + CASE WHEN is_called THEN 1 ELSE 0 END FROM {identity}")
    start = max(cursor.fetchone()[0], bound)
    cursor.execute(f"SELECT tgname FROM pg_trigger WHERE tgrelid = '{table}'::regclass AND NOT tgisinternal")
    own_triggers = [name for (name,) in cursor.fetchall()]

    cursor.execute(f"ALTER TABLE {table} RENAME TO {first}")
    cursor.execute(f"ALTER INDEX {table}_pkey RENAME TO {first}_pkey")
    for name, _ in indexes:
        cursor.execute(f"ALTER INDEX {name} RENAME TO {name}_first")
    for name in own_triggers:
        cursor.execute(f"DROP TRIGGER {name} ON {first}")
    cursor.execute(f"ALTER TABLE {first} ALTER COLUMN id DROP IDENTITY")
    cursor.execute(f"CREATE SEQUENCE {sequence} AS bigint START WITH {start}")
    cursor.execute(f"CREATE TABLE {table} (LIKE {first} INCLUDING DEFAULTS INCLUDING CONSTRAINTS) "
                   f"PARTITION BY RANGE (id)")
    cursor.execute(f"ALTER TABLE {table} ALTER COLUMN id SET DEFAULT nextval('{sequence}')")
    cursor.execute(f"ALTER SEQUENCE {sequence} OWNED BY {table}.id")
    cursor.execute(f"ALTER TABLE {table} ADD CONSTRAINT {table}_pkey PRIMARY KEY (id)")
    for _, definition in indexes:  # as it was on the table, so the parent's index takes the name
        cursor.execute(definition)
    # Validated first, so the attach trusts it rather than reading every row under its lock.
    cursor.execute(f"ALTER TABLE {first} ADD CONSTRAINT {first}_bound CHECK (id < {bound}) NOT VALID")
    cursor.execute(f"ALTER TABLE {first} VALIDATE CONSTRAINT {first}_bound")
    cursor.execute(f"ALTER TABLE {table} ATTACH PARTITION {first} FOR VALUES FROM (MINVALUE) TO ({bound})")
    cursor.execute(f"ALTER TABLE {first} DROP CONSTRAINT {first}_bound")
    cursor.execute(f"CREATE TABLE {default} PARTITION OF {table} DEFAULT")
    for statement in triggers:
        cursor.execute(statement)


def forward(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        for sql in SQLITE_RULE:
            schema_editor.execute(sql)
        return
    schema_editor.execute(PG_RULE)
    with schema_editor.connection.cursor() as cursor:
        partition_by_id(cursor, "ledger_auditevent", [TRIGGER])


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0031_archive_runs'),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='auditevent',
            name='audit_seq_unique',
        ),
        migrations.AddIndex(
            model_name='auditevent',
            index=models.Index(condition=models.Q(('seq__isnull', False)), fields=['seq'], name='audit_seq_idx'),
        ),
        migrations.RunPython(forward),
    ]
