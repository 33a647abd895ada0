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
no other booking holds its decision, as the resolve now requires. Where another does, the action is
left as it is and the migration's output names it: it reads as what it is, a booking failed for good
whose slot went to another, which nobody retries (a resolve today is refused alike, leaving it so).

Kept simple: the repair writes the marks and the slots only. No audit event, as the project's data
migrations write none (the entry's own events say who closed it, when and why); what such a failure
held for its retry is not looked at again (it waits for a person, as it did); and an action whose
closed entry an archive run has taken since is not found, and is left as it is.
"""

import importlib
from collections import Counter

from django.db import migrations
from django.db.models import OuterRef, Q, Subquery
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


def _taken_since(Action, Booking, action, booking):
    """Whether another booking holds the slot or the decision the failed `action` let go."""
    slot = Booking.objects.filter(resource=booking.resource, status__in=["pending", "confirmed"],
                                  start__lt=booking.end, end__gt=booking.start).exclude(pk=booking.pk)
    decision = Action.objects.filter(HOLDS_ITS_DECISION, action_type="create_booking", target=action.target,
                                     customer=action.customer, decision_id=action.decision_id).exclude(pk=action.pk)
    return slot.exists() or (action.decision_id != "" and decision.exists())


def mark_closed_before(apps, schema_editor):
    Action = apps.get_model("ledger", "Action")
    Booking = apps.get_model("ledger", "Booking")
    DeadLetter = apps.get_model("dlq", "DeadLetter")

    def newest(**subject):
        return Subquery(DeadLetter.objects.filter(**subject).order_by("-pk").values("status")[:1])

    closed = (Action.objects.filter(status="failed")
              .annotate(entry=Coalesce(newest(action=OuterRef("pk")), newest(task=OuterRef("task_id"))))
              .filter(entry__in=list(MARK)).order_by("pk")
              .only("id", "operation_key", "action_type", "target", "customer", "decision_id", "error"))
    marked, left = Counter(), []
    for action in list(closed):  # read before any write: an open cursor (SQLite's) would see the rows written
        error = action.error or {}
        if error.get("done_by_hand") or error.get("given_up"):
            continue
        mark = MARK[action.entry]
        booking = Booking.objects.filter(action=action).first()
        if (booking is not None and mark == "done_by_hand" and booking.status == "released"
                and _taken_since(Action, Booking, action, booking)):
            left.append(action.operation_key)
            continue
        Action.objects.filter(pk=action.pk).update(error={**error, "retryable": False, mark: True},
                                                   updated_at=timezone.now())
        if booking is not None and booking.status not in (SLOT[mark], "confirmed"):
            Booking.objects.filter(pk=booking.pk).update(status=SLOT[mark])
        marked[mark] += 1
    if marked or left:
        print(f"\n  {marked['given_up']} failed action(s) marked given up and {marked['done_by_hand']} done by hand "
              "from their closed dead-letter entries")
    if left:
        print(f"  {len(left)} booking(s) resolved by hand after failing for good left unmarked, another booking "
              f"holding their slot or decision: {', '.join(left[:20])}{' …' if len(left) > 20 else ''}")


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
