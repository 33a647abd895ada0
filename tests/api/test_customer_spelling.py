"""A customer is one customer however its characters are encoded: characters that do not show
(a zero-width space pasted with it, a byte-order mark) and compatibility forms (full-width
letters, a no-break space) are not part of it. Written otherwise, the same customer escaped its
daily total and its same-customer hold. Its letters' case is kept: a provider's customer ids tell
case apart (Stripe's do), and a booking sends the customer as written (decision 61)."""

import json
from decimal import Decimal
from types import SimpleNamespace

import pytest

from approvals.models import Limit
from ledger.actions import action_request
from ledger.api.serializers import ActionRequestSerializer, TaskRequestSerializer
from ledger.models import Action, Agent, Task
from ledger.tasks import task_request
from ledger.workflows.refund import call_refund_api
from ledger.validation import customer_spelling
from tests.factories import booking_body, make_agent_on, post_action_in_process, refund_body

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis")]

# CUST-17 as an agent may write it: as it is, with a zero-width space, with a byte-order mark and
# in full-width letters with a no-break space after it.
SPELLINGS = ["CUST-17", "CUST\u200b-17", "\ufeffCUST-17", "\uff23\uff35\uff33\uff34-17\u00a0"]


@pytest.fixture
def agent_client(client):
    make_agent_on(client)
    Limit.limit_set(actor="system:tests", reason="the tests' policy", action_type="refund", currency="EUR",
                    max_amount=Decimal("500.00"), daily_customer_total=Decimal("1000.00"))
    return client


def settled(key):
    claimed = Action.objects.get(operation_key=key).claim(owner="host:test")
    claimed.mark_succeeded(actor="system:executor", claim=claimed.fence, external_ref=f"re_{key}")


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_the_customer_is_recorded_without_what_does_not_show(spelling):
    assert customer_spelling(spelling) == "CUST-17"
    assert customer_spelling(customer_spelling(spelling)) == "CUST-17"


@pytest.mark.parametrize("unseen", ["\u034f", "\ufe0f", "\U000e0100", "\u115f", "\u1160", "\u3164", "\uffa0",
                                    "\u180b", "\u17b4", "\U000e0001"])
def test_the_characters_unicode_ignores_by_default_are_not_part_of_the_customer(unseen):
    """Not all of them are format characters (a combining grapheme joiner, variation selectors,
    the Hangul fillers): Unicode's Default_Ignorable_Code_Point, as a renderer shows none of them."""
    assert customer_spelling(f"CUST{unseen}-17{unseen}") == "CUST-17"


def test_the_spaces_inside_a_customer_are_kept():
    assert customer_spelling(" ACME\u00a0Corp \u2003") == "ACME Corp"


def test_the_case_of_a_customer_is_kept():
    assert customer_spelling("cus_NffrFeUfNV2Hib") == "cus_NffrFeUfNV2Hib"


def test_another_spelling_does_not_escape_the_daily_total(agent_client):
    answers = []
    for i, spelling in enumerate(SPELLINGS[:3]):
        key = f"refund:ORD-{i}:dec-{i}"
        answer = post_action_in_process(agent_client, key, refund_body(f"ORD-{i}", "450.00", customer=spelling,
                                                                       decision=f"dec-{i}"))
        assert answer.status_code == 201, answer.json()
        answers.append((answer.json()["status"], answer.json()["customer"]))
        if answer.json()["status"] == "queued":
            settled(key)
    assert answers == [("queued", "CUST-17"), ("queued", "CUST-17"), ("awaiting_approval", "CUST-17")]


def test_another_spelling_is_held_behind_the_customers_action_in_flight(agent_client):
    first = post_action_in_process(agent_client, "refund:ORD-1:dec-1", refund_body("ORD-1", customer="CUST-17",
                                                                                   decision="dec-1"))
    second = post_action_in_process(agent_client, "refund:ORD-2:dec-2", refund_body("ORD-2", customer=SPELLINGS[3],
                                                                                    decision="dec-2"))
    assert (first.json()["status"], second.json()["status"]) == ("queued", "held")


def test_a_retry_in_another_spelling_is_the_same_request(agent_client):
    body = refund_body(customer="CUST-17")
    first = post_action_in_process(agent_client, "refund:ORD-8841:dec-77", body)
    again = post_action_in_process(agent_client, "refund:ORD-8841:dec-77", {**body, "customer": SPELLINGS[1]})
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["url"] == first.json()["url"]


def test_a_request_recorded_in_another_spelling_before_is_still_answered_as_recorded(agent_client):
    """Recorded before customers were kept in one spelling (the intake as it was then), its retry as
    it was sent then is the same request: answered 200, not refused as another one under its key."""
    earlier = recorded_as_before(refund_body(customer=SPELLINGS[1]), "refund:ORD-8841:dec-77")
    again = post_action_in_process(agent_client, "refund:ORD-8841:dec-77", refund_body(customer=SPELLINGS[1]))
    assert again.status_code == 200, again.json()
    assert again.json()["customer"] == earlier.customer == SPELLINGS[1]
    assert Action.objects.count() == 1


def test_a_booking_recorded_in_another_spelling_before_is_still_answered_as_recorded(agent_client):
    """A booking's customer is part of its print: compared as the request was recorded."""
    earlier = recorded_as_before(booking_body(customer=SPELLINGS[1]), "booking:ROOM-1:dec-1")
    again = post_action_in_process(agent_client, "booking:ROOM-1:dec-1", booking_body(customer=SPELLINGS[1]))
    assert again.status_code == 200, again.json()
    assert again.json()["customer"] == earlier.customer == SPELLINGS[1]
    assert Action.objects.count() == 1


def test_a_booking_recorded_in_another_spelling_is_the_same_booking_under_another_key(agent_client):
    """Its slot's holder is the booking of the same agent, customer and decision: recorded before in
    another spelling, it is the same booking (200), not a conflict (409)."""
    earlier = recorded_as_before(booking_body(customer=SPELLINGS[1]), "booking:ROOM-1:2026-09-10T10:00:00Z:dec-1")
    again = post_action_in_process(agent_client, "booking:ROOM-1:CUST-17:dec-1", booking_body(customer=SPELLINGS[1]))
    assert again.status_code == 200, again.json()
    assert again.json()["customer"] == earlier.customer == SPELLINGS[1]
    assert Action.objects.count() == 1


def test_another_customers_booking_of_the_slot_is_still_a_conflict(agent_client):
    recorded_as_before(booking_body(customer=SPELLINGS[1]), "booking:ROOM-1:2026-09-10T10:00:00Z:dec-1")
    again = post_action_in_process(agent_client, "booking:ROOM-1:CUST-18:dec-1", booking_body(customer="CUST-18"))
    assert (again.status_code, again.json()["code"]) == (409, "booking_conflict")


TASK_ID = "task:refund:ORD-8841:dec-77"


def refund_task(customer):
    return {"workflow": "refund", "input": {"order_id": "ORD-8841", "amount": "25.00", "currency": "EUR",
                                            "customer": customer, "notify": "ada@example.com"}}


def post_task(client, body):
    return client.post("/api/v1/tasks", json.dumps(body), content_type="application/json",
                       headers={"Idempotency-Key": TASK_ID})


def task_recorded_as_before(body):
    """`body` recorded as the intake recorded a task before: validated, its customer as it was sent."""
    request = TaskRequestSerializer(data=body, context={"recorded": lambda: False})
    assert request.is_valid(), request.errors
    written = {**request.validated_data["input"], "customer": body["input"]["customer"]}
    return task_request(agent=Agent.objects.get(), task_id=TASK_ID, workflow="refund", input=written)[0]


def test_a_task_recorded_in_another_spelling_before_is_still_replayed(agent_client):
    earlier = task_recorded_as_before(refund_task(SPELLINGS[1]))
    for spelling in (SPELLINGS[1], "CUST-17"):
        again = post_task(agent_client, refund_task(spelling))
        assert again.status_code == 200, again.json()
    assert post_task(agent_client, refund_task("CUST-18")).json()["code"] == "idempotency_key_reused"
    assert Task.objects.get().input == earlier.input  # what was recorded stays as it was


def test_a_task_recorded_before_records_its_refund_for_the_customer_in_its_one_spelling(agent_client):
    """Resumed after the change, the refund step records the customer as the ledger keeps it (else the
    refund escapes the customer's total and hold); its action recorded before, in the spelling of then,
    is still its step's action under its key."""
    task = task_recorded_as_before(refund_task(SPELLINGS[1]))
    spec = call_refund_api(SimpleNamespace(input=task.input))
    assert spec.customer == "CUST-17"
    key = task.steps.get(name="call_refund_api").idempotency_key
    earlier, _ = action_request(agent=task.agent, operation_key=key, action_type=spec.action_type, target=spec.target,
                                params=spec.params, customer=SPELLINGS[1], decision_id=task.task_id, task=task)
    again, created = action_request(agent=task.agent, operation_key=key, action_type=spec.action_type,
                                    target=spec.target, params=spec.params, customer=spec.customer,
                                    decision_id=task.task_id, task=task)
    assert (again.pk, created) == (earlier.pk, False)


def recorded_as_before(body, key):
    """`body` recorded as the intake recorded it before: validated, the customer as it was sent."""
    request = ActionRequestSerializer(data=body)
    assert request.is_valid(), request.errors
    data = request.validated_data
    return action_request(agent=Agent.objects.get(), operation_key=key, action_type=data["action_type"],
                          target=data["target"], params=data["params"], customer=body["customer"],
                          decision_id=data["decision_id"])[0]
