"""The sandbox's Stripe wire format on its own (/sandbox/stripe/v1/), through Django's test
client: form-encoded refunds, Stripe's errors and list envelope, Idempotency-Key replay."""

from datetime import UTC, datetime, timedelta

import pytest

from sandbox.models import SandboxOrder, SandboxRefund, SandboxSettings

AUTH = {"Authorization": "Bearer sk_test_wire"}
pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def orders(db):
    SandboxOrder.objects.create(order_id="ch_1", customer="CUST-1", amount=100, currency="EUR")
    SandboxOrder.objects.create(order_id="pi_1", customer="CUST-2", amount=5000, currency="JPY")


def refund(client, key=None, **params):
    headers = {**AUTH, **({"Idempotency-Key": key} if key else {})}
    return client.post("/sandbox/stripe/v1/refunds", params, headers=headers)


def test_a_refund_is_form_encoded_in_minor_units_and_answered_as_stripes_refund_object(client):
    answer = refund(client, charge="ch_1", amount="2550", **{"metadata[operation_key]": "k1"})
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["id"].startswith("re_") and body["object"] == "refund"
    assert (body["amount"], body["currency"], body["charge"], body["payment_intent"]) == (2550, "eur", "ch_1", None)
    assert (body["metadata"], body["status"]) == ({"operation_key": "k1"}, "succeeded")
    assert SandboxRefund.objects.get().amount == 25.5


def test_a_payment_intent_in_a_currency_without_minor_units(client):
    body = refund(client, payment_intent="pi_1", amount="500").json()
    assert (body["amount"], body["currency"], body["payment_intent"]) == (500, "jpy", "pi_1")
    payment = client.get("/sandbox/stripe/v1/payment_intents/pi_1", headers=AUTH).json()
    assert (payment["object"], payment["amount"], payment["amount_refunded"]) == ("payment_intent", 5000, 500)


def test_the_same_key_replays_the_first_answer_and_other_parameters_are_an_idempotency_error(client):
    first = refund(client, "key-1", charge="ch_1", amount="100")
    again = refund(client, "key-1", charge="ch_1", amount="100")
    assert again.json() == first.json() and again.status_code == 200
    assert again["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first
    other = refund(client, "key-1", charge="ch_1", amount="200")
    assert other.status_code == 400
    assert other.json()["error"]["type"] == "idempotency_error"
    assert SandboxRefund.objects.count() == 1


def test_without_the_sandboxs_idempotency_the_same_key_makes_another_refund(client):
    SandboxSettings.objects.update_or_create(pk=1, defaults={"idempotency": False})
    refund(client, "key-2", charge="ch_1", amount="100")
    refund(client, "key-2", charge="ch_1", amount="100")
    assert SandboxRefund.objects.count() == 2


@pytest.mark.parametrize(("params", "headers", "status", "error"), [
    ({"charge": "ch_1", "amount": "100"}, {"Authorization": "Bearer sk_live_wrong"}, 401,
     {"type": "invalid_request_error"}),
    ({"charge": "ch_1", "amount": "100"}, {}, 401, {"type": "invalid_request_error"}),
    ({"charge": "ch_1", "amount": "100", "currency": "eur"}, AUTH, 400,
     {"code": "parameter_unknown", "param": "currency"}),
    ({"charge": "ch_nope", "amount": "100"}, AUTH, 404, {"code": "resource_missing", "param": "charge"}),
    ({"amount": "100"}, AUTH, 400, {"code": "parameter_missing"}),
    ({"charge": "ch_1", "payment_intent": "pi_1"}, AUTH, 400, {"code": "parameter_missing"}),
    ({"charge": "ch_1", "amount": "12.5"}, AUTH, 400, {"code": "parameter_invalid_integer", "param": "amount"}),
    ({"charge": "ch_1", "amount": "0"}, AUTH, 400, {"code": "parameter_invalid_integer", "param": "amount"}),
    ({"charge": "ch_1", "metadata[operation_key]": "k" * 256}, AUTH, 400, {"param": "metadata"}),
    ({"charge": "ch_\x00"}, AUTH, 400, {"code": "parameter_invalid_string"}),
])
def test_bad_requests_get_stripes_error_json_and_write_nothing(client, params, headers, status, error):
    answer = client.post("/sandbox/stripe/v1/refunds", params, headers=headers)
    assert answer.status_code == status
    assert error.items() <= answer.json()["error"].items()
    assert SandboxRefund.objects.count() == 0


def test_faults_answer_as_stripe_does(client):
    from sandbox.models import SandboxFault

    SandboxFault.objects.create(target="ch_1", fault="decline", remaining=1)
    SandboxFault.objects.create(target="pi_1", fault="error_500", remaining=1)
    declined = refund(client, charge="ch_1", amount="100")
    failed = refund(client, payment_intent="pi_1", amount="100")
    assert declined.status_code == 402
    assert declined.json()["error"] | {"message": ""} == {"type": "card_error", "code": "card_declined",
                                                          "decline_code": "generic_decline", "message": ""}
    assert (failed.status_code, failed.json()["error"]["type"]) == (500, "api_error")
    assert SandboxRefund.objects.count() == 0


def test_the_list_is_newest_first_in_pages_and_filters_by_payment_and_creation_time(client):
    ids = [refund(client, charge="ch_1", amount=str(n)).json()["id"] for n in (1, 2, 3)]
    refund(client, payment_intent="pi_1", amount="1")
    page = client.get("/sandbox/stripe/v1/refunds", {"charge": "ch_1", "limit": 2}, headers=AUTH).json()
    assert (page["object"], page["has_more"], [r["id"] for r in page["data"]]) == ("list", True, ids[:0:-1])
    rest = client.get("/sandbox/stripe/v1/refunds", {"charge": "ch_1", "limit": 2, "starting_after": ids[1]},
                      headers=AUTH).json()
    assert (rest["has_more"], [r["id"] for r in rest["data"]]) == (False, ids[:1])
    SandboxRefund.objects.filter(refund_id=ids[0]).update(created_at=datetime.now(UTC) - timedelta(days=2))
    since = int((datetime.now(UTC) - timedelta(days=1)).timestamp())
    recent = client.get("/sandbox/stripe/v1/refunds", {"created[gte]": since}, headers=AUTH).json()
    assert len(recent["data"]) == 3 and ids[0] not in [r["id"] for r in recent["data"]]
    assert client.get("/sandbox/stripe/v1/refunds", {"order_id": "ch_1"}, headers=AUTH).status_code == 400


def test_a_key_whose_request_answered_500_answers_500_on_every_retry_as_at_stripe(client):
    from sandbox.models import SandboxFault

    SandboxFault.objects.create(target="ch_1", fault="error_500", remaining=1)
    first = refund(client, "key-500", charge="ch_1", amount="100")
    again = refund(client, "key-500", charge="ch_1", amount="100")
    assert (first.status_code, again.status_code, again["Idempotent-Replayed"]) == (500, 500, "true")
    assert refund(client, "key-other", charge="ch_1", amount="100").status_code == 200
    assert SandboxRefund.objects.count() == 1


def test_a_charge_is_made_for_a_test_card_and_refundable_by_its_id(client):
    answer = client.post("/sandbox/stripe/v1/charges", {"amount": "2500", "currency": "eur", "source": "tok_visa",
                                                        "metadata[customer]": "CUST-9"}, headers=AUTH)
    assert answer.status_code == 200, answer.content
    charge = SandboxOrder.objects.get(order_id=answer.json()["id"])
    assert (charge.amount, charge.currency, charge.customer) == (25, "EUR", "CUST-9")
    assert refund(client, charge=charge.order_id).status_code == 200


@pytest.mark.parametrize(("params", "error"), [
    ({"amount": "999999999999", "currency": "eur"}, {"code": "amount_too_large", "param": "amount"}),
    ({"amount": "999999999999", "currency": "jpy"}, {"code": "amount_too_large", "param": "amount"}),
    ({"amount": "100", "currency": "eur", "metadata[customer]": "c" * 256}, {"param": "metadata"}),
    ({"amount": "-1", "currency": "eur"}, {"code": "parameter_invalid_integer"}),
    ({"amount": "100", "currency": "e1r"}, {"param": "currency"}),
])
def test_a_bad_charge_gets_stripes_error_json_and_makes_no_charge(client, params, error):
    before = SandboxOrder.objects.count()
    answer = client.post("/sandbox/stripe/v1/charges", {"source": "tok_visa", **params}, headers=AUTH)
    assert answer.status_code == 400, answer.content
    assert error.items() <= answer.json()["error"].items()
    assert SandboxOrder.objects.count() == before
