import threading
import time

import pytest
from django.db import connection, connections
from django.test import Client

from sandbox import views
from sandbox.models import SandboxBooking, SandboxFault, SandboxIdempotencyKey, SandboxMessage, SandboxRefund
from tests.factories import make_agent

from .conftest import API_KEY, SandboxClient

pytestmark = pytest.mark.django_db


def refund_body(order_id="ORD-1", amount="25.00", operation_key="refund:ORD-1:full:dec-1"):
    return {"order_id": order_id, "amount": amount, "currency": "EUR", "metadata": {"operation_key": operation_key}}


def message_body(recipient="ada@example.com", operation_key="msg:1"):
    return {
        "recipient": recipient,
        "channel": "email",
        "message_type": "refund_confirmation",
        "body": "Your refund is on its way.",
        "metadata": {"operation_key": operation_key},
    }


def booking_body(resource="ROOM-1", start="2030-01-01T10:00:00Z", end="2030-01-01T11:00:00Z", operation_key="bk:1"):
    return {
        "resource": resource,
        "customer": "CUST-1",
        "service": "consultation",
        "start": start,
        "end": end,
        "metadata": {"operation_key": operation_key},
    }


# --- Authentication ---------------------------------------------------------------------------


def test_it_refuses_a_request_without_a_token(client):
    response = client.get("/sandbox/v1/refunds")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"


def test_it_refuses_a_wrong_token(client):
    response = SandboxClient(client, "not-the-key").post("refunds", refund_body())
    assert response.status_code == 401
    assert not SandboxRefund.objects.exists()


def test_it_accepts_an_active_agents_token(client):
    _, token = make_agent("agent-a")
    response = SandboxClient(client, token).get("refunds")
    assert response.status_code == 200
    assert response.json()["data"] == []


def test_it_refuses_an_inactive_agents_token(client):
    agent, token = make_agent("agent-b")
    agent.is_active = False
    agent.save(update_fields=["is_active"])
    assert SandboxClient(client, token).get("refunds").status_code == 401


def test_it_answers_405_for_a_method_the_route_does_not_have(sandbox):
    response = sandbox.delete("refunds")
    assert response.status_code == 405
    assert response["Allow"] == "GET, POST"


@pytest.mark.parametrize("path", ["nowhere", "refunds/re_1", "orders/"])
def test_it_answers_an_unknown_url_in_its_own_error_form(sandbox, path):
    response = sandbox.get(path)
    assert (response.status_code, response["Content-Type"]) == (404, "application/json")
    assert response.json()["error"]["code"] == "not_found"


# --- Refunds and idempotency ------------------------------------------------------------------


def test_it_creates_a_refund(sandbox):
    response = sandbox.post("refunds", refund_body(), idempotency_key="k-1")
    assert response.status_code == 201
    refund = response.json()
    assert refund["id"].startswith("re_")
    assert refund["object"] == "refund"
    assert refund["amount"] == "25.00"
    assert refund["operation_key"] == "refund:ORD-1:full:dec-1"
    assert refund["status"] == "succeeded"
    assert SandboxRefund.objects.get().idempotency_key == "k-1"


def test_it_returns_the_first_refund_on_a_repeated_idempotency_key(sandbox):
    first = sandbox.post("refunds", refund_body(), idempotency_key="k-1")
    again = sandbox.post("refunds", refund_body(), idempotency_key="k-1")
    assert again.status_code == 200
    assert again.json() == first.json()
    assert SandboxRefund.objects.count() == 1


def test_it_refunds_twice_on_a_repeated_key_when_idempotency_is_off(sandbox):
    assert sandbox.put("settings", {"idempotency": False}).json() == {"idempotency": False}
    first = sandbox.post("refunds", refund_body(), idempotency_key="k-1")
    again = sandbox.post("refunds", refund_body(), idempotency_key="k-1")
    assert (first.status_code, again.status_code) == (201, 201)
    assert first.json()["id"] != again.json()["id"]
    assert SandboxRefund.objects.filter(idempotency_key="k-1").count() == 2


def test_it_refunds_twice_without_an_idempotency_key(sandbox):
    sandbox.post("refunds", refund_body())
    sandbox.post("refunds", refund_body())
    assert SandboxRefund.objects.count() == 2


def test_it_reads_and_restores_the_idempotency_setting(sandbox):
    assert sandbox.get("settings").json()["idempotency"] is True
    sandbox.put("settings", {"idempotency": False})
    assert sandbox.get("settings").json()["idempotency"] is False
    sandbox.post("reset", {})
    assert sandbox.get("settings").json()["idempotency"] is True


def test_it_shows_every_webhook_setting_in_force_whether_set_here_or_not(sandbox, settings):
    settings.SANDBOX_WEBHOOK_URL = "https://hooks.example/sandbox/"
    settings.SANDBOX_WEBHOOK_DUPLICATE_RATE = 0.25
    settings.SANDBOX_WEBHOOK_DELAY_SECONDS = 0
    from_settings = {"idempotency": True, "webhook_url": "https://hooks.example/sandbox/",
                     "webhook_duplicate_rate": 0.25, "webhook_delay_seconds": 0}
    assert sandbox.get("settings").json() == from_settings
    sandbox.put("settings", {"webhook_url": "", "webhook_delay_seconds": 3})
    assert sandbox.get("settings").json() == {**from_settings, "webhook_url": "", "webhook_delay_seconds": 3}
    sandbox.put("settings", {"webhook_url": None, "webhook_delay_seconds": None})
    assert sandbox.get("settings").json() == from_settings


def test_it_refuses_a_setting_that_is_not_a_boolean(sandbox):
    assert sandbox.put("settings", {"idempotency": "no"}).status_code == 400


@pytest.mark.parametrize(
    "change",
    [
        {"amount": "0"},
        {"amount": "1.001"},
        {"amount": "lots"},
        {"currency": "XYZ"},
        {"currency": "eur"},
        {"order_id": ""},
        {"metadata": ["not", "an", "object"]},
        {"metadata": {"operation_key": 7}},
    ],
)
def test_it_refuses_an_invalid_refund(sandbox, change):
    response = sandbox.post("refunds", {**refund_body(), **change})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid"
    assert not SandboxRefund.objects.exists()


def test_it_refuses_a_body_that_is_not_a_json_object(sandbox):
    response = sandbox.post("refunds", ["ORD-1"])
    assert response.status_code == 400
    assert response.json()["error"]["fields"] == {"body": ["Must be a JSON object."]}


def test_it_refuses_an_overlong_idempotency_key(sandbox):
    assert sandbox.post("refunds", refund_body(), idempotency_key="k" * 256).status_code == 400


def test_it_lists_refunds_by_order_and_by_operation_key(sandbox):
    sandbox.post("refunds", refund_body("ORD-1", operation_key="op-a"))
    sandbox.post("refunds", refund_body("ORD-1", operation_key="op-b"))
    sandbox.post("refunds", refund_body("ORD-2", operation_key="op-a"))

    by_order = sandbox.get("refunds", order_id="ORD-1").json()["data"]
    assert [refund["operation_key"] for refund in by_order] == ["op-a", "op-b"]
    by_key = sandbox.get("refunds", operation_key="op-a").json()["data"]
    assert [refund["order_id"] for refund in by_key] == ["ORD-1", "ORD-2"]
    assert sandbox.get("refunds", order_id="ORD-9").json() == {"data": []}


# --- Messages ---------------------------------------------------------------------------------


def test_it_sends_a_message_and_lists_it_by_recipient_and_operation_key(sandbox):
    response = sandbox.post("messages", message_body())
    assert response.status_code == 201
    message = response.json()
    assert message["id"].startswith("msg_")
    assert message["object"] == "message"
    assert sandbox.get("messages", recipient="ada@example.com").json()["data"] == [message]
    assert sandbox.get("messages", operation_key="msg:1").json()["data"] == [message]
    assert sandbox.get("messages", recipient="bob@example.com").json()["data"] == []


def test_it_sends_a_message_once_per_idempotency_key(sandbox):
    sandbox.post("messages", message_body(), idempotency_key="m-1")
    assert sandbox.post("messages", message_body(), idempotency_key="m-1").status_code == 200
    assert SandboxMessage.objects.count() == 1


def test_it_refuses_an_unknown_channel(sandbox):
    assert sandbox.post("messages", {**message_body(), "channel": "pigeon"}).status_code == 400


# --- Bookings ---------------------------------------------------------------------------------


def test_it_books_a_free_slot(sandbox):
    response = sandbox.post("bookings", booking_body())
    assert response.status_code == 201
    booking = response.json()
    assert booking["id"].startswith("bk_")
    assert booking["start"] == "2030-01-01T10:00:00+00:00"
    assert sandbox.get("bookings", resource="ROOM-1").json()["data"] == [booking]
    assert sandbox.get("bookings", operation_key="bk:1").json()["data"] == [booking]


def test_it_declines_an_overlapping_booking_of_the_same_resource(sandbox):
    first = sandbox.post("bookings", booking_body())
    response = sandbox.post("bookings", booking_body(start="2030-01-01T10:30:00Z", end="2030-01-01T11:30:00Z"))
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "slot_taken"
    assert response.json()["error"]["booking"] == first.json()["id"]
    assert SandboxBooking.objects.count() == 1


def test_it_books_adjacent_slots_and_other_resources(sandbox):
    sandbox.post("bookings", booking_body())
    next_hour = booking_body(start="2030-01-01T11:00:00Z", end="2030-01-01T12:00:00Z")
    assert sandbox.post("bookings", next_hour).status_code == 201
    assert sandbox.post("bookings", booking_body(resource="ROOM-2")).status_code == 201


def test_it_replays_a_booking_rather_than_declining_its_own_slot(sandbox):
    first = sandbox.post("bookings", booking_body(), idempotency_key="b-1")
    again = sandbox.post("bookings", booking_body(), idempotency_key="b-1")
    assert again.status_code == 200
    assert again.json() == first.json()


def test_it_refuses_a_booking_that_ends_before_it_starts(sandbox):
    response = sandbox.post("bookings", booking_body(start="2030-01-01T11:00:00Z", end="2030-01-01T10:00:00Z"))
    assert response.status_code == 400
    assert "end" in response.json()["error"]["fields"]


# --- Orders -----------------------------------------------------------------------------------

ORDER = {"order_id": "ORD-1", "customer": "CUST-1", "amount": "80.00", "currency": "EUR"}


def test_it_creates_an_order_once(sandbox):
    assert sandbox.post("orders", ORDER).status_code == 201
    assert sandbox.post("orders", {**ORDER, "amount": "80"}).status_code == 200
    assert sandbox.post("orders", {**ORDER, "customer": "CUST-2"}).status_code == 409


def test_it_shows_an_order_with_its_refunds(sandbox):
    sandbox.post("orders", ORDER)
    refund = sandbox.post("refunds", refund_body("ORD-1")).json()
    order = sandbox.get("orders/ORD-1").json()
    assert order["customer"] == "CUST-1"
    assert order["amount"] == "80.00"
    assert order["refunds"] == [refund]


def test_it_answers_404_for_an_unknown_order(sandbox):
    response = sandbox.get("orders/ORD-404")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "order_not_found"


def test_it_shows_an_order_whose_id_has_a_slash(sandbox):
    """As the sandbox connector asks for it: one path segment, "/" percent-encoded, which the
    server decodes before routing."""
    assert sandbox.post("orders", {**ORDER, "order_id": "ORD/1"}).status_code == 201
    response = sandbox.get("orders/ORD%2F1")
    assert response.status_code == 200, response.content
    assert response.json()["order_id"] == "ORD/1"
    assert sandbox.get("orders/ORD%2F2").json()["error"]["code"] == "order_not_found"


def test_it_accepts_a_refund_for_an_unknown_order(sandbox):
    assert sandbox.post("refunds", refund_body("ORD-404")).status_code == 201


# --- Faults -----------------------------------------------------------------------------------


def arm(sandbox, target, fault, times=1):
    response = sandbox.post("faults", {"target": target, "fault": fault, "times": times})
    assert response.status_code == 201
    return response.json()


def test_error_500_answers_500_and_writes_nothing(sandbox):
    arm(sandbox, "ORD-1", "error_500")
    assert sandbox.post("refunds", refund_body()).status_code == 500
    assert not SandboxRefund.objects.exists()


def test_decline_answers_402_and_writes_nothing(sandbox):
    arm(sandbox, "ada@example.com", "decline")
    response = sandbox.post("messages", message_body())
    assert response.status_code == 402
    assert response.json()["error"]["code"] == "declined"
    assert not SandboxMessage.objects.exists()


def test_timeout_before_commit_stalls_then_answers_504_and_writes_nothing(sandbox):
    arm(sandbox, "ROOM-1", "timeout_before_commit")
    started = time.monotonic()
    response = sandbox.post("bookings", booking_body())
    assert response.status_code == 504
    assert time.monotonic() - started >= 0.05
    assert not SandboxBooking.objects.exists()


def test_timeout_after_commit_writes_the_refund_then_stalls_then_answers_201(sandbox):
    arm(sandbox, "ORD-1", "timeout_after_commit")
    started = time.monotonic()
    response = sandbox.post("refunds", refund_body())
    assert response.status_code == 201
    assert time.monotonic() - started >= 0.05
    assert sandbox.get("refunds", order_id="ORD-1").json()["data"] == [response.json()]


@pytest.mark.django_db(transaction=True)
def test_timeout_after_commit_stalls_only_once_the_refund_is_committed(sandbox, monkeypatch):
    seen_while_stalling = []

    # The patched sleep is a probe, not a stand-in: it is the only point at which the
    # ordering "commit, then stall" can be observed from inside the request. The real stall
    # is covered by the two tests above (they time it with the real sleep).
    def stall(seconds):
        seen_while_stalling.append((connection.in_atomic_block, SandboxRefund.objects.count()))

    monkeypatch.setattr(views.time, "sleep", stall)
    arm(sandbox, "ORD-1", "timeout_after_commit")
    sandbox.post("refunds", refund_body())
    assert seen_while_stalling == [(False, 1)]


def test_a_retry_after_timeout_after_commit_gets_the_stored_refund(sandbox):
    arm(sandbox, "ORD-1", "timeout_after_commit")
    first = sandbox.post("refunds", refund_body(), idempotency_key="k-1")
    retry = sandbox.post("refunds", refund_body(), idempotency_key="k-1")
    assert (first.status_code, retry.status_code) == (201, 200)
    assert retry.json() == first.json()


def test_a_fault_applies_the_given_number_of_times_then_is_spent(sandbox):
    fault = arm(sandbox, "ORD-1", "error_500", times=2)
    statuses = [sandbox.post("refunds", refund_body()).status_code for _ in range(3)]
    assert statuses == [500, 500, 201]
    assert sandbox.get("faults").json()["data"] == [{**fault, "remaining": 0}]


def test_a_fault_leaves_other_targets_alone(sandbox):
    arm(sandbox, "ORD-1", "decline")
    assert sandbox.post("refunds", refund_body("ORD-2")).status_code == 201
    assert SandboxFault.objects.get().remaining == 1


def test_an_invalid_call_does_not_spend_a_fault(sandbox):
    arm(sandbox, "ORD-1", "decline")
    assert sandbox.post("refunds", refund_body(amount="-1")).status_code == 400
    assert SandboxFault.objects.get().remaining == 1


def test_faults_for_one_target_apply_in_the_order_they_were_armed(sandbox):
    arm(sandbox, "ORD-1", "decline")
    arm(sandbox, "ORD-1", "error_500")
    assert [sandbox.post("refunds", refund_body()).status_code for _ in range(3)] == [402, 500, 201]


def test_a_lookup_error_fails_the_look_up_of_an_order_and_no_write_for_it(sandbox):
    sandbox.post("orders", ORDER)
    arm(sandbox, "ORD-1", "lookup_error")
    response = sandbox.get("orders/ORD-1")
    assert (response.status_code, response.json()["error"]["code"]) == (500, "internal_error")
    assert sandbox.get("orders/ORD-1").status_code == 200
    arm(sandbox, "ORD-1", "lookup_error")
    assert sandbox.post("refunds", refund_body()).status_code == 201
    assert SandboxFault.objects.filter(remaining=1).count() == 1


def test_it_refuses_an_unknown_fault(sandbox):
    assert sandbox.post("faults", {"target": "ORD-1", "fault": "meteor"}).status_code == 400


def test_clearing_faults_disarms_them(sandbox):
    arm(sandbox, "ORD-1", "error_500")
    assert sandbox.delete("faults").json() == {"deleted": 1}
    assert sandbox.post("refunds", refund_body()).status_code == 201


def test_reset_deletes_every_sandbox_row(sandbox):
    sandbox.post("orders", ORDER)
    sandbox.post("refunds", refund_body(), idempotency_key="k-1")
    sandbox.post("messages", message_body())
    sandbox.post("bookings", booking_body())
    arm(sandbox, "ORD-1", "decline")
    assert sandbox.post("reset", {}).status_code == 200
    for model in (SandboxRefund, SandboxMessage, SandboxBooking, SandboxFault, SandboxIdempotencyKey):
        assert not model.objects.exists()
    assert sandbox.get("orders/ORD-1").status_code == 404


# --- Races (PostgreSQL: SQLite runs one writer at a time anyway) ------------------------------


def race(requests):
    """Send each request from its own thread and connection, all released at once; return the statuses."""
    barrier = threading.Barrier(len(requests))
    statuses = [None] * len(requests)

    def send(index, request):
        try:
            barrier.wait()
            statuses[index] = request(SandboxClient(Client(), API_KEY)).status_code
        finally:
            connections.close_all()

    threads = [threading.Thread(target=send, args=(i, request)) for i, request in enumerate(requests)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return statuses


@pytest.fixture
def postgresql_only():
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL's concurrent writers")


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("postgresql_only")
def test_concurrent_requests_with_one_key_make_one_refund():
    statuses = race([lambda api: api.post("refunds", refund_body(), idempotency_key="k-race")] * 8)
    assert sorted(statuses) == [200] * 7 + [201]
    assert SandboxRefund.objects.count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("postgresql_only")
def test_concurrent_requests_spend_a_fault_once(sandbox):
    arm(sandbox, "ORD-1", "error_500")
    statuses = race([lambda api: api.post("refunds", refund_body())] * 8)
    assert sorted(statuses) == [201] * 7 + [500]
    assert SandboxFault.objects.get().remaining == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("postgresql_only")
def test_concurrent_overlapping_bookings_make_one_booking():
    statuses = race(
        [lambda api, n=n: api.post("bookings", booking_body(operation_key=f"bk:{n}")) for n in range(8)]
    )
    assert sorted(statuses) == [201] + [409] * 7
    assert SandboxBooking.objects.count() == 1
