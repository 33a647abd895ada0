"""An amount has at most its currency's minor digits: none for JPY, two for EUR, three for KWD,
at the agents' API and at the sandbox alike (ledger.money), and no more than the ledger keeps."""

import json
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model

from approvals.models import Limit, ReviewItem
from ledger import money
from ledger.actions import action_request
from ledger.models import Action
from tests.factories import make_agent, refund_body

CASES = [  # amount, currency, accepted
    ("500", "JPY", True),
    ("500.00", "JPY", True),  # the same 500 yen, written with zeros
    ("500.5", "JPY", False),
    ("25.01", "EUR", True),
    ("25.001", "EUR", False),
    ("1.234", "KWD", True),
    ("1.2345", "KWD", False),
    ("0.125", "BHD", True),
    ("1.0001", "CLF", False),  # CLF has four, the ledger keeps three
]


@pytest.fixture
def agent_client(client, db):
    _, token = make_agent("billing")
    client.defaults["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    return client


@pytest.mark.parametrize(("amount", "currency", "accepted"), CASES)
def test_the_api_takes_as_many_decimals_as_the_currency_has(agent_client, amount, currency, accepted):
    response = agent_client.post("/api/v1/actions", json.dumps(refund_body(amount=amount, currency=currency)),
                                 content_type="application/json", headers={"Idempotency-Key": f"refund:{amount}"})
    if accepted:
        assert response.status_code == 201, response.content
        assert Action.objects.get().amount == money.quantized(amount, currency)
    else:
        assert response.status_code == 400
        assert response.json()["code"] == "invalid"
        assert "decimal places" in response.json()["errors"]["params.amount"][0]
        assert not Action.objects.exists()


@pytest.mark.parametrize(("amount", "currency", "accepted"), CASES)
def test_the_sandbox_takes_as_many_decimals_as_the_currency_has(client, settings, db, amount, currency, accepted):
    response = client.post("/sandbox/v1/refunds", {"order_id": "ORD-1", "amount": amount, "currency": currency},
                           content_type="application/json",
                           headers={"Authorization": f"Bearer {settings.SANDBOX_API_KEY}"})
    if accepted:
        assert response.status_code == 201, response.content
        assert response.json()["amount"] == str(money.quantized(amount, currency))
    else:
        assert response.status_code == 400
        assert "amount" in response.json()["error"]["fields"]


def test_minor_units_go_both_ways():
    assert [money.to_minor_units(a, c) for a, c in [("25.00", "EUR"), ("500", "JPY"), ("1.234", "kwd")]] == [
        2500, 500, 1234]
    assert [str(money.from_minor_units(u, c)) for u, c in [(2500, "EUR"), (500, "JPY"), (1234, "KWD")]] == [
        "25.00", "500", "1.234"]
    with pytest.raises(ValueError):
        money.to_minor_units("0.5", "JPY")


@pytest.mark.usefixtures("jobs_to_test_redis")
def test_the_dashboard_shows_an_amount_with_its_currencys_decimals(client, db):
    client.force_login(get_user_model().objects.create_superuser("root", password="x"))
    agent, _ = make_agent("billing-bot")
    Limit.limit_set(actor="system:tests", reason="the tests' policy",
                    action_type="refund", currency="KWD", max_amount=Decimal("100"))
    kwd, _ = action_request(agent=agent, operation_key="r-kwd", action_type="refund", target="ORD-1",
                            customer="CUST-1", params={"amount": "150.125", "currency": "KWD"})
    jpy, _ = action_request(agent=agent, operation_key="r-jpy", action_type="refund", target="ORD-2",
                            customer="CUST-2", params={"amount": "5000", "currency": "JPY"})
    review = client.get(f"/review/{ReviewItem.objects.get(action=kwd).pk}/").content.decode()
    assert "150.125" in review and "100.000" in review  # the amount and its limit, in fils
    assert "5000 JPY" in client.get(f"/actions/{jpy.pk}/").content.decode()
    assert "150.125 KWD" in client.get("/ledger/").content.decode()
