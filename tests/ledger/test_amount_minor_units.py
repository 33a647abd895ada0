"""An amount has at most its currency's minor digits: none for JPY, two for EUR, three for KWD,
at the agents' API and at the sandbox alike (ledger.money), and no more than the ledger keeps.
A provider counts in units of its own (Stripe: HUF 5000 is 500000), and refuses what it cannot
take (1.255 KWD) at intake. An amount is the same whatever its spelling ("25" = "25.00")."""

import importlib
import json
from decimal import Decimal

import pytest
from django.apps import apps as django_apps
from django.contrib.auth import get_user_model

from approvals.models import Limit, ReviewItem
from ledger import money
from ledger.actions import action_request
from ledger.connectors import connector_for
from ledger.connectors.sandbox import SandboxConnector
from ledger.connectors.stripe import StripeConnector
from ledger.models import Action, AuditEvent, Task
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
    # More digits than Decimal's default 28 of precision: counted as written, not rounded away first.
    ("25.0000000000000000000000000001", "EUR", False),
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


# --- Provider units: Stripe counts by rules of its own (ledger.connectors.stripe_amounts) -------

STRIPE_UNITS = [  # amount, currency, what Stripe takes
    ("1500", "JPY", 1500),  # zero-decimal
    ("5000", "UGX", 5000),  # zero-decimal for refunds (its special case is for payouts)
    ("1.250", "KWD", 1250),  # three-decimal, last digit 0
    ("5000", "HUF", 500000),  # none in CLDR, two at Stripe
    ("5000", "ISK", 500000),  # whole krónur, two decimals in Stripe's API
    ("10.50", "TWD", 1050),  # two decimals for refunds (zero for payouts only)
    ("25", "EUR", 2500),
]
def post_refund(client, key, amount, currency="EUR"):
    return client.post("/api/v1/actions", json.dumps(refund_body(amount=amount, currency=currency)),
                       content_type="application/json", headers={"Idempotency-Key": key})


def post_refund_task(client, task_id, amount, currency="EUR"):
    body = {"workflow": "refund", "input": {"order_id": "ORD-1", "amount": amount, "currency": currency,
                                            "customer": "CUST-1"}}
    return client.post("/api/v1/tasks", json.dumps(body), content_type="application/json",
                       headers={"Idempotency-Key": task_id})


STRIPE = {"class": "ledger.connectors.stripe.StripeConnector", "options": {"api_key": "sk_test_surety"}}


@pytest.fixture
def stripe_refunds(settings):
    """Refunds served by the Stripe connector (nothing is sent: these tests only record)."""
    settings.SURETY_CONNECTORS = {**settings.SURETY_CONNECTORS, "refund": STRIPE}
    return connector_for("refund")


@pytest.mark.parametrize(("amount", "currency", "units"), STRIPE_UNITS)
def test_the_stripe_connector_converts_with_stripes_own_rules_both_ways(amount, currency, units):
    stripe = StripeConnector(api_key="sk_test_surety")
    assert stripe.to_provider_units(amount, currency) == units
    assert stripe.from_provider_units(units, currency) == Decimal(amount)
    assert stripe.amount_problem(amount, currency) is None


def test_stripe_reads_back_what_cldr_cannot_write_without_rounding_it():
    stripe = StripeConnector(api_key="sk_test_surety")
    assert str(stripe.from_provider_units(500000, "HUF")) == "5000"
    assert str(stripe.from_provider_units(500050, "HUF")) == "5000.50"  # never rounded into 5001
    assert str(stripe.from_provider_units(1250, "kwd")) == "1.250"


@pytest.mark.parametrize(("amount", "currency", "reason"), [
    ("1.255", "KWD", "Stripe takes KWD in multiples of 0.010: 1.255 KWD is not one."),
    ("0.125", "BHD", "Stripe takes BHD in multiples of 0.010: 0.125 BHD is not one."),
    ("5.50", "ISK", "Stripe takes ISK in multiples of 1.00: 5.50 ISK is not one."),
    ("1.234", "LYD", "Stripe takes LYD in multiples of 0.01: 1.234 LYD is not one."),  # three in CLDR, two at Stripe
])
def test_stripe_refuses_an_amount_it_cannot_take_with_the_reason(amount, currency, reason):
    stripe = StripeConnector(api_key="sk_test_surety")
    assert stripe.amount_problem(amount, currency) == reason
    with pytest.raises(ValueError, match="Stripe takes"):
        stripe.to_provider_units(amount, currency)


def test_a_connector_that_says_nothing_of_its_own_counts_in_cldrs_minor_units():
    sandbox = SandboxConnector()
    assert [sandbox.to_provider_units(a, c) for a, c in [("5000", "HUF"), ("1.255", "KWD"), ("25", "EUR")]] == [
        5000, 1255, 2500]
    assert sandbox.amount_problem("0.5", "JPY") == "0.5 has more decimals than JPY allows"


def test_a_refund_stripe_cannot_take_is_refused_at_intake_with_the_reason_and_nothing_is_written(
        agent_client, stripe_refunds):
    audited = AuditEvent.objects.count()
    response = post_refund(agent_client, "refund:kwd:dec-77", "1.255", "KWD")
    assert response.status_code == 400, response.content
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "invalid"
    assert response.json()["errors"]["params.amount"] == ["Stripe takes KWD in multiples of 0.010: 1.255 KWD is not one."]
    response = post_refund_task(agent_client, "task-kwd", "1.255", "KWD")
    assert response.status_code == 400, response.content
    assert "multiples of 0.010" in response.json()["errors"]["input.amount"][0]
    assert not Action.objects.exists() and not Task.objects.exists() and AuditEvent.objects.count() == audited

    response = post_refund(agent_client, "refund:kwd:dec-77", "1.25", "KWD")
    assert response.status_code == 201, response.content
    assert Action.objects.get().params["amount"] == "1.250"


def test_the_same_amount_is_accepted_where_the_refunds_connector_can_pay_it(agent_client):
    response = post_refund(agent_client, "refund:kwd:dec-77", "1.255", "KWD")
    assert response.status_code == 201, response.content  # the sandbox takes decimal strings


# --- One amount, whatever its spelling: fingerprints over canonical params ----------------------


def test_an_amount_respelt_under_the_same_key_is_a_replay_and_another_amount_is_refused(agent_client):
    key = "refund:ORD-8841:dec-77"
    first = post_refund(agent_client, key, "25")
    assert first.status_code == 201, first.content
    assert Action.objects.get().params["amount"] == "25.00"  # stored canonical
    for spelling in ("25.00", "25", "25.0", "025.000"):
        again = post_refund(agent_client, key, spelling, currency="eur")
        assert (again.status_code, again["Idempotent-Replayed"]) == (200, "true"), (spelling, again.content)
        assert again.json() == first.json()
    other = post_refund(agent_client, key, "24.99")
    assert other.status_code == 422, other.content
    assert other.json()["code"] == "idempotency_key_reused"
    assert Action.objects.count() == 1


def test_a_tasks_amount_respelt_is_a_replay_of_the_same_task(agent_client):
    assert post_refund_task(agent_client, "task-77", "25").status_code == 201
    assert Task.objects.get().input["amount"] == "25.00"
    assert post_refund_task(agent_client, "task-77", "25.00").status_code == 200
    assert post_refund_task(agent_client, "task-77", "24.99").json()["code"] == "idempotency_key_reused"
    assert Task.objects.count() == 1


def test_the_migration_gives_a_refund_recorded_before_the_rule_its_canonical_print(agent_client):
    """A row as the intake wrote it before: its params as spelt ("25"), its print and its
    approval's over them. After the migration "25" and "25.00" replay it, and the executor's
    check of the approval still holds."""
    reprint = importlib.import_module("ledger.migrations.0025_fingerprints_over_canonical_amounts")
    key = "refund:ORD-8841:dec-77"
    assert post_refund(agent_client, key, "25").status_code == 201
    params = {"amount": "25", "currency": "EUR"}
    before = reprint.hashed("refund", "ORD-8841", params)
    Action.objects.update(params=params, fingerprint=before, approved_fingerprint=before)
    assert post_refund_task(agent_client, "task-77", "25").status_code == 201
    spelt = {**Task.objects.get().input, "amount": "25"}
    Task.objects.update(input=spelt, fingerprint=reprint.hashed("workflow:refund", "task-77", spelt))
    assert post_refund(agent_client, key, "25.00").status_code == 422  # the old print: only "25" matches

    reprint.forwards(django_apps, None)

    for spelling in ("25", "25.00"):
        assert post_refund(agent_client, key, spelling).status_code == 200
    action = Action.objects.get()
    assert action.params == params  # what was recorded stays as it was
    assert action.approved_fingerprint == action.params_fingerprint() == action.fingerprint != before
    assert post_refund_task(agent_client, "task-77", "25.00").status_code == 200
    reprint.backwards(django_apps, None)
    assert Action.objects.get().fingerprint == before
