"""A booking's slot let go is taken again only by a booking a person then did by hand, held by the
database (ledger.dbrules.BOOKING_RELEASED_FINAL; runs on PostgreSQL and SQLite, as the other rules'
tests do). A booking failed for good (declined) releases its slot, and another booking may take that
time; only once a person has booked it outside Surety and resolved its dead letter (its action done
by hand: ledger.actions.action_done_by_hand) is the same row confirmed again (Booking.TRANSITIONS and
Booking._refuse say so in Python). A raw UPDATE or a queryset's `.update()` that confirmed it, or put
it back to pending, without that would hold a slot, and on PostgreSQL a place in the exclusion
constraint, for a booking nobody made."""

import pytest
from django.db import IntegrityError, connection, transaction

from ledger.actions import action_done_by_hand, action_give_up, action_request
from ledger.models import Action, ActionStatus, Booking, InvalidTransition
from tests.factories import make_agent, person

S = ActionStatus
B = Booking.Status
SLOT = {"service": "repair", "start": "2027-03-01T10:00:00Z", "end": "2027-03-01T11:00:00Z"}
pytestmark = pytest.mark.django_db


@pytest.fixture
def declined():
    """A booking the provider declined: failed for good, its slot released."""
    action, _ = action_request(agent=make_agent("booker")[0], operation_key="create_booking:ROOM-R:CUST-R:dec-1",
                               action_type="create_booking", target="ROOM-R", customer="CUST-R", decision_id="dec-1",
                               params=SLOT)
    action = action.claim(owner="tests:1")
    action = action.mark_failed(actor="system:executor", code="declined", message="the slot is closed",
                                retryable=False, claim=action.fence)
    assert Booking.objects.get(action=action).status == B.RELEASED
    return action


def refused(write):
    with pytest.raises(IntegrityError, match="let go"), transaction.atomic():
        write()


def raw_update(booking, status):
    with connection.cursor() as cursor:
        cursor.execute("UPDATE ledger_booking SET status = %s WHERE id = %s", [status, booking.pk])


def still_released(action):
    assert Booking.objects.get(action=action).status == B.RELEASED


@pytest.mark.parametrize("status", [B.CONFIRMED, B.PENDING])
def test_a_raw_update_that_takes_a_released_slot_again_is_refused(declined, status):
    booking = Booking.objects.get(action=declined)

    refused(lambda: raw_update(booking, status))

    still_released(declined)


def test_a_queryset_update_that_confirms_a_released_slot_is_refused(declined):
    refused(lambda: Booking.objects.filter(action=declined).update(status=B.CONFIRMED))

    still_released(declined)


def test_a_booking_given_up_is_not_done_by_hand_and_its_slot_stays_released(declined):
    action_give_up(declined, actor=person("olga"), reason="the customer went elsewhere")

    refused(lambda: raw_update(Booking.objects.get(action=declined), B.CONFIRMED))

    still_released(declined)


def test_python_refuses_first(declined):
    with pytest.raises(InvalidTransition, match="let go"):
        Booking.objects.get(action=declined).confirm()

    still_released(declined)


def test_a_booking_done_by_hand_takes_its_slot_again_the_same_row(declined):
    released = Booking.objects.get(action=declined)

    action_done_by_hand(declined, actor=person("olga"), reason="booked by phone")

    assert list(Booking.objects.filter(action=declined).values_list("pk", "status")) == [(released.pk, B.CONFIRMED)]


def test_the_database_asks_exactly_what_python_asks_its_action_done_by_hand(declined):
    """Marked done by hand (the database lets the mark in on a failed row nobody marked), the action's
    released slot may be confirmed by any statement; put back to pending, never."""
    Action.objects.filter(pk=declined.pk).update(error={**declined.error, "done_by_hand": True})
    booking = Booking.objects.get(action=declined)

    refused(lambda: raw_update(booking, B.PENDING))
    raw_update(booking, B.CONFIRMED)

    assert Booking.objects.get(pk=booking.pk).status == B.CONFIRMED


def test_the_rest_of_a_released_row_may_still_be_written_and_a_pending_one_still_moves(declined):
    Booking.objects.filter(action=declined).update(customer="CUST-R2")
    other, _ = action_request(agent=make_agent("other")[0], operation_key="create_booking:ROOM-S:CUST-S:dec-2",
                              action_type="create_booking", target="ROOM-S", customer="CUST-S", decision_id="dec-2",
                              params=SLOT)
    pending = Booking.objects.get(action=other)
    assert pending.status == B.PENDING

    raw_update(pending, B.RELEASED)

    assert Booking.objects.get(action=declined).customer == "CUST-R2"
    assert Booking.objects.get(pk=pending.pk).status == B.RELEASED


@pytest.mark.parametrize("write", [
    "UPDATE ledger_booking SET status = 'released' WHERE id = %s",
    "UPDATE ledger_booking SET status = 'pending' WHERE id = %s",
    "UPDATE ledger_booking SET resource = 'ROOM-OTHER' WHERE id = %s",
    "UPDATE ledger_booking SET start = start + interval '1 hour', \"end\" = \"end\" + interval '1 hour' WHERE id = %s",
], ids=["released", "pending", "another resource", "another time"])
def test_a_confirmed_booking_keeps_its_status_and_slot_whatever_writes_it(declined, write):
    """Confirmed is final (Booking.TRANSITIONS): a write that freed or moved its slot would let another
    booking take a time the provider booked. (ledger.dbrules.BOOKING_CONFIRMED_FINAL)"""
    action_done_by_hand(declined, actor=person("olga"), reason="booked by phone")
    booking = Booking.objects.get(action=declined)
    assert booking.status == B.CONFIRMED
    if connection.vendor == "sqlite":
        write = write.replace("+ interval '1 hour'", "|| ''")  # a write of the same columns, SQLite's way
        write = write.replace("start = start || ''", "start = '2027-03-01 12:00:00'")

    with pytest.raises(IntegrityError, match="confirmed"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(write, [booking.pk])

    assert Booking.objects.filter(pk=booking.pk).values_list("status", "resource", "start").get() == (
        B.CONFIRMED, booking.resource, booking.start)
    Booking.objects.filter(pk=booking.pk).update(customer="CUST-R2")  # the rest of the row may be written
