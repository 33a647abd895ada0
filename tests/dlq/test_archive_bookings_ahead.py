"""An archive run takes a booking's action and its slot only once the booked time has passed: a
venue booked far ahead (past the key's lifetime) keeps its slot until then, and the database
still refuses another booking of that time."""

from datetime import timedelta

import pytest
from django.utils import timezone

from dlq.archive import archive_expired
from ledger.actions import SlotTaken, action_request
from ledger.executor import action_claim_next
from ledger.models import Action, Booking
from tests.factories import booking_body, make_agent

pytestmark = pytest.mark.django_db

LATER = timedelta(days=401)  # past the default 400-day lifetime and retentions


def booked(agent, key, starts_in, decision):
    body = booking_body(start=(timezone.now() + starts_in).isoformat(),
                        end=(timezone.now() + starts_in + timedelta(hours=1)).isoformat(), decision=decision)
    action = action_request(agent=agent, operation_key=key, action_type=body["action_type"], target=body["target"],
                            customer=body["customer"], decision_id=decision, params=body["params"])[0]
    claimed = action_claim_next("tests", only=action.pk)
    claimed.mark_succeeded(actor="system:tests", claim=claimed.fence, external_ref=f"bk-{key}", result={})
    assert Booking.objects.get(action=action).status == Booking.Status.CONFIRMED
    return action


def test_a_booking_whose_time_is_still_ahead_keeps_its_slot_past_its_keys_lifetime(tmp_path):
    agent = make_agent("venues")[0]
    ahead = booked(agent, "book-ahead", timedelta(days=800), "dec-ahead")
    over = booked(agent, "book-over", timedelta(days=300), "dec-over")

    archive_expired(tmp_path, now=timezone.now() + LATER)

    assert not Action.objects.filter(pk=over.pk).exists()  # its hour has passed by then: it goes
    slot = Booking.objects.get(action=ahead)
    assert slot.status == Booking.Status.CONFIRMED
    body = booking_body(start=slot.start.isoformat(), end=slot.end.isoformat(), customer="CUST-18", decision="dec-2")
    with pytest.raises(SlotTaken):
        action_request(agent=agent, operation_key="book-again", action_type=body["action_type"],
                       target=body["target"], customer=body["customer"], decision_id="dec-2", params=body["params"])
