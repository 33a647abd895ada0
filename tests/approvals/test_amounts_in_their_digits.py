"""An amount is written with its currency's minor digits wherever a person reads it: the reasons
the limits give (why an item waits, the what-if's verdicts, a verification over the limit) as
well as the amounts the pages show (decision 32). 15000 JPY was "15000.00 JPY", 150.500 KWD
"150.50 KWD"."""

from decimal import Decimal

import pytest

from approvals.intake import needs_person_after_verification
from approvals.models import Limit, ReviewItem
from ledger.actions import action_request
from tests.factories import person

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis")]


@pytest.fixture
def limits():
    for currency, top, dual in (("JPY", "10000", "50000"), ("KWD", "100.000", "500.000"), ("EUR", "500.00", None)):
        Limit.limit_set(actor="system:tests", reason="the tests' policy", action_type="refund", currency=currency,
                        max_amount=Decimal(top), dual_approval_above=dual and Decimal(dual))


def waiting(agent, n, amount, currency):
    action, _ = action_request(agent=agent, operation_key=f"refund:ORD-M{n}:dec-{n}", action_type="refund",
                               target=f"ORD-M{n}", customer=f"CUST-M{n}",
                               params={"amount": amount, "currency": currency})
    return ReviewItem.objects.get(action=action, status="open")


@pytest.mark.parametrize(("amount", "currency", "why"), [
    ("15000", "JPY", "15000 JPY is above the limit of 10000"),
    ("60000", "JPY", "60000 JPY is above 50000: two approvers"),
    ("150.500", "KWD", "150.500 KWD is above the limit of 100.000"),
    ("750.00", "EUR", "750.00 EUR is above the limit of 500.00"),
])
def test_why_an_item_waits_writes_its_amounts_with_the_currencys_digits(agent, limits, client, amount, currency, why):
    item = waiting(agent, 1, amount, currency)
    assert item.why == why
    client.force_login(person("alice", "approvers"))
    assert why in client.get("/approvals/").content.decode()
    assert why in client.get(f"/review/{item.pk}/").content.decode()


def test_a_verification_over_the_limit_says_so_in_the_currencys_digits(agent, limits):
    item = waiting(agent, 2, "20000", "JPY")
    assert needs_person_after_verification(item.action) == "verified, but 20000 JPY is above the limit of 10000"
