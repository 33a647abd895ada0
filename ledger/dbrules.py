"""The rules the database holds beyond Django's own constraints, written once: triggers.

Each app keeps its rules in a `dbrules.py` beside its models, as `RULES`, and renders status
lists from the Python enums, so the SQL says what the code means. Migrations freeze SQL as
it was when they were written (`python manage.py dbrules APP` prints the current rendering
for a new one); `tests/ledger/test_dbrules.py` compares every rule with what the migrated
database holds, so a status added in Python without a migration that installs the new
rendering fails the tests instead of being silently missing from SQL. On SQLite, which
serialises writers, the rules are triggers as well: they cost nothing measurable (decision 28).
"""

from dataclasses import dataclass

from . import locks
from .models import IN_FLIGHT_STATUSES, ActionStatus, Booking, failure_stored, held_nearby
from .retention import KEY_ARCHIVED


@dataclass(frozen=True)
class Function:
    """A PostgreSQL function in PL/pgSQL; `signature` is what follows CREATE FUNCTION up to LANGUAGE."""

    signature: str
    body: str

    @property
    def name(self):
        return self.signature.split("(", 1)[0]

    def create_sql(self):
        return f"CREATE OR REPLACE FUNCTION {self.signature} LANGUAGE plpgsql AS $${self.body}$$;"


@dataclass(frozen=True)
class SQLiteTrigger:
    name: str
    sql: str

    def create_sql(self):
        return f"DROP TRIGGER IF EXISTS {self.name}; {self.sql};"


def sql_list(values):
    """('a', 'b') from Python values, in the order given."""
    return "(" + ", ".join(f"'{value}'" for value in values) + ")"


def in_enum_order(enum, members):
    """The members of a set in their enum's order, so a rendering is the same every time."""
    return [value for value in enum.values if value in members]


IN_FLIGHT = sql_list(in_enum_order(ActionStatus, IN_FLIGHT_STATUSES))
RUNNING = sql_list(in_enum_order(ActionStatus, IN_FLIGHT_STATUSES - {ActionStatus.HELD}))  # in flight, not held
# Ahead of a failed action's new attempt (NEW): running, or held since before it was requested.
BEFORE_IT = f"(a.status IN {RUNNING} OR (a.status = '{ActionStatus.HELD}' AND a.id < NEW.id))"
NOT_STARTED = sql_list([ActionStatus.QUEUED, ActionStatus.AWAITING_APPROVAL])

# A target's and a customer's advisory-lock keys, in one order, so that two transactions never
# wait on each other's second lock (the body of both functions below).
SUBJECT_KEYS = """SELECT DISTINCT hashtextextended(s, 0) AS k
          FROM unnest(ARRAY['target:' || p_target,
                            CASE WHEN p_customer <> '' THEN 'customer:' || p_customer END]) AS s
         WHERE s IS NOT NULL
         ORDER BY 1"""

LOCK_SUBJECTS = Function("ledger_lock_subjects(p_target text, p_customer text) RETURNS void", f"""
BEGIN
    -- In one order, so that two transactions never wait on each other's second lock.
    PERFORM pg_advisory_xact_lock(k) FROM (
        {SUBJECT_KEYS}) AS keys;
END """)

# The same locks, taken only if free at once (true), or none of them kept waiting (false): for
# a transaction that already holds rows the intake may wait for (a settle releasing the actions
# it held, ledger.actions.held_release_when_settled), where waiting could deadlock. A lock taken
# before another is found busy stays until the transaction ends: harmless, it is held briefly.
TRY_LOCK_SUBJECTS = Function("ledger_try_lock_subjects(p_target text, p_customer text) RETURNS boolean", f"""
BEGIN
    RETURN (SELECT bool_and(pg_try_advisory_xact_lock(k)) FROM (
        {SUBJECT_KEYS}) AS keys);
END """)

# The same-object rule on insert: a not-yet-started action is stored `held` while another
# action on its target or customer is in flight (ledger.actions.action_request reads back
# the status it was stored with).
SAME_SUBJECT = Function("ledger_action_same_subject() RETURNS trigger", f"""
BEGIN
    PERFORM ledger_lock_subjects(NEW.target, NEW.customer);
    IF NEW.status IN {NOT_STARTED} AND (
        EXISTS (SELECT 1 FROM ledger_action a WHERE a.target = NEW.target AND a.status IN {IN_FLIGHT})
        OR (NEW.customer <> '' AND EXISTS (
            SELECT 1 FROM ledger_action a WHERE a.customer = NEW.customer AND a.status IN {IN_FLIGHT}))
    ) THEN
        NEW.status := '{ActionStatus.HELD}';
        NEW.next_attempt_at := NULL;
    END IF;
    RETURN NEW;
END """)

SAME_SUBJECT_SQLITE = SQLiteTrigger("ledger_action_same_subject", f"""CREATE TRIGGER ledger_action_same_subject AFTER INSERT ON ledger_action
WHEN NEW.status IN {NOT_STARTED} AND (
    EXISTS (SELECT 1 FROM ledger_action a WHERE a.id <> NEW.id AND a.target = NEW.target AND a.status IN {IN_FLIGHT})
    OR (NEW.customer <> '' AND EXISTS (
        SELECT 1 FROM ledger_action a WHERE a.id <> NEW.id AND a.customer = NEW.customer AND a.status IN {IN_FLIGHT})))
BEGIN
    UPDATE ledger_action SET status = '{ActionStatus.HELD}', next_attempt_at = NULL WHERE id = NEW.id;
END""")

# The same rule on a new attempt: a failed action goes back to `queued` only while nothing
# else is in flight on its target or customer (ledger.actions.action_retry holds it instead),
# held actions newer than it apart: a failure that may be retried keeps what it held, and its
# retry goes on before them, as its first attempt did (decision 18); one held before it was
# requested keeps its turn. A person's release of one of them is bound to what its page showed in
# flight, so it is refused once the retry is (approvals.decisions).
REQUEUE_SAME_SUBJECT = Function("ledger_action_requeue_same_subject() RETURNS trigger", f"""
BEGIN
    PERFORM ledger_lock_subjects(NEW.target, NEW.customer);
    IF EXISTS (SELECT 1 FROM ledger_action a WHERE a.id <> NEW.id AND a.target = NEW.target AND {BEFORE_IT})
       OR (NEW.customer <> '' AND EXISTS (
           SELECT 1 FROM ledger_action a WHERE a.id <> NEW.id AND a.customer = NEW.customer AND {BEFORE_IT}))
    THEN
        RAISE EXCEPTION USING MESSAGE = 'another action is in flight for the same target or customer: '
                                        || NEW.operation_key || ' must be held, not queued',
                              ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END """)

REQUEUE_SAME_SUBJECT_SQLITE = SQLiteTrigger("ledger_action_requeue_same_subject", f"""CREATE TRIGGER ledger_action_requeue_same_subject BEFORE UPDATE OF status ON ledger_action
WHEN OLD.status = '{ActionStatus.FAILED}' AND NEW.status = '{ActionStatus.QUEUED}' AND (
    EXISTS (SELECT 1 FROM ledger_action a WHERE a.id <> NEW.id AND a.target = NEW.target AND {BEFORE_IT})
    OR (NEW.customer <> '' AND EXISTS (
        SELECT 1 FROM ledger_action a WHERE a.id <> NEW.id AND a.customer = NEW.customer AND {BEFORE_IT})))
BEGIN
    SELECT RAISE(ABORT, 'another action is in flight for the same target or customer: it must be held, not queued');
END""")

# A superseded action is replaced by the version a person edited it into (ledger.versions):
# without one, the agent would be told its action was superseded and nothing would run. Checked
# at commit (a deferred constraint trigger, migration 0021), when the version is written.
# PostgreSQL only; SQLite runs the same code path, unchecked.
SUPERSEDED_HAS_VERSION = Function("ledger_action_superseded_has_version() RETURNS trigger", f"""
BEGIN
    IF NEW.status = '{ActionStatus.SUPERSEDED}'
       AND NOT EXISTS (SELECT 1 FROM ledger_action v WHERE v.supersedes_id = NEW.id) THEN
        RAISE EXCEPTION USING MESSAGE = 'action ' || NEW.operation_key || ' is superseded by no version',
                              ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NULL;
END """)

# An action sent to its provider before is never edited into a version (ledger.versions.edit_refusal):
# the version runs under a key of its own, which the look a retried failure makes before its call
# does not cover, and a provider would make the effect a second time. Its trigger (migration 0045)
# fires only for a version's insert, so no other write pays for it.
VERSION_OF_UNSENT = Function("ledger_action_version_of_unsent() RETURNS trigger", """
BEGIN
    IF EXISTS (SELECT 1 FROM ledger_action o WHERE o.id = NEW.supersedes_id AND o.attempts > 0) THEN
        RAISE EXCEPTION USING MESSAGE = 'action ' || NEW.operation_key
                                        || ' is a version of an action sent to its provider before',
                              ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END """)

VERSION_OF_UNSENT_SQLITE = SQLiteTrigger("ledger_action_version_of_unsent", """CREATE TRIGGER ledger_action_version_of_unsent BEFORE INSERT ON ledger_action
WHEN NEW.supersedes_id IS NOT NULL
    AND EXISTS (SELECT 1 FROM ledger_action o WHERE o.id = NEW.supersedes_id AND o.attempts > 0)
BEGIN
    SELECT RAISE(ABORT, 'a version of an action sent to its provider before');
END""")

def marked_final(what, table, key, status, error, marks, *, failed=None):
    """The rule that a row a person closed for good, as its `error` says with one of `marks` (JSON's
    true: `done_by_hand`, they made its effect by hand; `given_up`, they gave it up, nothing done),
    is final: an update of its `status`, one that takes off, falsifies or adds a mark (a row reads
    the one decision a person made of it), or one that makes it retryable (`"retryable"` stays
    false: the client and the MCP server tell the agent from it whether it may retry), is refused,
    whatever writes the row. The rest of the row may be written, and deletes (the archive's) are
    left alone. A PostgreSQL function and its trigger's SQLite pair, named for the first mark the
    rule held (migration 0051); the PostgreSQL trigger (its migration) fires, as the SQLite one
    does, only for an update of either column of a row marked (and `failed`, if given), so no other
    write pays for it. The marks are JSON's true and false, as the ORM's lookups read them."""
    name = f"ledger_{what}_done_by_hand_final"
    said = " or ".join(mark.replace("_", " ") for mark in marks)
    kept = f"its {status}, its {' and '.join(marks)} mark{'s' if len(marks) > 1 else ''} and retryable false stay"
    marked = " OR ".join(f"json_type(OLD.{error}, '$.{mark}') = 'true'" for mark in marks)
    changed = "".join(f"\n       OR NEW.{error} -> '{mark}' IS DISTINCT FROM OLD.{error} -> '{mark}'" for mark in marks)
    changed_sqlite = "".join(f"\n         OR json_type(NEW.{error}, '$.{mark}') IS NOT json_type(OLD.{error}, '$.{mark}')"
                             for mark in marks)
    return Function(f"{name}() RETURNS trigger", f"""
BEGIN
    IF NEW.{status} IS DISTINCT FROM OLD.{status}{changed}
       OR NEW.{error} -> 'retryable' IS DISTINCT FROM 'false'::jsonb THEN
        RAISE EXCEPTION USING MESSAGE = '{what} ' || OLD.{key} || ' was {said}: {kept}',
                              ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END """), SQLiteTrigger(name, f"""CREATE TRIGGER {name} BEFORE UPDATE OF {status}, {error} ON {table}
WHEN {f"OLD.{status} = '{failed}' AND " if failed else ""}({marked})
    AND (NEW.{status} IS NOT OLD.{status}{changed_sqlite}
         OR json_type(NEW.{error}, '$.retryable') IS NOT 'false')
BEGIN
    SELECT RAISE(ABORT, '{what} {said}: {kept}');
END""")


# A failed action a person did by hand (ledger.actions.action_done_by_hand, models.DONE_BY_HAND):
# a retry would make the refund or the booking the person made a second time (Python refuses it
# first: Action._refuse, action_retry_by_person). Or one a person gave up (ledger.actions.given_up:
# its dead letter, or its task's, discarded): its agent was told nobody retries it, and may have
# asked for it again under a new decision, which a retry would then double. Neither becomes the
# other: no code writes it (a discard or a resolve closes the entry through which the other would
# come, and a failed action never fails again to open another). Migrations 0051, 0052 and 0054.
DONE_BY_HAND_FINAL, DONE_BY_HAND_FINAL_SQLITE = marked_final(
    "action", "ledger_action", "operation_key", "status", "error", ("done_by_hand", "given_up"),
    failed=ActionStatus.FAILED)
# A task a person finished by hand (its dead letter resolved: ledger.tasks.task_actions_let_go),
# stopped where the work stopped (dead-lettered, failed). Sent back to the queue, its runner would
# go on from its checkpoint: its steps' actions done by hand would fail it again, but a step the
# work never reached records its action now (no action of it stands to refuse it) and makes what
# the person made by hand, a refund or a customer's message, a second time. No move leaves a task
# so stopped but for the dead letter's redrive and discard, closed by the resolve. Migration 0052
# (and 0054, the same rule in the words of the action's).
TASK_DONE_BY_HAND_FINAL, TASK_DONE_BY_HAND_FINAL_SQLITE = marked_final(
    "task", "ledger_task", "task_id", "state", "last_error", ("done_by_hand",))

# A booking's slot let go (released: its action failed for good, was rejected, cancelled...) is
# taken again only as Booking.TRANSITIONS and Booking._refuse allow: confirmed, for a booking whose
# action a person then did by hand (models.DONE_BY_HAND; the mark is written first, in the same
# transaction: ledger.actions.action_done_by_hand). Otherwise a slot nobody booked would be held, and
# another booking of that time refused, whatever wrote the row. The trigger (its migration) fires
# only for an update of a released row's status, so no other write pays for it; the rest of the row
# may be written. Migration 0056.
def its_action_done_by_hand(mark):
    """Whether the booking's action is done by hand, `mark` saying in the database's words that its
    error's `done_by_hand` is JSON's true."""
    return ("EXISTS (SELECT 1 FROM ledger_action a\n"
            f"                      WHERE a.id = OLD.action_id AND a.status = '{ActionStatus.FAILED}' AND {mark})")


BOOKING_RELEASED_FINAL = Function("ledger_booking_released_final() RETURNS trigger", f"""
BEGIN
    IF NEW.status IS DISTINCT FROM '{Booking.Status.CONFIRMED}'
       OR NOT {its_action_done_by_hand("a.error -> 'done_by_hand' = 'true'::jsonb")} THEN
        RAISE EXCEPTION USING MESSAGE = 'the slot of booking ' || OLD.id || ' was let go: only a booking a person '
                                        || 'then did by hand takes it again, confirmed',
                              ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END """)
BOOKING_RELEASED_FINAL_SQLITE = SQLiteTrigger("ledger_booking_released_final", f"""CREATE TRIGGER ledger_booking_released_final BEFORE UPDATE OF status ON ledger_booking
WHEN OLD.status = '{Booking.Status.RELEASED}' AND NEW.status IS NOT '{Booking.Status.RELEASED}'
    AND (NEW.status IS NOT '{Booking.Status.CONFIRMED}'
         OR NOT {its_action_done_by_hand("json_type(a.error, '$.done_by_hand') = 'true'")})
BEGIN
    SELECT RAISE(ABORT, 'the slot of a booking was let go: only a booking a person then did by hand takes it again, confirmed');
END""")

# A confirmed booking holds its slot for good (Booking.TRANSITIONS: nothing leaves confirmed): a
# write that moved it, or its slot, would free or shift a time the provider booked, and let another
# booking take it. The trigger (migration 0057) fires only for such a write. Deleting the row is
# the archive's, and is not an update.
BOOKING_CONFIRMED_FINAL = Function("ledger_booking_confirmed_final() RETURNS trigger", """
BEGIN
    RAISE EXCEPTION USING MESSAGE = 'booking ' || OLD.id || ' is confirmed: its status and slot stay',
                          ERRCODE = 'integrity_constraint_violation';
END """)
BOOKING_CONFIRMED_FINAL_SQLITE = SQLiteTrigger("ledger_booking_confirmed_final", f"""CREATE TRIGGER ledger_booking_confirmed_final BEFORE UPDATE OF status, resource, start, "end" ON ledger_booking
WHEN OLD.status = '{Booking.Status.CONFIRMED}'
    AND (NEW.status IS NOT OLD.status OR NEW.resource IS NOT OLD.resource OR NEW.start IS NOT OLD.start
         OR NEW."end" IS NOT OLD."end")
BEGIN
    SELECT RAISE(ABORT, 'a confirmed booking: its status and slot stay');
END""")

# Audit events are append-only; the only update is the sealer's, and only with the next link
# of the chain (hash = sha256(prev_hash || content_hash || seq), the formula of audit.py) at the
# seq after the chain's end: the highest seq sealed, whose event no archive deletes (a run deletes
# those before the checkpoint it names, and that checkpoint's event stays). A free seq with the
# right link is not enough: once a run has deleted seqs 1 to C-1, an event sealed at seq 1 (after
# '') would lie among them, and the archive's delete below would remove it unseen. The end costs
# one index probe per partition (a partitioned table has no unique index of its own on seq). The
# only delete is the archive's (ledger.retention.Archive): sealed events before the checkpoint
# its newest run names, which vouches for them and from which the chain is verified after it.
ARCHIVED_BEFORE = ("(SELECT max(c.seq) FROM ledger_archive a "
                   "JOIN ledger_chaincheckpoint c ON c.id = a.checkpoint_id)")
AUDIT_APPEND_ONLY = Function("ledger_audit_append_only() RETURNS trigger", f"""
DECLARE
    end_seq bigint;
    end_hash text;
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.seq IS NULL AND NEW.seq IS NOT NULL
       AND (to_jsonb(NEW) - 'seq' - 'prev_hash' - 'hash') = (to_jsonb(OLD) - 'seq' - 'prev_hash' - 'hash') THEN
        -- The sealer's lock (ledger.locks.AUDIT_SEAL), already its own: seals take turns, so the
        -- check below sees every seal committed before this one.
        PERFORM pg_advisory_xact_lock({locks.CLASS}, {locks.AUDIT_SEAL});
        -- The chain's end (none: the seal is seq 1, after ''). The sealer's batch seals in seq
        -- order, a statement a row, so each row's seal follows the one before it.
        SELECT seq, hash INTO end_seq, end_hash FROM ledger_auditevent WHERE seq IS NOT NULL ORDER BY seq DESC LIMIT 1;
        IF NEW.seq <> coalesce(end_seq, 0) + 1
           OR NEW.prev_hash IS DISTINCT FROM coalesce(end_hash, '')
           OR NEW.hash <> encode(sha256(convert_to(NEW.prev_hash || NEW.content_hash || NEW.seq::text, 'UTF8')), 'hex')
        THEN
            RAISE EXCEPTION USING MESSAGE = 'audit events are append-only: a seal must be the next link of the chain',
                                  ERRCODE = 'insufficient_privilege';
        END IF;
        RETURN NEW;  -- the seal (AuditEventManager.seal)
    END IF;
    IF TG_OP = 'DELETE' AND OLD.seq < {ARCHIVED_BEFORE} THEN
        RETURN OLD;  -- archived (dlq.archive)
    END IF;
    RAISE EXCEPTION USING MESSAGE = 'audit events are append-only: ' || TG_OP || ' refused',
                          ERRCODE = 'insufficient_privilege';
END """)

# SQLite: the same rule, spelled out column by column (it has no row-to-JSON); of the seal, its seq
# only (it has no SHA-256).
AUDIT_CONTENT_COLUMNS = ["id", "occurred_at", "actor", "verb", "object_type", "object_id", "object_label", "before",
                         "after", "reason", "request_id", "content_hash", "hash_version"]
AUDIT_NO_UPDATE_SQLITE = SQLiteTrigger(
    "ledger_audit_no_update",
    "CREATE TRIGGER ledger_audit_no_update BEFORE UPDATE ON ledger_auditevent "
    "WHEN OLD.seq IS NOT NULL OR NEW.seq IS NULL OR "
    + " OR ".join(f"NEW.{c} IS NOT OLD.{c}" for c in AUDIT_CONTENT_COLUMNS)
    # Not null, so the partial index on seq answers (without, SQLite reads the whole trail).
    + " OR NEW.seq <> coalesce((SELECT max(e.seq) FROM ledger_auditevent e WHERE e.seq IS NOT NULL), 0) + 1"
    + " BEGIN SELECT RAISE(ABORT, 'audit events are append-only (UPDATE refused)'); END",
)
AUDIT_NO_DELETE_SQLITE = SQLiteTrigger(
    "ledger_audit_no_delete",
    "CREATE TRIGGER ledger_audit_no_delete BEFORE DELETE ON ledger_auditevent "
    f"WHEN OLD.seq IS NULL OR OLD.seq >= coalesce({ARCHIVED_BEFORE}, 0) "
    "BEGIN SELECT RAISE(ABORT, 'audit events are append-only (DELETE refused)'); END",
)

def append_only(name, table, what):
    """The rules of a table whose rows are written once and never changed or removed: the
    PostgreSQL function (its trigger, BEFORE UPDATE OR DELETE, is made by the migration) and
    SQLite's two triggers."""
    prefix = name.removesuffix("_append_only")
    function = Function(f"{name}() RETURNS trigger", f"""
BEGIN
    RAISE EXCEPTION USING MESSAGE = '{what} are append-only: ' || TG_OP || ' refused',
                          ERRCODE = 'insufficient_privilege';
END """)
    return function, *(SQLiteTrigger(
        f"{prefix}_no_{op.lower()}",
        f"CREATE TRIGGER {prefix}_no_{op.lower()} BEFORE {op} ON {table} "
        f"BEGIN SELECT RAISE(ABORT, '{what} are append-only ({op} refused)'); END",
    ) for op in ("UPDATE", "DELETE"))


# The chain's checkpoints are what the daily check trusts instead of the events before them:
# written once, by the seal, never changed or removed (their signature is a second line).
CHECKPOINT_APPEND_ONLY, CHECKPOINT_NO_UPDATE_SQLITE, CHECKPOINT_NO_DELETE_SQLITE = append_only(
    "ledger_checkpoint_append_only", "ledger_chaincheckpoint", "chain checkpoints")
# An archive run's row names the checkpoint the chain starts from after it, and the file (its
# SHA-256) that holds what it took: written once, by the run, never changed or removed (their
# signature is a second line: ledger.retention.Archive).
ARCHIVE_APPEND_ONLY, ARCHIVE_NO_UPDATE_SQLITE, ARCHIVE_NO_DELETE_SQLITE = append_only(
    "ledger_archive_append_only", "ledger_archive", "archive runs")
# And written signed: a run of code from before the signature, against a migrated database,
# is refused (PostgreSQL: the CHECK ledger_archive_signed, migration 0040).
ARCHIVE_SIGNED_SQLITE = SQLiteTrigger(
    "ledger_archive_signed",
    "CREATE TRIGGER ledger_archive_signed BEFORE INSERT ON ledger_archive WHEN NEW.signature IS NULL "
    "BEGIN SELECT RAISE(ABORT, 'an archive run is signed (an unsigned row refused)'); END",
)


def archived_refused(name, table, column, archived):
    """The rule that a key an archive run took (a row of `archived`, ledger.retention) is never
    recorded again in `table`'s `column`: a PostgreSQL function and its trigger's SQLite pair.
    Checked after the row is in the unique index, so an insert that waited there for the
    archive's commit sees the archived key (each statement of a PL/pgSQL function reads a fresh
    snapshot under READ COMMITTED). Both raise KEY_ARCHIVED: the intake answers either as an
    expired key."""
    return Function(f"{name}() RETURNS trigger", f"""
BEGIN
    IF EXISTS (SELECT 1 FROM {archived} k WHERE k.{column} = NEW.{column}) THEN
        RAISE EXCEPTION USING MESSAGE = '{KEY_ARCHIVED}: ' || NEW.{column},
                              ERRCODE = 'unique_violation';
    END IF;
    RETURN NULL;
END """), SQLiteTrigger(name, f"""CREATE TRIGGER {name} BEFORE INSERT ON {table}
WHEN EXISTS (SELECT 1 FROM {archived} k WHERE k.{column} = NEW.{column})
BEGIN
    SELECT RAISE(ABORT, '{KEY_ARCHIVED}');
END""")


ARCHIVED_KEY_REFUSED, ARCHIVED_KEY_REFUSED_SQLITE = archived_refused(
    "ledger_action_key_archived", "ledger_action", "operation_key", "ledger_archivedkey")
ARCHIVED_TASK_REFUSED, ARCHIVED_TASK_REFUSED_SQLITE = archived_refused(
    "ledger_task_id_archived", "ledger_task", "task_id", "ledger_archivedtask")

# Whether another action is held on an action's target or customer: what the settle of an action
# reads back with its UPDATE (ledger.models.HELD_NEARBY, whose SQLite side is the same look). A
# function of its own, VOLATILE (the default), so that its query reads what is committed once the
# UPDATE has its row, not the UPDATE's snapshot, which is older when the UPDATE waited for the
# row's lock.
HELD_NEARBY = Function("ledger_held_nearby(p_id bigint, p_target text, p_customer text) RETURNS boolean", f"""
BEGIN
    RETURN {held_nearby("p_id", "p_target", "p_customer")};
END """)

# Whether the provider's failure of an action's effect is stored: what a move to succeeded reads
# back with its UPDATE (ledger.models.FAILURE_STORED), a function for the same reason.
FAILURE_STORED = Function("ledger_failure_stored(p_key text, p_effect text) RETURNS boolean", f"""
BEGIN
    RETURN {failure_stored("p_key", "p_effect", "postgresql")};
END """)

RULES = [LOCK_SUBJECTS, TRY_LOCK_SUBJECTS, SAME_SUBJECT, REQUEUE_SAME_SUBJECT, AUDIT_APPEND_ONLY, SUPERSEDED_HAS_VERSION,
         CHECKPOINT_APPEND_ONLY, SAME_SUBJECT_SQLITE, REQUEUE_SAME_SUBJECT_SQLITE, AUDIT_NO_UPDATE_SQLITE,
         AUDIT_NO_DELETE_SQLITE, CHECKPOINT_NO_UPDATE_SQLITE, CHECKPOINT_NO_DELETE_SQLITE, ARCHIVE_APPEND_ONLY,
         ARCHIVE_NO_UPDATE_SQLITE, ARCHIVE_NO_DELETE_SQLITE, ARCHIVE_SIGNED_SQLITE,
         ARCHIVED_KEY_REFUSED, ARCHIVED_KEY_REFUSED_SQLITE, ARCHIVED_TASK_REFUSED, ARCHIVED_TASK_REFUSED_SQLITE,
         HELD_NEARBY, VERSION_OF_UNSENT, VERSION_OF_UNSENT_SQLITE, DONE_BY_HAND_FINAL, DONE_BY_HAND_FINAL_SQLITE,
         TASK_DONE_BY_HAND_FINAL, TASK_DONE_BY_HAND_FINAL_SQLITE, BOOKING_RELEASED_FINAL, BOOKING_RELEASED_FINAL_SQLITE,
         BOOKING_CONFIRMED_FINAL, BOOKING_CONFIRMED_FINAL_SQLITE, FAILURE_STORED]


def installed(connection, rule):
    """The rule's text as the database holds it (None if missing), comparable to the rendering."""
    with connection.cursor() as cursor:
        if isinstance(rule, Function):
            cursor.execute("SELECT prosrc FROM pg_proc WHERE proname = %s", [rule.name])
        else:
            cursor.execute("SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = %s", [rule.name])
        row = cursor.fetchone()
    return None if row is None else _normal(row[0])


def rendered(rule):
    return _normal(rule.body if isinstance(rule, Function) else rule.sql)


def _normal(text):
    return text.strip().rstrip(";").strip()


def for_vendor(rules, vendor):
    kind = Function if vendor == "postgresql" else SQLiteTrigger
    return [rule for rule in rules if isinstance(rule, kind)]
