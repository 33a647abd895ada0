"""A booking asked again under another key for its decision, while the booking that holds the
decision lets go of its slot: the insert is refused by the once-per-decision rule, and by the time
the intake looks for the booking that refused it, that booking is cancelled (out of BOOKING_HELD)
and the look finds nothing. The IntegrityError was raised on, and the agent got a 500; the
decision is free, so the intake records the request once more, as new.

The interleaving is made certain: the intake's look (ledger.actions.same_decision) is wrapped so
that, before it reads, a person's cancel of the holding booking commits on a thread and database
connection of its own. Nothing else is stood in for: real PostgreSQL, the API in process."""

import pytest

from ledger import actions
from ledger.models import Action, Booking
from tests.factories import another_transaction, booking_body, make_agent_on, post_action_in_process

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("jobs_to_test_redis")]

SLOT = ("2026-12-01T10:00:00Z", "2026-12-01T11:00:00Z")


def test_a_second_key_while_the_holding_booking_is_cancelled_is_recorded_not_a_500(client, monkeypatch):
    make_agent_on(client, "booker", grants=("create_booking",))
    assert post_action_in_process(client, "b-1", booking_body(*SLOT)).status_code == 201
    looks = []

    def cancelled_first(*args, **kwargs):
        if not looks:  # the intake's first look, after its insert was refused
            with another_transaction(lambda: Action.objects.get(operation_key="b-1").cancel(
                    actor="user:front-desk", reason="the customer called")):
                pass  # committed when the block ends, before the look reads
        looks.append(args)
        return same_decision(*args, **kwargs)

    same_decision = actions.same_decision
    monkeypatch.setattr(actions, "same_decision", cancelled_first)

    again = post_action_in_process(client, "b-2", booking_body(*SLOT))

    assert looks, "the insert was not refused by the once-per-decision rule"
    assert again.status_code == 201, again.content
    assert again.json()["operation_key"] == "b-2"
    assert dict(Action.objects.values_list("operation_key", "status")) == {"b-1": "cancelled", "b-2": "queued"}
    assert dict(Booking.objects.values_list("action__operation_key", "status")) == {"b-1": "released",
                                                                                    "b-2": "pending"}
