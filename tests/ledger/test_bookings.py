"""A resource is never booked twice for the same time: the database refuses the overlap."""

from datetime import datetime, timezone

import pytest
from django.db import IntegrityError, transaction

from ledger.models import Action, Booking
from tests.factories import booking_body, make_agent_on, post_action_in_process

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("jobs_to_test_redis")]


@pytest.fixture
def post(client):
    make_agent_on(client, "booker", grants=("create_booking",))
    return lambda key, body: post_action_in_process(client, key, body)


def test_an_overlapping_booking_is_refused_with_409_and_nothing_recorded(post):
    assert post("b-1", booking_body("2026-12-01T10:00:00Z", "2026-12-01T11:00:00Z")).status_code == 201
    clash = post("b-2", booking_body("2026-12-01T10:30:00Z", "2026-12-01T11:30:00Z", customer="CUST-18"))
    assert clash.status_code == 409
    assert clash["Content-Type"] == "application/problem+json" and clash.json()["code"] == "booking_conflict"
    assert not Action.objects.filter(operation_key="b-2").exists()
    assert Booking.objects.count() == 1


def test_back_to_back_bookings_do_not_overlap(post):
    assert post("b-1", booking_body("2026-12-01T10:00:00Z", "2026-12-01T11:00:00Z")).status_code == 201
    assert post("b-2", booking_body("2026-12-01T11:00:00Z", "2026-12-01T12:00:00Z", decision="dec-2")).status_code == 201


def test_a_rejected_booking_frees_its_slot(post):
    post("b-1", booking_body("2026-12-01T10:00:00Z", "2026-12-01T11:00:00Z"))
    Action.objects.get(operation_key="b-1").cancel(actor="system:tests", reason="customer called")
    assert Booking.objects.get().status == "released"
    # Its decision is free again too: it booked nothing (one booking per decision while it holds its slot).
    assert post("b-2", booking_body("2026-12-01T10:00:00Z", "2026-12-01T11:00:00Z")).status_code == 201


def test_one_decision_books_once_whatever_the_key_and_the_times(post, client):
    """One booking per resource, customer and decision: moved onto a free slot under another key,
    it is the same decision asked otherwise (422), as a refund's other amount is. Before, it was
    booked a second time. Another agent's is refused as the slot's would be."""
    assert post("b-1", booking_body("2026-12-01T10:00:00Z", "2026-12-01T11:00:00Z")).status_code == 201
    moved = post("b-2", booking_body("2026-12-01T14:00:00Z", "2026-12-01T15:00:00Z"))
    assert (moved.status_code, moved.json()["code"]) == (422, "idempotency_key_reused")
    assert "b-1" in moved.json()["detail"]
    make_agent_on(client, "front-desk", grants=("create_booking",))
    theirs = post("other-1", booking_body("2026-12-01T16:00:00Z", "2026-12-01T17:00:00Z"))
    assert (theirs.status_code, theirs.json()["code"]) == (409, "booking_conflict")
    assert list(Action.objects.values_list("operation_key", flat=True)) == ["b-1"] and Booking.objects.count() == 1
    with pytest.raises(IntegrityError), transaction.atomic():  # the database holds it, whatever inserts
        Action.objects.create(**{f.attname: getattr(Action.objects.get(), f.attname) for f in Action._meta.concrete_fields
                                 if not f.primary_key and f.attname != "operation_key"}, operation_key="b-3")


def test_the_database_itself_refuses_an_overlapping_live_booking(post):
    post("b-1", booking_body("2026-12-01T10:00:00Z", "2026-12-01T11:00:00Z"))
    other = Action.objects.get(operation_key="b-1")
    other.pk, other.operation_key, other.decision_id = None, "b-raw", "dec-raw"
    other.save()
    with pytest.raises(IntegrityError), transaction.atomic():
        Booking.objects.create(action=other, resource="ROOM-1", customer="CUST-9",
                               start=datetime(2026, 12, 1, 10, 15, tzinfo=timezone.utc),
                               end=datetime(2026, 12, 1, 10, 45, tzinfo=timezone.utc))


def test_the_same_booking_under_another_key_is_the_first_booking(post):
    """A client's older keys named the times: a restarted agent's new key finds its booking."""
    first = post("create_booking:ROOM-1:2026-12-01T10:00:dec-1", booking_body("2026-12-01T10:00:00Z",
                                                                              "2026-12-01T11:00:00Z"))
    again = post("create_booking:ROOM-1:CUST-17:dec-1", booking_body("2026-12-01T10:00:00Z", "2026-12-01T11:00:00Z"))

    assert first.status_code == 201
    assert again.status_code == 200 and again["Idempotent-Replayed"] == "true"
    assert again.json()["operation_key"] == "create_booking:ROOM-1:2026-12-01T10:00:dec-1"
    assert Action.objects.count() == 1 and Booking.objects.count() == 1


def test_the_same_decision_moved_onto_its_own_slot_is_refused(post):
    post("b-1", booking_body("2026-12-01T10:00:00Z", "2026-12-01T11:00:00Z"))

    moved = post("b-2", booking_body("2026-12-01T10:30:00Z", "2026-12-01T11:30:00Z"))

    assert moved.status_code == 422 and moved.json()["code"] == "idempotency_key_reused"
    assert list(Action.objects.values_list("operation_key", flat=True)) == ["b-1"]


def test_a_booking_whose_slot_another_holds_now_is_refused_not_answered_with_its_old_one(client, post):
    """The agent's first booking of the slot was cancelled and another agent booked it since:
    asking again under a new key is a clash with that booking, not a replay of the cancelled one."""
    post("b-1", booking_body("2026-12-01T10:00:00Z", "2026-12-01T11:00:00Z"))
    Action.objects.get(operation_key="b-1").cancel(actor="system:tests", reason="customer called")
    mine = client.defaults["HTTP_AUTHORIZATION"]
    make_agent_on(client, "front-desk", grants=("create_booking",))
    assert post("other-1", booking_body("2026-12-01T10:00:00Z", "2026-12-01T11:00:00Z",
                                        customer="CUST-18")).status_code == 201
    client.defaults["HTTP_AUTHORIZATION"] = mine

    again = post("b-2", booking_body("2026-12-01T10:00:00Z", "2026-12-01T11:00:00Z", decision="dec-2"))

    assert again.status_code == 409 and again.json()["code"] == "booking_conflict"
    assert not Action.objects.filter(operation_key="b-2").exists()
    # Under the first decision alike: its cancelled booking holds neither the slot nor the decision.
    same = post("b-3", booking_body("2026-12-01T10:00:00Z", "2026-12-01T11:00:00Z"))
    assert same.status_code == 409 and same.json()["code"] == "booking_conflict"
