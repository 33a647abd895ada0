"""Given up is final, held by the database as done by hand is (0051, 0052), and the failed actions a
person dealt with before their errors said so are marked now.

The rule (ledger.dbrules.marked_final; SQL frozen as `manage.py dbrules ledger` printed it): a failed
action a person gave up (`"given_up": true` in its error: its dead letter, or its task's, discarded)
keeps its status, its mark and `retryable` false, whatever writes it, as one done by hand does: its
agent was told nobody retries it, and may have asked for it again under a new decision, which a retry
would double. Neither mark is added to a row that has the other: no code writes that (a discard or a
resolve closes the entry through which the other would come, and a failed action never fails again
to open another). The task's rule is the same in these words, unchanged in what it refuses.
Reversed, both rules are 0052's again; the marks written stay.

The repair, before the rule: an action discarded or resolved before its error said so
(ledger.actions.action_give_up and action_done_by_hand write the marks now) reads, to the client and
the MCP server, as one a person may still retry. A failed action without either mark whose newest
dead-letter entry, its own or its task's, is discarded is marked given up; resolved, done by hand;
`retryable` false beside either, as those functions write them. Its booking's slot goes where they
put it: given up, a slot still pending is released; done by hand, it is confirmed, and one it let go
when it failed for good is taken again (the same row), but only while no live booking overlaps it and
no other booking holds its decision, as the resolve now requires (looked at once the slots given up
are let go). Where another does, the action is left as it is and the migration's output names it: it
reads as what it is, a booking failed for good whose slot went to another, which nobody retries (a
resolve today is refused alike, leaving it so). The rows are found in SQL and read BATCH at a time in
key order, each batch marked with a statement per mark (only a declined booking resolved is looked at
alone): the migration holds one batch in memory and makes a few statements a batch, not a row.

Kept simple: the repair writes the marks and the slots only. No audit event, as the project's data
migrations write none (the entry's own events say who closed it, when and why); what such a failure
held for its retry is not looked at again (it waits for a person, as it did); and an action whose
closed entry an archive run has taken since is not found, and is left as it is.
"""

import importlib
import json
from collections import Counter

from django.db import migrations
from django.db.models import BooleanField, Case, F, Func, JSONField, OuterRef, Q, Subquery, When
from django.db.models.functions import Coalesce
from django.utils import timezone

DONE_BY_HAND_0051 = importlib.import_module("ledger.migrations.0051_done_by_hand_is_final")
DONE_BY_HAND_0052 = importlib.import_module("ledger.migrations.0052_done_by_hand_keeps_retryable_false_and_tasks_too")
rules = importlib.import_module("ledger.migrations.0048_audit_sealed_only_after_the_chains_end").rules

# What the person made of the entry, as the action's error says it, and where its booking's slot goes.
MARK = {"discarded": "given_up", "resolved": "done_by_hand"}
SLOT = {"given_up": "released", "done_by_hand": "confirmed"}
# ledger.models.BOOKING_HELD as it stands (0049): a booking action that holds its slot and its decision.
HOLDS_ITS_DECISION = ~Q(status__in=["superseded", "rejected", "cancelled", "expired", "shadow"]) & (
    ~Q(status="failed", error__retryable=False) | Q(status="failed", error__done_by_hand=True))
# Rows read and written at a time: the repair's memory and each statement stay small however many
# rows it finds (millions, at the ledger's volume), in one transaction as the migration runs.
BATCH = 2000


class WithMark(Func):
    """The JSON object in `column` with `mark` true and `retryable` false beside what it said
    (`{**value, "retryable": False, mark: True}`, a null read as {}): one UPDATE marks a batch."""

    output_field = JSONField()

    def __init__(self, column, mark):
        super().__init__(F(column))
        self.mark = mark

    def as_postgresql(self, compiler, connection):
        value, params = compiler.compile(self.source_expressions[0])
        return (f"(COALESCE({value}, '{{}}'::jsonb) || %s::jsonb)",
                (*params, json.dumps({"retryable": False, self.mark: True})))

    def as_sqlite(self, compiler, connection):
        value, params = compiler.compile(self.source_expressions[0])
        return (f"json_set(COALESCE({value}, '{{}}'), '$.retryable', json('false'), %s, json('true'))",
                (*params, f"$.{self.mark}"))


def either_mark(column):
    """Whether the JSON `column` says either mark, as a value: a key missing, or the column null,
    is no mark (excluding `column__done_by_hand=True` would drop those rows too, its test null)."""
    return when(Q(**{f"{column}__done_by_hand": True}) | Q(**{f"{column}__given_up": True}))


def when(condition):
    """True where `condition` holds, else false (null included)."""
    return Case(When(condition, then=True), default=False, output_field=BooleanField())


def newest_entry(DeadLetter, **subject):
    """The status of the newest dead-letter entry of `subject` (an action's or a task's)."""
    return Subquery(DeadLetter.objects.filter(**subject).order_by("-pk").values("status")[:1])


def in_batches(rows):
    """`rows` BATCH at a time in pk order, each batch read whole before the caller writes (an open
    cursor, SQLite's, would see the rows written): the next starts after the last one read."""
    last = 0
    while batch := list(rows.filter(pk__gt=last).order_by("pk")[:BATCH]):
        yield batch
        last = batch[-1].pk


def mark_batch(Model, column, batch, counts):
    """Each row of `batch` marked as its newest entry (its `entry`) says, in its JSON `column`, one
    UPDATE a mark, counted in `counts`; returns the pks of each mark."""
    pks = {mark: [row.pk for row in batch if row.entry == entry] for entry, mark in MARK.items()}
    for mark, rows in pks.items():
        if rows:
            counts[mark] += Model.objects.filter(pk__in=rows).update(**{column: WithMark(column, mark)},
                                                                     updated_at=timezone.now())
    return pks


def report(counts, what, left=()):
    """The upgrade's output: how many rows of `what` the repair marked, and the bookings it `left`."""
    if counts or left:
        print(f"\n  {counts['given_up']} {what} marked given up and {counts['done_by_hand']} done by hand "
              "from their closed dead-letter entries")
    if left:
        print(f"  {len(left)} booking(s) resolved by hand after failing for good left unmarked, another booking "
              f"holding their slot or decision: {', '.join(left[:20])}{' …' if len(left) > 20 else ''}")


def _taken_since(Action, Booking, action, booking):
    """Whether another booking holds the slot or the decision the failed `action` let go."""
    slot = Booking.objects.filter(resource=booking.resource, status__in=["pending", "confirmed"],
                                  start__lt=booking.end, end__gt=booking.start).exclude(pk=booking.pk)
    decision = Action.objects.filter(HOLDS_ITS_DECISION, action_type="create_booking", target=action.target,
                                     customer=action.customer, decision_id=action.decision_id).exclude(pk=action.pk)
    return slot.exists() or (action.decision_id != "" and decision.exists())


def mark_closed_before(apps, schema_editor):
    """Two passes over the failed actions unmarked whose newest entry is closed: the marks a batch
    shares, a statement each, then the declined bookings resolved, one by one (each asks whether
    its slot or decision was taken since), once every slot given up has been let go."""
    Action = apps.get_model("ledger", "Action")
    Booking = apps.get_model("ledger", "Booking")
    DeadLetter = apps.get_model("dlq", "DeadLetter")

    closed = (Action.objects.filter(status="failed")
              .alias(marked=either_mark("error")).filter(marked=False)
              .annotate(entry=Coalesce(newest_entry(DeadLetter, action=OuterRef("pk")),
                                       newest_entry(DeadLetter, task=OuterRef("task_id"))))
              .filter(entry__in=list(MARK))
              .alias(declined=when(Q(entry="resolved", booking__status="released"))))
    marked, left = Counter(), []
    for batch in in_batches(closed.filter(declined=False).only("id")):
        for mark, pks in mark_batch(Action, "error", batch, marked).items():
            Booking.objects.filter(action__in=pks).exclude(status__in=[SLOT[mark], "confirmed"]).update(
                status=SLOT[mark])
    for batch in in_batches(closed.filter(declined=True).only("id", "operation_key", "target", "customer",
                                                              "decision_id")):
        for action in batch:
            booking = Booking.objects.get(action=action)
            if _taken_since(Action, Booking, action, booking):
                left.append(action.operation_key)
                continue
            mark_batch(Action, "error", [action], marked)
            Booking.objects.filter(pk=booking.pk).update(status="confirmed")
    report(marked, "failed action(s)", left)


FORWARD = r"""
CREATE OR REPLACE FUNCTION ledger_action_done_by_hand_final() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status IS DISTINCT FROM OLD.status
       OR NEW.error -> 'done_by_hand' IS DISTINCT FROM OLD.error -> 'done_by_hand'
       OR NEW.error -> 'given_up' IS DISTINCT FROM OLD.error -> 'given_up'
       OR NEW.error -> 'retryable' IS DISTINCT FROM 'false'::jsonb THEN
        RAISE EXCEPTION USING MESSAGE = 'action ' || OLD.operation_key || ' was done by hand or given up: its status, its done_by_hand and given_up marks and retryable false stay',
                              ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE OR REPLACE FUNCTION ledger_task_done_by_hand_final() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state IS DISTINCT FROM OLD.state
       OR NEW.last_error -> 'done_by_hand' IS DISTINCT FROM OLD.last_error -> 'done_by_hand'
       OR NEW.last_error -> 'retryable' IS DISTINCT FROM 'false'::jsonb THEN
        RAISE EXCEPTION USING MESSAGE = 'task ' || OLD.task_id || ' was done by hand: its state, its done_by_hand mark and retryable false stay',
                              ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END $$;
DROP TRIGGER ledger_action_done_by_hand_final ON ledger_action;
CREATE TRIGGER ledger_action_done_by_hand_final BEFORE UPDATE OF status, error ON ledger_action
    FOR EACH ROW WHEN (OLD.status = 'failed'
                       AND (OLD.error -> 'done_by_hand' = 'true'::jsonb OR OLD.error -> 'given_up' = 'true'::jsonb))
    EXECUTE FUNCTION ledger_action_done_by_hand_final();
"""
# 0051's action rule and trigger, then 0052's functions and task trigger: as 0052 left them.
BACKWARD = f"""
DROP TRIGGER ledger_task_done_by_hand_final ON ledger_task;
{DONE_BY_HAND_0051.BACKWARD}
{DONE_BY_HAND_0051.FORWARD}
{DONE_BY_HAND_0052.FORWARD}
"""
SQLITE_FORWARD = [
    "DROP TRIGGER ledger_action_done_by_hand_final",
    "DROP TRIGGER ledger_task_done_by_hand_final",
    """CREATE TRIGGER ledger_action_done_by_hand_final BEFORE UPDATE OF status, error ON ledger_action
WHEN OLD.status = 'failed' AND (json_type(OLD.error, '$.done_by_hand') = 'true' OR json_type(OLD.error, '$.given_up') = 'true')
    AND (NEW.status IS NOT OLD.status
         OR json_type(NEW.error, '$.done_by_hand') IS NOT json_type(OLD.error, '$.done_by_hand')
         OR json_type(NEW.error, '$.given_up') IS NOT json_type(OLD.error, '$.given_up')
         OR json_type(NEW.error, '$.retryable') IS NOT 'false')
BEGIN
    SELECT RAISE(ABORT, 'action done by hand or given up: its status, its done_by_hand and given_up marks and retryable false stay');
END""",
    """CREATE TRIGGER ledger_task_done_by_hand_final BEFORE UPDATE OF state, last_error ON ledger_task
WHEN (json_type(OLD.last_error, '$.done_by_hand') = 'true')
    AND (NEW.state IS NOT OLD.state
         OR json_type(NEW.last_error, '$.done_by_hand') IS NOT json_type(OLD.last_error, '$.done_by_hand')
         OR json_type(NEW.last_error, '$.retryable') IS NOT 'false')
BEGIN
    SELECT RAISE(ABORT, 'task done by hand: its state, its done_by_hand mark and retryable false stay');
END""",
]
SQLITE_BACKWARD = [
    "DROP TRIGGER ledger_action_done_by_hand_final",
    "DROP TRIGGER ledger_task_done_by_hand_final",
    *DONE_BY_HAND_0052.SQLITE_FORWARD[1:],
]


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0053_chain_checks_intact_indexed'),
        ('dlq', '0018_alert_redelivery_stamp'),
    ]

    operations = [
        migrations.RunPython(mark_closed_before, migrations.RunPython.noop),
        migrations.RunPython(rules(postgresql=FORWARD, sqlite=SQLITE_FORWARD),
                             rules(postgresql=BACKWARD, sqlite=SQLITE_BACKWARD)),
    ]
