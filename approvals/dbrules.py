"""The approvals' database rules (see ledger/dbrules.py): the limits' version changes with
every change to the limits, so each process knows when its copy is out of date."""

from ledger.dbrules import Function, SQLiteTrigger

LIMITS_CHANGED = Function("approvals_limits_changed() RETURNS trigger", """
BEGIN
    UPDATE approvals_limitsversion SET version = nextval('approvals_limits_version_seq');
    RETURN NULL;
END """)

# SQLite has no statement triggers and no sequences: a random version on every row change.
LIMITS_CHANGED_SQLITE = [
    SQLiteTrigger(f"approvals_limits_{event.lower()}",
                  f"CREATE TRIGGER approvals_limits_{event.lower()} AFTER {event} ON approvals_limit "
                  "BEGIN UPDATE approvals_limitsversion SET version = random(); END")
    for event in ("INSERT", "UPDATE", "DELETE")
]

RULES = [LIMITS_CHANGED, *LIMITS_CHANGED_SQLITE]
