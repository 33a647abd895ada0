"""The dead-letter queue's database rules (see ledger/dbrules.py): never silent, held at commit."""

from ledger.dbrules import Function

# Checked at commit (a deferred constraint trigger), when the entry's transaction has had the
# chance to write its alert. PostgreSQL only; SQLite runs the same code path, unchecked.
ENTRY_NEEDS_ALERT = Function("dlq_entry_needs_alert() RETURNS trigger", """
BEGIN
    IF NOT EXISTS (SELECT 1 FROM dlq_alert WHERE dead_letter_id = NEW.id) THEN
        RAISE EXCEPTION USING MESSAGE = 'dead-letter entry ' || NEW.id || ' has no alert',
                              ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NULL;
END """)

# The same for an incident reconciliation opens (migration 0008).
INCIDENT_NEEDS_ALERT = Function("dlq_incident_needs_alert() RETURNS trigger", """
BEGIN
    IF NOT EXISTS (SELECT 1 FROM dlq_alert WHERE incident_id = NEW.id) THEN
        RAISE EXCEPTION USING MESSAGE = 'incident ' || NEW.id || ' has no alert',
                              ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NULL;
END """)

RULES = [ENTRY_NEEDS_ALERT, INCIDENT_NEEDS_ALERT]
