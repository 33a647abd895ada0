"""A failure tried again whose grant lapsed while it waited in the queue asks the provider before it
is cancelled (decision 59). A booking's attempt failed retryable (its slot kept, its error on it)
while the provider had made it under its key; it is tried again, and before a worker claims it, its
grant is revoked or passes its review date (shadow again). The claim cancelled it at once and freed
its slot, never asking: a new booking overlapping it was then accepted while the provider held the
first. Now the claim leaves it to the run, which looks first: found, it is the provider's booking;
absent, it is cancelled as before. The sandbox provider over HTTP (live_server), real PostgreSQL."""

from datetime import timedelta

import httpx
import pytest
from django.utils import timezone

from ledger.actions import action_request, action_retry
from ledger.executor import action_claim_next, action_run_claimed
from ledger.grants import agent_revoke, capability
from ledger.models import Action, ActionStatus, Booking, Capability
from tests.factories import attempt_failed, audit_events, make_agent, make_grants_live, sandbox_list

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("jobs_to_test_redis")]

KEY = "booking:ROOM-1:dec-1"
SLOT = {"service": "massage", "start": "2026-09-10T10:00:00Z", "end": "2026-09-10T11:00:00Z"}


def revoked(agent):
    agent_revoke(agent, capability(Capability.Kind.ACTION_TYPE, "create_booking"), actor="system:tests",
                 reason="the agent misbehaved")


def past_its_review_date(agent):
    make_grants_live(agent, until=timezone.now() - timedelta(seconds=1))


@pytest.fixture
def provider(live_server, settings):
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox/v1"
    # Closed after the test: a connection kept alive holds a server thread's database session.
    with httpx.Client(base_url=live_server.url, timeout=10,
                      headers={"Authorization": f"Bearer {settings.SANDBOX_API_KEY}"}) as client:
        yield client


def retried_failure(agent, provider, *, made):
    """The booking recorded, its attempt failed retryable; with `made`, the provider made it under
    the key all the same (as the attempt's request, sent). Then it is tried again: queued, its error
    still on it."""
    action, _ = action_request(agent=agent, operation_key=KEY, action_type="create_booking", target="ROOM-1",
                               customer="CUST-17", params=SLOT)
    booking_id = None
    if made:
        answer = provider.post("/sandbox/v1/bookings", json={
            "resource": "ROOM-1", "customer": "CUST-17", **SLOT, "metadata": {"operation_key": KEY}},
            headers={"Idempotency-Key": KEY})
        assert answer.status_code == 201, answer.text
        booking_id = answer.json()["id"]
    failed = attempt_failed(action, retryable=True)
    retried = action_retry(failed, actor="system:tests", reason="the customer still waits")
    assert retried.status == ActionStatus.QUEUED and retried.error
    return retried, booking_id


def claimed_and_run(action):
    claim = action_claim_next("tests:2", only=action.pk)
    if claim is not None:
        action_run_claimed(claim)
    return Action.objects.get(pk=action.pk)


@pytest.mark.parametrize("lapse", [revoked, past_its_review_date])
def test_a_retried_booking_whose_grant_lapsed_is_the_providers_when_it_holds_it(provider, lapse):
    agent, _ = make_agent("booker", grants=("create_booking",))
    action, booking_id = retried_failure(agent, provider, made=True)
    lapse(agent)

    row = claimed_and_run(action)

    assert (row.status, row.external_ref) == (ActionStatus.SUCCEEDED, booking_id), audit_events(row).values_list(
        "verb", "reason")
    assert row.evidence[-1]["found"] is True
    assert Booking.objects.get(action=row).status == Booking.Status.CONFIRMED  # the slot stays taken
    assert [made["id"] for made in sandbox_list(provider, "bookings", operation_key=KEY)] == [booking_id]


@pytest.mark.parametrize("lapse", [revoked, past_its_review_date])
def test_a_retried_booking_whose_grant_lapsed_is_cancelled_when_the_provider_has_none(provider, lapse):
    agent, _ = make_agent("booker", grants=("create_booking",))
    action, _ = retried_failure(agent, provider, made=False)
    lapse(agent)

    row = claimed_and_run(action)

    assert row.status == ActionStatus.CANCELLED
    assert audit_events(row, "cancelled").get().reason.startswith(("grant revoked", "grant not live"))
    assert Booking.objects.get(action=row).status == Booking.Status.RELEASED
    assert row.evidence[-1]["looked_first"]["found"] is False  # asked before it was let go
    assert sandbox_list(provider, "bookings", operation_key=KEY) == []  # and nothing sent
