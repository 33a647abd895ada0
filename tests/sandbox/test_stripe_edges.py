"""The edges of the sandbox's Stripe wire format (/sandbox/stripe/v1/) and of its own listings:
what Stripe refuses is refused in Stripe's error shape, never a 500 or Django's HTML page."""

import pytest

from sandbox.models import SandboxOrder, SandboxRefund

AUTH = {"Authorization": "Bearer sk_test_edges"}
pytestmark = pytest.mark.django_db


def stripe(client, method, path, params=None, **headers):
    return getattr(client, method)(f"/sandbox/stripe/v1/{path}", params or {}, headers={**AUTH, **headers})


@pytest.fixture
def charge(client):
    """A 25.00 EUR charge made as Stripe's test mode makes one."""
    answer = stripe(client, "post", "charges", {"amount": "2500", "currency": "eur", "source": "tok_visa"})
    assert answer.status_code == 200, answer.content
    return answer.json()["id"]


def refund(client, charge, amount=None, key=None):
    params = {"charge": charge, **({"amount": amount} if amount else {})}
    return stripe(client, "post", "refunds", params, **({"Idempotency-Key": key} if key else {}))


def assert_stripe_error(answer, status, **error):
    assert answer.status_code == status, answer.content
    assert answer["Content-Type"] == "application/json"
    assert error.items() <= answer.json()["error"].items(), answer.json()


def test_a_refund_larger_than_any_charge_is_refused_not_a_server_error(client, charge):
    assert_stripe_error(refund(client, charge, "999999999999"), 400, type="invalid_request_error",
                        code="amount_too_large", param="amount")
    assert not SandboxRefund.objects.exists()


def test_a_refund_above_what_is_left_of_the_charge_is_refused_as_stripe_does(client, charge):
    assert refund(client, charge, "2000").status_code == 200
    refused = refund(client, charge, "501")
    assert_stripe_error(refused, 400, code="amount_too_large", param="amount")
    assert "5.00 EUR" in refused.json()["error"]["message"]
    assert refund(client, charge, "500").status_code == 200
    assert_stripe_error(refund(client, charge, "1"), 400, code="charge_already_refunded")
    assert_stripe_error(refund(client, charge), 400, code="charge_already_refunded")
    assert SandboxRefund.objects.count() == 2


def test_a_replayed_refund_is_answered_again_though_nothing_is_left_to_refund(client, charge):
    first = refund(client, charge, key="whole-1")
    again = refund(client, charge, key="whole-1")
    assert (first.status_code, again.status_code) == (200, 200), again.content
    assert again["Idempotent-Replayed"] == "true" and again.json()["id"] == first.json()["id"]


def test_refunds_of_the_sandboxs_own_api_in_another_currency_do_not_count_against_the_charge(client, charge):
    SandboxRefund.objects.create(order_id=charge, amount=1000, currency="JPY")
    assert refund(client, charge, "2500").status_code == 200


@pytest.mark.parametrize("currency", ["xyz", "xts", "XXX"])
def test_a_charge_in_a_currency_nobody_pays_in_is_refused(client, currency):
    answer = stripe(client, "post", "charges", {"amount": "2500", "currency": currency, "source": "tok_visa"})
    assert_stripe_error(answer, 400, type="invalid_request_error", param="currency")
    assert f"Invalid currency: {currency.lower()}" in answer.json()["error"]["message"]
    assert not SandboxOrder.objects.exists()


@pytest.mark.parametrize(("method", "path"), [("get", "nope"), ("post", "customers"), ("get", "refunds/re_1/x"),
                                              ("get", "charges/")])
def test_a_url_it_does_not_serve_is_stripes_json_404(client, method, path):
    answer = stripe(client, method, path)
    assert_stripe_error(answer, 404, type="invalid_request_error")
    assert answer.json()["error"]["message"].startswith(f"Unrecognized request URL ({method.upper()}: ")


@pytest.mark.parametrize(("path", "params", "param"), [
    ("refunds", {"limit": "1" * 5000}, "limit"),
    ("refunds", {"created[gte]": "9" * 5000}, "created[gte]"),
])
def test_a_number_of_thousands_of_digits_in_a_listing_is_refused(client, path, params, param):
    assert_stripe_error(stripe(client, "get", path, params), 400, code="parameter_invalid_integer", param=param)


def test_an_amount_of_thousands_of_digits_is_refused(client, charge):
    assert_stripe_error(refund(client, charge, "1" * 5000), 400, code="parameter_invalid_integer", param="amount")
    answer = stripe(client, "post", "charges", {"amount": "1" * 5000, "currency": "eur", "source": "tok_visa"})
    assert_stripe_error(answer, 400, code="parameter_invalid_integer", param="amount")


def test_the_sandboxs_own_listing_refuses_a_limit_of_thousands_of_digits(sandbox):
    answer = sandbox.get("refunds", limit="1" * 5000)
    assert answer.status_code == 400, answer.content
    assert answer.json()["error"]["fields"]["limit"]
