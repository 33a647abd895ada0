"""A failed action whose dead letter a person resolves (done by hand), alone or as its task's, is
failed for good of its own kind: its error says no retry comes and that a person did it by hand,
and unlike one given up (discarded), what it did stands. A booking keeps its slot, confirmed; a
refund stays in its customer's daily total; a retry of it, which would make the effect again, is
refused. Before, a standalone one stayed retryable (its agent read that it may still run), and a
task's was given up: its booking let its slot go, its refund left the daily total. A booking that
had already failed for good (declined) is done by hand too, and takes its slot and decision again:
before, it was left as it was, its row read as if nobody had dealt with it, and the ledger took
another booking of that time beside the one the person made. If another booking took either since,
the resolve is refused on the page, saying what holds it, and nothing is written."""

from decimal import Decimal

import pytest
from django.test import Client

from approvals.intake import customer_total_today
from dlq.entries import deadletter_discard, deadletter_resolve
from dlq.models import DeadLetter
from ledger.actions import SlotTaken, action_request, action_retry, action_retry_by_person
from ledger.audit import actor_label
from ledger.models import Action, ActionStatus, Booking, InvalidTransition
from ledger.tasks import task_request
from tests.factories import (audit_events, make_agent_on, open_entry, person, post_action_in_process, refund_body,
                             refund_input)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis")]

SLOT = {"service": "massage", "start": "2026-09-10T10:00:00Z", "end": "2026-09-10T11:00:00Z"}
KEY = "refund:ORD-H1:full:dec-1"


@pytest.fixture
def billing(client, settings):
    settings.MAX_ATTEMPTS = 1  # a failure that may be retried opens its entry at once
    return make_agent_on(client)


def failed(action, *, retryable=True):
    """The action's one attempt failed: retryable (never reached the provider) or for good (declined)."""
    action = action.claim(owner="tests:1")
    return action.mark_failed(actor="system:executor", code="connect_failed" if retryable else "declined",
                              message="it did not happen", retryable=retryable, claim=action.fence)


def refund(agent, key=KEY, order="ORD-H1", customer="CUST-H", task=None):
    action, _ = action_request(agent=agent, operation_key=key, action_type="refund", target=order, customer=customer,
                               decision_id=task.task_id if task else "dec-1", task=task,
                               params={"amount": "25.00", "currency": "EUR"})
    return action


def booking(agent, key="create_booking:ROOM-H:CUST-H:dec-1", task=None):
    action, _ = action_request(agent=agent, operation_key=key, action_type="create_booking", target="ROOM-H",
                               customer="CUST-H", decision_id="dec-1", task=task, params=SLOT)
    return action


def dead_lettered_task(agent, task_id):
    """A claimed refund task, and the way to dead-letter it (out of attempts) once its action failed."""
    task, _ = task_request(agent=agent, task_id=task_id, workflow="refund", input=refund_input("ORD-T", "CUST-H"))
    return task.claim(owner="tests:1")


def dead_letter(task):
    task.refresh_from_db()
    task.mark_dead_lettered(actor="system:sweeper", claim=task.fence,
                            error={"code": "worker_lost", "message": "the lease lapsed", "retryable": True})
    return open_entry(task)


def done_by_hand(action, olga, note):
    """What every action resolved by hand shows: failed, not retryable, done by hand, audited."""
    action.refresh_from_db()
    assert action.status == ActionStatus.FAILED
    assert (action.error["retryable"], action.error["done_by_hand"]) == (False, True)
    assert not action.is_retryable_failure and action.is_done_by_hand
    [event] = audit_events(action, "done_by_hand")
    assert event.actor == actor_label(olga) and note in event.reason
    assert not audit_events(action, "given_up").exists()
    return action


@pytest.mark.parametrize("retryable", [True, False], ids=["out_of_attempts", "declined"])
def test_a_refund_resolved_by_hand_stays_in_the_daily_total_and_tells_its_agent_no_retry_comes(
        client, billing, retryable):
    action = failed(refund(billing), retryable=retryable)
    olga = person("olga", "operators")

    deadletter_resolve(DeadLetter.objects.get(action=action), actor=olga, note="refunded by bank transfer, ticket 81")

    done_by_hand(action, olga, "refunded by bank transfer, ticket 81")
    # The money moved, by hand: the customer's later refunds are summed with it.
    assert customer_total_today("refund", "EUR", "CUST-H") == Decimal("25.00")
    # Its agent reads (and replays its key into) a failure no retry follows, done by hand; nothing runs.
    read = client.get(f"/api/v1/actions/{KEY}").json()
    assert (read["status"], read["error"]["retryable"], read["error"]["done_by_hand"]) == ("failed", False, True)
    again = post_action_in_process(client, KEY, refund_body(order="ORD-H1", customer="CUST-H", decision="dec-1"))
    assert again.status_code == 200, again.content
    assert again.json()["error"]["done_by_hand"] is True
    assert Action.objects.get(pk=action.pk).status == ActionStatus.FAILED


def test_a_refund_discarded_still_leaves_the_daily_total(client, billing):
    action = failed(refund(billing))
    deadletter_discard(DeadLetter.objects.get(action=action), actor=person("olga", "operators"),
                       reason="the customer withdrew the claim")
    action.refresh_from_db()
    assert action.error["retryable"] is False and "done_by_hand" not in action.error
    assert customer_total_today("refund", "EUR", "CUST-H") == Decimal(0)


@pytest.mark.parametrize("retryable", [True, False], ids=["out_of_attempts", "declined"])
def test_a_retry_of_a_refund_done_by_hand_is_refused_and_says_why(client, billing, retryable):
    """A person's word lifts a failure's permanence (`retry_allowed`), not a person's own work: a
    retry would refund the customer twice."""
    action = failed(refund(billing), retryable=retryable)
    olga = person("olga", "operators")
    deadletter_resolve(DeadLetter.objects.get(action=action), actor=olga, note="refunded by hand")

    with pytest.raises(InvalidTransition, match="did it by hand"):
        action_retry_by_person(Action.objects.get(pk=action.pk), actor=olga, reason="the card works again")
    with pytest.raises(InvalidTransition, match="did it by hand"):
        action_retry(Action.objects.get(pk=action.pk), actor="system:tests", reason="again")
    action.refresh_from_db()
    assert (action.status, action.error["retryable"]) == (ActionStatus.FAILED, False)
    assert not audit_events(action, "retry_allowed").exists()


def test_a_booking_resolved_by_hand_keeps_its_slot_confirmed(client, billing):
    action = failed(booking(billing))
    olga = person("olga", "operators")

    deadletter_resolve(DeadLetter.objects.get(action=action), actor=olga, note="booked by phone")

    done_by_hand(action, olga, "booked by phone")
    # A person booked it: the slot is taken, for good, as after a success.
    assert Booking.objects.get(action=action).status == Booking.Status.CONFIRMED
    with pytest.raises(SlotTaken):
        action_request(agent=billing, operation_key="create_booking:ROOM-H:CUST-2:dec-9", action_type="create_booking",
                       target="ROOM-H", customer="CUST-2", decision_id="dec-9", params=SLOT)
    with pytest.raises(InvalidTransition, match="did it by hand"):
        action_retry_by_person(Action.objects.get(pk=action.pk), actor=olga, reason="try again")


def test_a_task_resolved_by_hand_leaves_its_failed_refund_in_the_total_and_its_booking_booked(client, billing):
    task = dead_lettered_task(billing, "t-h")
    paid = failed(refund(billing, key="t-h:call_refund_api:v1", order="ORD-T", task=task))
    booked = failed(booking(billing, key="t-h:book:v1", task=task))
    olga = person("olga", "operators")

    deadletter_resolve(dead_letter(task), actor=olga, note="refunded and booked by hand, ticket 9")

    for action in (paid, booked):
        done = done_by_hand(action, olga, "refunded and booked by hand, ticket 9")
        assert "t-h" in audit_events(done, "done_by_hand").get().reason
    assert customer_total_today("refund", "EUR", "CUST-H") == Decimal("25.00")
    assert Booking.objects.get(action=booked).status == Booking.Status.CONFIRMED
    with pytest.raises(InvalidTransition, match="did it by hand"):
        action_retry_by_person(Action.objects.get(pk=paid.pk), actor=olga, reason="again")


def test_a_task_discarded_still_gives_its_failed_actions_up(client, billing):
    task = dead_lettered_task(billing, "t-d")
    paid = failed(refund(billing, key="t-d:call_refund_api:v1", order="ORD-T", task=task))
    booked = failed(booking(billing, key="t-d:book:v1", task=task))

    deadletter_discard(dead_letter(task), actor=person("olga", "operators"), reason="the customer withdrew")

    for action in (paid, booked):
        action.refresh_from_db()
        assert action.error["retryable"] is False and "done_by_hand" not in action.error
        assert audit_events(action, "given_up").exists()
    assert customer_total_today("refund", "EUR", "CUST-H") == Decimal(0)
    assert Booking.objects.get(action=booked).status == Booking.Status.RELEASED


def test_a_booking_done_by_hand_still_holds_its_decision(client, billing):
    """The person booked it: the same decision asked again under another key, its times moved, is
    the same booking (the database's once-per-decision rule), not a second one."""
    action = failed(booking(billing))
    deadletter_resolve(DeadLetter.objects.get(action=action), actor=person("olga", "operators"), note="booked by phone")

    moved = {**SLOT, "start": "2026-09-10T14:00:00Z", "end": "2026-09-10T15:00:00Z"}
    again = post_action_in_process(client, "create_booking:ROOM-H:CUST-H:dec-1:moved", {
        "action_type": "create_booking", "target": "ROOM-H", "customer": "CUST-H", "decision_id": "dec-1",
        "params": moved})
    assert again.status_code == 422, again.content
    assert Action.objects.filter(action_type="create_booking", decision_id="dec-1").count() == 1
    assert Booking.objects.exclude(status=Booking.Status.RELEASED).count() == 1


def on_its_page(olga, entry, op, reason):
    """The person resolves or discards the entry from its page, as the dashboard posts it: the
    page it comes back to."""
    page = Client()
    page.force_login(olga)
    answer = page.post(f"/dlq/{entry.pk}/{op}", {"reason": reason}, follow=True)
    assert answer.status_code == 200
    return answer.content.decode()


def test_a_declined_booking_resolved_by_hand_takes_its_slot_and_decision_again(client, billing):
    """Declined, it let its slot and decision go when it failed. A person then booked it by phone
    and resolved its entry: it is done by hand as any other, its agent told so, and its slot and
    decision are held again. Before, it was left as it was: its agent read a failure nobody dealt
    with, and another booking of that time, or of the decision, was taken beside the person's. The
    slot's row it let go is confirmed again, the same row (it was deleted and made anew, its history
    lost)."""
    action = failed(booking(billing), retryable=False)
    released = Booking.objects.get(action=action)
    assert released.status == Booking.Status.RELEASED
    olga = person("olga", "operators")

    page = on_its_page(olga, DeadLetter.objects.get(action=action), "resolve", "booked by phone, ticket 4")

    assert "resolve done" in page
    done_by_hand(action, olga, "booked by phone, ticket 4")
    assert list(Booking.objects.filter(action=action).values_list("pk", "status")) == [
        (released.pk, Booking.Status.CONFIRMED)]
    read = client.get(f"/api/v1/actions/{action.operation_key}").json()
    assert (read["status"], read["error"]["code"], read["error"]["done_by_hand"]) == ("failed", "declined", True)
    with pytest.raises(SlotTaken):
        action_request(agent=billing, operation_key="create_booking:ROOM-H:CUST-2:dec-9", action_type="create_booking",
                       target="ROOM-H", customer="CUST-2", decision_id="dec-9", params=SLOT)
    moved = {**SLOT, "start": "2026-09-10T14:00:00Z", "end": "2026-09-10T15:00:00Z"}
    again = post_action_in_process(client, "create_booking:ROOM-H:CUST-H:dec-1:moved", {
        "action_type": "create_booking", "target": "ROOM-H", "customer": "CUST-H", "decision_id": "dec-1",
        "params": moved})
    assert again.status_code == 422, again.content
    assert Booking.objects.exclude(status=Booking.Status.RELEASED).count() == 1


@pytest.mark.parametrize("taken", ["decision", "slot"])
def test_a_declined_booking_whose_slot_or_decision_was_booked_since_is_not_resolved(client, billing, taken):
    """Its decision booked again under another key at another time, or its slot by another
    customer: done by hand, it would hold what another booking holds, and the database refuses.
    The page says what holds it and to discard the entry instead; nothing is written, the entry
    stays open, and the discard then goes through."""
    action = failed(booking(billing), retryable=False)
    before = Action.objects.get(pk=action.pk).error
    released = Booking.objects.get(action=action)
    later = {**SLOT, "start": "2026-09-10T14:00:00Z", "end": "2026-09-10T15:00:00Z"}
    key, customer, decision, params = {
        "decision": ("create_booking:ROOM-H:CUST-H:dec-1:anew", "CUST-H", "dec-1", later),
        "slot": ("create_booking:ROOM-H:CUST-2:dec-9", "CUST-2", "dec-9", SLOT)}[taken]
    since, _ = action_request(agent=billing, operation_key=key, action_type="create_booking", target="ROOM-H",
                              customer=customer, decision_id=decision, params=params)
    olga = person("olga", "operators")
    entry = DeadLetter.objects.get(action=action)

    page = on_its_page(olga, entry, "resolve", "booked by phone")

    assert "Not done:" in page and since.operation_key in page and "Discard the entry instead" in page
    assert f"its {taken}" in page
    assert DeadLetter.objects.get(pk=entry.pk).status == "open"
    assert Action.objects.get(pk=action.pk).error == before
    assert not audit_events(action, "done_by_hand").exists()
    assert list(Booking.objects.filter(action=action).values_list("pk", "status")) == [
        (released.pk, Booking.Status.RELEASED)]
    assert Booking.objects.get(action=since).status == Booking.Status.PENDING

    assert "discard done" in on_its_page(olga, entry, "discard", "the customer was booked under another decision")
    assert Action.objects.get(pk=action.pk).error["given_up"] is True


def test_a_task_resolved_by_hand_tells_its_agent_so(client, billing):
    """Its checkpoint stays `dead_lettered` (the contract's states), and its last error says what its
    actions' say: a person finished it, no redrive comes. Before, its agent read a dead-lettered
    task it was told a person may still redrive, and waited for that."""
    task = dead_lettered_task(billing, "t-r")
    failed(refund(billing, key="t-r:call_refund_api:v1", order="ORD-T", task=task))
    olga = person("olga", "operators")

    deadletter_resolve(dead_letter(task), actor=olga, note="refunded by hand, ticket 12")

    read = client.get("/api/v1/tasks/t-r").json()
    assert read["state"] == "dead_lettered"
    assert (read["last_error"]["retryable"], read["last_error"]["done_by_hand"]) == (False, True)
    assert read["last_error"]["code"] == "worker_lost"  # what stopped it stays said
    [event] = audit_events(task, "done_by_hand")
    assert event.actor == actor_label(olga) and "ticket 12" in event.reason
