"""The same-object rule, held by the database: an action inserted `queued` or
`awaiting_approval` while another action on its target or customer is in flight (queued,
pending, unknown, awaiting_approval, held, needs_review) is stored `held`.

PostgreSQL: a BEFORE INSERT trigger first takes the advisory locks of the row's target and
customer (`ledger_lock_subjects`, which Python calls too, so both derive the same keys and
take them in the same order), then looks: each statement of a trigger function reads a
fresh snapshot, so it sees every action committed by whoever held those locks before it.
Two requests for one order can no longer both find "nothing in flight". The INSERT's
RETURNING shows the status it was stored with.

SQLite: writers are serialised (IMMEDIATE transactions); an AFTER INSERT trigger holds the
new row, and the caller reads the status back (RETURNING does not show an AFTER trigger's
change). A later migration that rebuilds ledger_action on SQLite drops this trigger: create
it again there, as 0011 does for the audit triggers.
"""

from django.db import migrations

IN_FLIGHT = "('queued', 'pending', 'unknown', 'awaiting_approval', 'held', 'needs_review')"

PG_FORWARD = rf"""
CREATE FUNCTION ledger_lock_subjects(p_target text, p_customer text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    -- In one order, so that two transactions never wait on each other's second lock.
    PERFORM pg_advisory_xact_lock(k) FROM (
        SELECT DISTINCT hashtextextended(s, 0) AS k
          FROM unnest(ARRAY['target:' || p_target,
                            CASE WHEN p_customer <> '' THEN 'customer:' || p_customer END]) AS s
         WHERE s IS NOT NULL
         ORDER BY 1) AS keys;
END $$;

CREATE FUNCTION ledger_action_same_subject() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM ledger_lock_subjects(NEW.target, NEW.customer);
    IF NEW.status IN ('queued', 'awaiting_approval') AND (
        EXISTS (SELECT 1 FROM ledger_action a WHERE a.target = NEW.target AND a.status IN {IN_FLIGHT})
        OR (NEW.customer <> '' AND EXISTS (
            SELECT 1 FROM ledger_action a WHERE a.customer = NEW.customer AND a.status IN {IN_FLIGHT}))
    ) THEN
        NEW.status := 'held';
        NEW.next_attempt_at := NULL;
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER ledger_action_same_subject BEFORE INSERT ON ledger_action
    FOR EACH ROW EXECUTE FUNCTION ledger_action_same_subject();
"""

PG_BACKWARD = """
DROP TRIGGER ledger_action_same_subject ON ledger_action;
DROP FUNCTION ledger_action_same_subject();
DROP FUNCTION ledger_lock_subjects(text, text);
"""

SQLITE_FORWARD = f"""
CREATE TRIGGER ledger_action_same_subject AFTER INSERT ON ledger_action
WHEN NEW.status IN ('queued', 'awaiting_approval') AND (
    EXISTS (SELECT 1 FROM ledger_action a WHERE a.id <> NEW.id AND a.target = NEW.target AND a.status IN {IN_FLIGHT})
    OR (NEW.customer <> '' AND EXISTS (
        SELECT 1 FROM ledger_action a WHERE a.id <> NEW.id AND a.customer = NEW.customer AND a.status IN {IN_FLIGHT})))
BEGIN
    UPDATE ledger_action SET status = 'held', next_attempt_at = NULL WHERE id = NEW.id;
END;
"""

SQLITE_BACKWARD = "DROP TRIGGER ledger_action_same_subject;"


def forward(apps, schema_editor):
    schema_editor.execute(PG_FORWARD if schema_editor.connection.vendor == "postgresql" else SQLITE_FORWARD)


def backward(apps, schema_editor):
    schema_editor.execute(PG_BACKWARD if schema_editor.connection.vendor == "postgresql" else SQLITE_BACKWARD)


class Migration(migrations.Migration):
    dependencies = [("ledger", "0013_lost_rows_refused")]
    operations = [migrations.RunPython(forward, backward)]
