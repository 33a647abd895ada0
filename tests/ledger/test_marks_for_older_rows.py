"""Failed actions a person dealt with in the dead-letter queue before their errors said so: discarded
before `given_up` was written (a declined refund read `"retryable": false` alone), or resolved without
`done_by_hand` (a declined booking, left as it was). The client and the MCP server read them from the
row, as ones a person may still retry. Migration 0054 marks them from their newest entry, their own
or their task's, as the code marks them now, and takes a declined booking's slot and decision again
where nothing took them since; it leaves one that another booking holds, and names it. Migration 0055
marks the tasks so closed in their checkpoints' last errors, as ledger.tasks._task_marked does now.
Run as the migrations run them, over the rows as the code before the marks left them (only their
entry closed), and at volume: a few statements a batch of rows, never a statement a row."""

import importlib
from datetime import datetime

import pytest
from django.apps import apps as django_apps
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from dlq.entries import deadletter_redrive, deadletter_resolve
from dlq.models import Alert, DeadLetter, EntryStatus
from ledger.actions import SlotTaken, action_request, same_decision
from ledger.models import Action, ActionStatus, Booking, Task, TaskState
from tests.factories import (attempt_failed, dead_letter, dead_lettered_with_a_declined_step, failed_task_entry,
                             make_agent, new_action, open_entry, person, refund_input)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis")]

repair = importlib.import_module("ledger.migrations.0054_given_up_is_final_and_older_rows_marked")
task_repair = importlib.import_module("ledger.migrations.0055_tasks_closed_before_marked")
SLOT = {"service": "massage", "start": "2026-09-10T10:00:00Z", "end": "2026-09-10T11:00:00Z"}
LATER = {**SLOT, "start": "2026-09-10T14:00:00Z", "end": "2026-09-10T15:00:00Z"}
MARK = {EntryStatus.DISCARDED: "given_up", EntryStatus.RESOLVED: "done_by_hand"}
CLOSED = pytest.mark.parametrize("closed", list(MARK))


@pytest.fixture
def billing():
    return make_agent("billing")[0]


def refund(agent, key="refund:ORD-M1:full:dec-1", order="ORD-M1"):
    action, _ = action_request(agent=agent, operation_key=key, action_type="refund", target=order,
                               customer="CUST-M", decision_id="dec-1", params={"amount": "25.00", "currency": "EUR"})
    return action


def booking(agent, key="create_booking:ROOM-M:CUST-M:dec-1", customer="CUST-M", decision="dec-1", slot=SLOT):
    action, _ = action_request(agent=agent, operation_key=key, action_type="create_booking", target="ROOM-M",
                               customer=customer, decision_id=decision, params=slot)
    return action


def closed_before_the_marks(entry, closed):
    """The entry closed as the code before the marks left it: the entry alone, the action's error as it was."""
    if closed == EntryStatus.DISCARDED:
        return entry.discard(actor="user:olga", reason="the customer withdrew")
    return entry.resolve(actor="user:olga", note="made by phone")


def marked(action, mark):
    """The action failed as it did, its error saying what the person decided, and nothing else."""
    row = Action.objects.get(pk=action.pk)
    assert row.status == ActionStatus.FAILED
    assert row.error == {**action.error, "retryable": False, mark: True}
    return row


def the_repair():
    repair.mark_closed_before(django_apps, None)


def the_task_repair():
    task_repair.mark_tasks_closed_before(django_apps, None)


@CLOSED
@pytest.mark.parametrize("retryable", [True, False], ids=["out_of_attempts", "declined"])
def test_a_refund_closed_before_says_what_the_person_decided(billing, closed, retryable):
    """Declined, it read the same discarded or resolved as while a person could retry it; a retryable
    one discarded before the discard made it failed for good, or resolved before a resolve did,
    still read that it may run."""
    action = attempt_failed(refund(billing), retryable=retryable)
    closed_before_the_marks(DeadLetter.objects.get(action=action), closed)

    the_repair()

    marked(action, MARK[closed])


def test_a_declined_booking_resolved_before_takes_its_slot_and_decision_again(billing):
    """As a resolve does now: the same slot's row confirmed again, and neither its time nor its
    decision booked a second time."""
    action = attempt_failed(booking(billing), retryable=False)
    released = Booking.objects.get(action=action)
    assert released.status == Booking.Status.RELEASED
    closed_before_the_marks(DeadLetter.objects.get(action=action), EntryStatus.RESOLVED)

    the_repair()

    marked(action, "done_by_hand")
    assert list(Booking.objects.filter(action=action).values_list("pk", "status")) == [
        (released.pk, Booking.Status.CONFIRMED)]
    with pytest.raises(SlotTaken):
        booking(billing, key="create_booking:ROOM-M:CUST-2:dec-9", customer="CUST-2", decision="dec-9")
    assert same_decision("create_booking", "ROOM-M", "dec-1", LATER, "CUST-M") == action  # asked again, it is this


@pytest.mark.parametrize("taken", ["slot", "decision"])
def test_a_declined_booking_whose_slot_or_decision_was_booked_since_is_left_and_named(billing, capsys, taken):
    """Done by hand, it would hold what another booking holds: left as the booking failed for good
    it is (nobody retries it), and the upgrade's output names it for a person."""
    action = attempt_failed(booking(billing), retryable=False)
    before = Action.objects.get(pk=action.pk).error
    since = {"slot": lambda: booking(billing, key="create_booking:ROOM-M:CUST-2:dec-9", customer="CUST-2",
                                     decision="dec-9"),
             "decision": lambda: booking(billing, key="create_booking:ROOM-M:CUST-M:dec-1:later", slot=LATER)}[taken]()
    closed_before_the_marks(DeadLetter.objects.get(action=action), EntryStatus.RESOLVED)

    the_repair()

    assert Action.objects.get(pk=action.pk).error == before
    assert Booking.objects.get(action=action).status == Booking.Status.RELEASED
    assert Booking.objects.get(action=since).status == Booking.Status.PENDING
    assert action.operation_key in capsys.readouterr().out


@CLOSED
def test_a_retryable_booking_closed_before_lets_its_slot_go_or_keeps_it_confirmed(billing, closed):
    """Its failure kept its slot for a retry: given up, it lets it go, as a discard does now; done by
    hand, the person's booking holds it, confirmed, as a resolve does now."""
    action = attempt_failed(booking(billing), retryable=True)
    assert Booking.objects.get(action=action).status == Booking.Status.PENDING
    closed_before_the_marks(DeadLetter.objects.get(action=action), closed)

    the_repair()

    marked(action, MARK[closed])
    expected = {EntryStatus.DISCARDED: Booking.Status.RELEASED, EntryStatus.RESOLVED: Booking.Status.CONFIRMED}
    assert Booking.objects.get(action=action).status == expected[closed]


@CLOSED
def test_a_tasks_failed_action_is_marked_from_its_tasks_entry(billing, closed):
    task, declined = dead_lettered_with_a_declined_step(billing, "t-m", "CUST-M")
    closed_before_the_marks(open_entry(task), closed)

    the_repair()

    marked(declined, MARK[closed])


def test_what_is_open_or_marked_already_is_left_and_a_second_run_changes_nothing(billing, capsys):
    attempt_failed(refund(billing, key="refund:ORD-O:full:dec-1", order="ORD-O"), retryable=False)  # its entry open
    by_hand = attempt_failed(refund(billing, key="refund:ORD-H:full:dec-1", order="ORD-H"), retryable=False)
    deadletter_resolve(DeadLetter.objects.get(action=by_hand), actor=person("olga"), note="paid by bank transfer")
    given_up = attempt_failed(refund(billing, key="refund:ORD-G:full:dec-1", order="ORD-G"), retryable=False)
    closed_before_the_marks(DeadLetter.objects.get(action=given_up), EntryStatus.DISCARDED)
    errors = dict(Action.objects.values_list("pk", "error"))

    the_repair()

    assert "1 failed action(s) marked given up and 0 done by hand" in capsys.readouterr().out
    marked(given_up, "given_up")
    assert {pk: error for pk, error in Action.objects.values_list("pk", "error") if pk != given_up.pk} == {
        pk: error for pk, error in errors.items() if pk != given_up.pk}
    errors = dict(Action.objects.values_list("pk", "error"))
    the_repair()
    assert dict(Action.objects.values_list("pk", "error")) == errors and capsys.readouterr().out == ""


def task_closed_before_the_marks(entry, closed):
    """The task's entry closed as the code before the marks left it: a dead-lettered task discarded
    was cancelled, and its checkpoint's last error kept as it was. Returns the task, as it was then."""
    if closed == EntryStatus.DISCARDED and entry.task.state == TaskState.DEAD_LETTERED:
        entry.task.cancel(actor="user:olga", reason="the customer withdrew")
    closed_before_the_marks(entry, closed)
    return Task.objects.get(pk=entry.task_id)


@CLOSED
@pytest.mark.parametrize("stopped", ["dead_lettered", "failed"])
def test_a_task_closed_before_says_what_the_person_decided_in_its_checkpoint(billing, closed, stopped):
    """Its agent reads it from the checkpoint: no redrive comes. Its state stays as the close left it."""
    entry = {"dead_lettered": dead_letter, "failed": failed_task_entry}[stopped](billing, "t-c")
    task = task_closed_before_the_marks(entry, closed)

    the_task_repair()

    row = Task.objects.get(pk=task.pk)
    assert (row.state, row.last_error) == (task.state, {**task.last_error, "retryable": False, MARK[closed]: True})


def test_a_task_resolved_before_is_held_by_the_databases_rule_once_marked(billing):
    """The rule let the mark in (the row had none) and holds the task from then on: sent back to the
    queue, its runner would make what the person made by hand again."""
    task = task_closed_before_the_marks(dead_letter(billing, "t-h"), EntryStatus.RESOLVED)

    the_task_repair()

    with pytest.raises(IntegrityError, match="done by hand"), transaction.atomic():
        Task.objects.filter(pk=task.pk).update(state=TaskState.QUEUED, next_attempt_at=timezone.now())
    assert Task.objects.get(pk=task.pk).state == TaskState.DEAD_LETTERED


def test_a_task_open_redriven_or_marked_already_is_left_and_a_second_run_changes_nothing(billing, capsys):
    olga = person("olga")
    dead_letter(billing, "t-open")
    deadletter_redrive(dead_letter(billing, "t-redriven"), actor=olga, reason="the provider is back")
    deadletter_resolve(dead_letter(billing, "t-marked"), actor=olga, note="paid by bank transfer")
    given_up = task_closed_before_the_marks(dead_letter(billing, "t-given-up"), EntryStatus.DISCARDED)
    errors = dict(Task.objects.values_list("pk", "last_error"))

    the_task_repair()

    assert "1 task(s) marked given up and 0 done by hand" in capsys.readouterr().out
    after = dict(Task.objects.values_list("pk", "last_error"))
    assert after.pop(given_up.pk) == {**given_up.last_error, "retryable": False, "given_up": True}
    assert after == {pk: error for pk, error in errors.items() if pk != given_up.pk}
    errors = dict(Task.objects.values_list("pk", "last_error"))
    the_task_repair()
    assert dict(Task.objects.values_list("pk", "last_error")) == errors and capsys.readouterr().out == ""


# At volume: rows made straight in the tables, as the code before the marks left them, their entries
# closed in turn (discarded, resolved); every third action a booking, its slot kept for a retry.
START, END = datetime.fromisoformat(SLOT["start"]), datetime.fromisoformat(SLOT["end"])


def closed(n):
    """The n-th row's entry: discarded, resolved, in turn."""
    return list(MARK)[n % 2]


def closed_entries(rows, subject, numbers):
    """An entry of each row, closed as `closed` says, with its alert; each row is told the mark its
    entry calls for (`row.mark`) and keeps the error it had (`row.error_said`)."""
    for row, n in zip(rows, numbers, strict=True):
        row.closed = closed(n)
        row.mark, row.error_said = MARK[row.closed], row.error if subject == "action" else row.last_error
    entries = DeadLetter.objects.bulk_create(
        DeadLetter(**{subject: row}, status=row.closed, snapshot={}, last_error=row.error_said, attempts=1,
                   decided_by="user:olga", decided_at=timezone.now()) for row in rows)
    Alert.objects.bulk_create(Alert(kind=Alert.Kind.DEAD_LETTER, dead_letter=entry, subject=str(entry.pk), link="/")
                              for entry in entries)


def actions_closed_in_bulk(agent, numbers, *, declined=False):
    """Failed actions whose entries were closed before the marks; `declined`: every third, a booking,
    failed for good (its slot let go) where its entry is resolved."""
    rows = []
    for n in numbers:
        retryable = not (declined and n % 3 == 0 and closed(n) == EntryStatus.RESOLVED)
        fields = {"action_type": "create_booking", "target": f"ROOM-{n}", "params": SLOT} if n % 3 == 0 else {
            "target": f"ORD-B{n}"}
        rows.append(new_action(agent, ActionStatus.FAILED, key=f"bulk-{n}", customer="CUST-M", decision_id=f"dec-{n}",
                               retryable=retryable, **fields))
    actions = Action.objects.bulk_create(rows)
    Booking.objects.bulk_create(
        Booking(action=action, resource=action.target, customer="CUST-M", start=START, end=END,
                status=Booking.Status.PENDING if action.error["retryable"] else Booking.Status.RELEASED)
        for action in actions if action.action_type == "create_booking")
    closed_entries(actions, "action", numbers)
    return actions


def tasks_closed_in_bulk(agent, numbers):
    """Dead-lettered tasks whose entries were closed before the marks."""
    tasks = Task.objects.bulk_create(
        Task(task_id=f"t-bulk-{n}", fingerprint="f" * 64, workflow="refund", input=refund_input(f"ORD-T{n}", "CUST-M"),
             agent=agent, state=TaskState.DEAD_LETTERED, max_attempts=3,
             last_error={"code": "crash", "message": "the worker gave up", "retryable": True}) for n in numbers)
    closed_entries(tasks, "task", numbers)
    return tasks


def marked_in_bulk(rows, column):
    """Each row says what its entry's person decided, beside what it said, and nothing else."""
    Model = type(rows[0])
    now = dict(Model.objects.filter(pk__in=[row.pk for row in rows]).values_list("pk", column))
    assert now == {row.pk: {**row.error_said, "retryable": False, row.mark: True} for row in rows}


def slots_in_bulk(actions):
    """Given up, a booking's slot is let go; done by hand, it is confirmed, taken again if it was let go."""
    slot = {"given_up": Booking.Status.RELEASED, "done_by_hand": Booking.Status.CONFIRMED}
    expected = {action.pk: slot[action.mark] for action in actions if action.action_type == "create_booking"}
    assert dict(Booking.objects.filter(action__in=actions).values_list("action", "status")) == expected


IN_BULK = {"actions": (actions_closed_in_bulk, the_repair, "error"),
           "tasks": (tasks_closed_in_bulk, the_task_repair, "last_error")}


@pytest.mark.parametrize("rows", list(IN_BULK))
def test_a_repair_makes_a_few_statements_a_batch_not_a_row(billing, rows, django_assert_max_num_queries):
    """At millions of rows, a statement or two a row, in the migration's one transaction, would run
    for hours: ten times the rows in one batch take no more statements."""
    make, run, column = IN_BULK[rows]
    fifty = make(billing, range(50))
    with CaptureQueriesContext(connection) as counted:
        run()
    more = make(billing, range(50, 550))
    with django_assert_max_num_queries(len(counted)):
        run()
    marked_in_bulk(fifty + more, column)
    if rows == "actions":
        slots_in_bulk(fifty + more)


def test_the_repairs_go_on_past_a_batch_to_the_last_row(billing, monkeypatch, capsys):
    """Batches of a few rows: every action, its slot and every task marked, each counted once, the
    declined bookings resolved among them (looked at one by one, after the rest) too."""
    monkeypatch.setattr(repair, "BATCH", 4)
    actions = actions_closed_in_bulk(billing, range(30), declined=True)
    tasks = tasks_closed_in_bulk(billing, range(9))
    assert Booking.objects.filter(action__in=actions, status=Booking.Status.RELEASED).count() == 5

    the_repair()
    the_task_repair()

    marked_in_bulk(actions, "error")
    slots_in_bulk(actions)
    marked_in_bulk(tasks, "last_error")
    out = capsys.readouterr().out
    assert "15 failed action(s) marked given up and 15 done by hand" in out
    assert "5 task(s) marked given up and 4 done by hand" in out
