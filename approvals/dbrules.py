"""The approvals' database rules (see ledger/dbrules.py): the limits' version changes with
every change to the limits, so each process knows when its copy is out of date."""

from ledger.dbrules import Function, SQLiteTrigger

from .models import ReviewStatus

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

# Four eyes: the owner of the agent that asked never approves or decides its request, nor does the
# person its token was shown to (who can act as the agent), nor a delegate for either
# (approvals.delegation), and an item that needs two approvals is approved only with two, from two
# people, neither one a delegate acting for the other (approvals_approval is unique per item and
# user). approvals.decisions says so first, in words.
OWNED_BY = """SELECT 1 FROM ledger_action a JOIN ledger_agent g ON g.id = a.agent_id
                WHERE a.id = {action} AND (g.owner_id IN ({users}) OR g.token_issued_by_id IN ({users}))"""
SAME_EYES = """SELECT 1 FROM approvals_approval p WHERE p.item_id = NEW.item_id
                AND (p.user_id IN (NEW.user_id, NEW.on_behalf_of_id) OR p.on_behalf_of_id IN (NEW.user_id, NEW.on_behalf_of_id))"""
# The approvals are counted at the item's move to approved, not only checked at each one's insert:
# one given by a person named the agent's owner since, or shown its token since (or given for
# such a person by their delegate), counts no more, or the owner and one other would approve.
COUNTED_APPROVALS = ("SELECT count(*) FROM approvals_approval p WHERE p.item_id = NEW.id AND NOT EXISTS ("
                     + OWNED_BY.format(action="NEW.action_id", users="p.user_id, p.on_behalf_of_id") + ")")
TOO_FEW_APPROVALS = (f"NEW.status = '{ReviewStatus.APPROVED}' AND NEW.approvals_needed > 1 "
                     f"AND ({COUNTED_APPROVALS}) < NEW.approvals_needed")
APPROVAL_OWNED = OWNED_BY.format(action="(SELECT action_id FROM approvals_reviewitem WHERE id = NEW.item_id)",
                                 users="NEW.user_id, NEW.on_behalf_of_id")
DECISION_OWNED = OWNED_BY.format(action="NEW.action_id", users="NEW.decided_by_id, NEW.decided_for_id")

FOUR_EYES_APPROVAL = Function("approvals_four_eyes_approval() RETURNS trigger", f"""
BEGIN
    IF EXISTS ({APPROVAL_OWNED}) THEN
        RAISE EXCEPTION USING MESSAGE = 'four eyes: the owner of the agent that asked, or who holds its token, may not approve it',
                              ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF EXISTS ({SAME_EYES}) THEN
        RAISE EXCEPTION USING MESSAGE = 'four eyes: a person and their delegate give one approval between them',
                              ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END """)

FOUR_EYES_DECISION = Function("approvals_four_eyes_decision() RETURNS trigger", f"""
BEGIN
    IF NEW.decided_by_id IS NOT NULL AND EXISTS ({DECISION_OWNED}) THEN
        RAISE EXCEPTION USING MESSAGE = 'four eyes: the owner of the agent that asked, or who holds its token, may not decide it',
                              ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF {TOO_FEW_APPROVALS} THEN
        RAISE EXCEPTION USING MESSAGE = 'four eyes: this item needs its approvals from different people, none of whom answers for the agent that asked',
                              ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END """)

FOUR_EYES_APPROVAL_SQLITE = SQLiteTrigger("approvals_four_eyes_approval", f"""CREATE TRIGGER approvals_four_eyes_approval BEFORE INSERT ON approvals_approval
WHEN EXISTS ({APPROVAL_OWNED}) OR EXISTS ({SAME_EYES})
BEGIN
    SELECT RAISE(ABORT, 'four eyes: the owner of the agent that asked, or who holds its token, may not approve it, and a person and their delegate give one approval between them');
END""")

FOUR_EYES_DECISION_SQLITE = SQLiteTrigger("approvals_four_eyes_decision", f"""CREATE TRIGGER approvals_four_eyes_decision BEFORE UPDATE OF status ON approvals_reviewitem
WHEN (NEW.decided_by_id IS NOT NULL AND EXISTS ({DECISION_OWNED}))
    OR ({TOO_FEW_APPROVALS})
BEGIN
    SELECT RAISE(ABORT, 'four eyes: the owner of the agent that asked, or who holds its token, may not decide it nor count among its two approvals, and two approvals come from two people');
END""")

# An approval's window ends it (its limit's approval_expires_after_hours): approved or edited down
# after `expires_at` it is not, even in the moment before the sweeper's pass expires it. The time is
# the database's when the row is written (decision 57), not the transaction's start.
# How the database's refusals of a decision begin (approvals.decisions tells them from faults).
FOUR_EYES_RULE = "four eyes:"
WINDOW_CLOSED_RULE = "an approval is not given after its window closed"
DECIDED_IN_TIME = (f"OLD.status = '{ReviewStatus.OPEN}' AND NEW.status IN ('{ReviewStatus.APPROVED}', "
                   f"'{ReviewStatus.EDITED}') AND NEW.expires_at IS NOT NULL")
# Django keeps SQLite's times as UTC text, 'YYYY-MM-DD HH:MM:SS.ffffff': compared as text.
PG_NOW, SQLITE_NOW = "clock_timestamp()", "strftime('%Y-%m-%d %H:%M:%f', 'now')"
NOT_AFTER_EXPIRY = Function("approvals_not_after_expiry() RETURNS trigger", f"""
BEGIN
    IF {DECIDED_IN_TIME} AND NEW.expires_at <= {PG_NOW} THEN
        RAISE EXCEPTION USING MESSAGE = '{WINDOW_CLOSED_RULE}',
                              ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END """)

NOT_AFTER_EXPIRY_SQLITE = SQLiteTrigger("approvals_not_after_expiry", f"""CREATE TRIGGER approvals_not_after_expiry BEFORE UPDATE OF status ON approvals_reviewitem
WHEN {DECIDED_IN_TIME} AND NEW.expires_at <= {SQLITE_NOW}
BEGIN
    SELECT RAISE(ABORT, '{WINDOW_CLOSED_RULE}');
END""")

# Nor is an approval recorded then: the first of two would stand as a stray row, an approval given
# after the window that the item's page and evidence would show.
ITEM_CLOSED = ("EXISTS (SELECT 1 FROM approvals_reviewitem i WHERE i.id = NEW.item_id AND i.expires_at IS NOT NULL "
               "AND i.expires_at <= {now})")
APPROVAL_NOT_AFTER_EXPIRY = Function("approvals_approval_not_after_expiry() RETURNS trigger", f"""
BEGIN
    IF {ITEM_CLOSED.format(now=PG_NOW)} THEN
        RAISE EXCEPTION USING MESSAGE = '{WINDOW_CLOSED_RULE}',
                              ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END """)

APPROVAL_NOT_AFTER_EXPIRY_SQLITE = SQLiteTrigger("approvals_approval_not_after_expiry", f"""CREATE TRIGGER approvals_approval_not_after_expiry BEFORE INSERT ON approvals_approval
WHEN {ITEM_CLOSED.format(now=SQLITE_NOW)}
BEGIN
    SELECT RAISE(ABORT, '{WINDOW_CLOSED_RULE}');
END""")

# The what-if's daily summaries stay true (approvals.summaries): a change to an action of a day
# that is over marks that day stale. The triggers call these only for such rows (their WHEN:
# the row's day is before today's, UTC), so today's writes pay a comparison, not a call. A day
# already stale is left as it is: an archive run deletes thousands of one day's actions, and
# rewriting the same row for each one left a version per delete for the next one to walk.
BEFORE_TODAY = "{at} < date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'"
SUMMARY_DAY_CHANGED = Function("approvals_summary_day_changed(p_at timestamptz) RETURNS void", f"""
BEGIN
    IF {BEFORE_TODAY.format(at="p_at")} THEN
        INSERT INTO approvals_summaryday (day, stale, summarised_at)
             VALUES ((p_at AT TIME ZONE 'UTC')::date, true, now())
        ON CONFLICT (day) DO UPDATE SET stale = true WHERE NOT approvals_summaryday.stale;
    END IF;
END """)

SUMMARY_STALE = Function("approvals_summary_stale() RETURNS trigger", """
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM approvals_summary_day_changed(NEW.created_at);
    ELSE
        PERFORM approvals_summary_day_changed(OLD.created_at);
    END IF;
    RETURN NULL;
END """)

# An approval item opened (or deleted) for an action: its day's `asked` changes.
SUMMARY_ASKED_STALE = Function("approvals_summary_asked_stale() RETURNS trigger", """
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM approvals_summary_day_changed(a.created_at) FROM ledger_action a WHERE a.id = NEW.action_id;
    ELSE
        PERFORM approvals_summary_day_changed(a.created_at) FROM ledger_action a WHERE a.id = OLD.action_id;
    END IF;
    RETURN NULL;
END """)

RULES = [LIMITS_CHANGED, *LIMITS_CHANGED_SQLITE, FOUR_EYES_APPROVAL, FOUR_EYES_DECISION, FOUR_EYES_APPROVAL_SQLITE,
         FOUR_EYES_DECISION_SQLITE, NOT_AFTER_EXPIRY, NOT_AFTER_EXPIRY_SQLITE, APPROVAL_NOT_AFTER_EXPIRY,
         APPROVAL_NOT_AFTER_EXPIRY_SQLITE, SUMMARY_DAY_CHANGED, SUMMARY_STALE, SUMMARY_ASKED_STALE]
