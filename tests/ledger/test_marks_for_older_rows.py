"""Failed actions a person dealt with in the dead-letter queue before their errors said so: discarded
before `given_up` was written (a declined refund read `"retryable": false` alone), or resolved without
`done_by_hand` (a declined booking, left as it was). The client and the MCP server read them from the
row, as ones a person may still retry. Migration 0054 marks them from their newest entry, their own
or their task's, as the code marks them now, and takes a declined booking's slot and decision again
where nothing took them since; it leaves one that another booking holds, and names it. Run as the
migration runs it, over the rows as the code before the marks left them (only their entry closed)."""

import importlib

import pytest
from django.apps import apps as django_apps

from dlq.entries import deadletter_resolve
from dlq.models import DeadLetter, EntryStatus
from ledger.actions import SlotTaken, action_request, same_decision
from ledger.models import Action, ActionStatus, Booking
from ledger.tasks import task_request
from tests.factories import make_agent, open_entry, person, refund_input

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis")]

repair = importlib.import_module("ledger.migrations.0054_given_up_is_final_and_older_rows_marked")
SLOT = {"service": "massage", "start": "2026-09-10T10:00:00Z", "end": "2026-09-10T11:00:00Z"}
LATER = {**SLOT, "start": "2026-09-10T14:00:00Z", "end": "2026-09-10T15:00:00Z"}
MARK = {EntryStatus.DISCARDED: "given_up", EntryStatus.RESOLVED: "done_by_hand"}
CLOSED = pytest.mark.parametrize("closed", list(MARK))


@pytest.fixture
def billing():
    return make_agent("billing")[0]


def failed(action, *, retryable):
    """The action's one attempt failed: retryable (never reached the provider) or for good (declined)."""
    action = action.claim(owner="tests:1")
    return action.mark_failed(actor="system:executor", code="connect_failed" if retryable else "declined",
                              message="it did not happen", retryable=retryable, claim=action.fence)


def refund(agent, key="refund:ORD-M1:full:dec-1", order="ORD-M1", task=None):
    action, _ = action_request(agent=agent, operation_key=key, action_type="refund", target=order,
                               customer="CUST-M", decision_id=task.task_id if task else "dec-1", task=task,
                               params={"amount": "25.00", "currency": "EUR"})
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


@CLOSED
@pytest.mark.parametrize("retryable", [True, False], ids=["out_of_attempts", "declined"])
def test_a_refund_closed_before_says_what_the_person_decided(billing, closed, retryable):
    """Declined, it read the same discarded or resolved as while a person could retry it; a retryable
    one discarded before the discard made it failed for good, or resolved before a resolve did,
    still read that it may run."""
    action = failed(refund(billing), retryable=retryable)
    closed_before_the_marks(DeadLetter.objects.get(action=action), closed)

    the_repair()

    marked(action, MARK[closed])


def test_a_declined_booking_resolved_before_takes_its_slot_and_decision_again(billing):
    """As a resolve does now: the same slot's row confirmed again, and neither its time nor its
    decision booked a second time."""
    action = failed(booking(billing), retryable=False)
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
    action = failed(booking(billing), retryable=False)
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
    action = failed(booking(billing), retryable=True)
    assert Booking.objects.get(action=action).status == Booking.Status.PENDING
    closed_before_the_marks(DeadLetter.objects.get(action=action), closed)

    the_repair()

    marked(action, MARK[closed])
    expected = {EntryStatus.DISCARDED: Booking.Status.RELEASED, EntryStatus.RESOLVED: Booking.Status.CONFIRMED}
    assert Booking.objects.get(action=action).status == expected[closed]


@CLOSED
def test_a_tasks_failed_action_is_marked_from_its_tasks_entry(billing, closed):
    task, _ = task_request(agent=billing, task_id="t-m", workflow="refund", input=refund_input("ORD-T", "CUST-M"))
    task = task.claim(owner="tests:1")
    declined = failed(refund(billing, key="t-m:call_refund_api:v1", order="ORD-T", task=task), retryable=False)
    task.refresh_from_db()
    task.mark_dead_lettered(actor="system:sweeper", claim=task.fence,
                            error={"code": "worker_lost", "message": "the lease lapsed", "retryable": True})
    closed_before_the_marks(open_entry(task), closed)

    the_repair()

    marked(declined, MARK[closed])


def test_what_is_open_or_marked_already_is_left_and_a_second_run_changes_nothing(billing, capsys):
    failed(refund(billing, key="refund:ORD-O:full:dec-1", order="ORD-O"), retryable=False)  # its entry open
    by_hand = failed(refund(billing, key="refund:ORD-H:full:dec-1", order="ORD-H"), retryable=False)
    deadletter_resolve(DeadLetter.objects.get(action=by_hand), actor=person("olga"), note="paid by bank transfer")
    given_up = failed(refund(billing, key="refund:ORD-G:full:dec-1", order="ORD-G"), retryable=False)
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
