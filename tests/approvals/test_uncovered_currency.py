"""Limits fail closed: where an action type has limits, an amount in a currency none of them
covers waits for a person (or, by setting, is refused at intake with nothing written); a type
without any limit runs, as it always did; the policies page says which currencies are covered."""

from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model

from approvals.intake import needs_person_after_verification, verdict_for_action
from approvals.models import Limit, ReviewItem
from approvals.whatif import Proposal, whatif
from ledger.actions import Refused, action_request
from ledger.models import Action, ActionStatus, AuditEvent, TaskState
from ledger.runner import task_run
from ledger.tasks import task_claim_next, task_request
from tests.factories import (
    make_action, make_agent, make_agent_on, message_body, post_action_in_process, refund_body, refund_input,
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis")]

JPY = refund_body("ORD-1", amount="900000", currency="JPY", customer="CUST-1", decision="dec-1")


@pytest.fixture
def agent_client(client):
    make_agent_on(client)
    return client


@pytest.fixture
def eur_and_usd():
    """The limits a new user sets first: refunds over 500 in EUR and in USD need a person."""
    for currency in ("EUR", "USD"):
        Limit.limit_set(actor="system:tests", reason="the tests' policy", action_type="refund", currency=currency,
                        max_amount=Decimal("500.00"))


def post(client, key, body):
    response = post_action_in_process(client, key, body)
    return response, response.json()


@pytest.mark.usefixtures("eur_and_usd")
def test_it_makes_a_refund_in_a_currency_without_a_limit_wait_for_a_person(agent_client):
    response, action = post(agent_client, "refund:ORD-1:dec-1", JPY)
    assert response.status_code == 201, action
    assert action["status"] == "awaiting_approval"
    item = ReviewItem.objects.get(action__operation_key="refund:ORD-1:dec-1")
    assert item.why == "no refund limit covers JPY (limits are set in EUR, USD): a person approves"
    assert item.approvals_needed == 1 and item.limit_snapshot is None  # no limit of its own to show
    # The covered currencies are as they were: under the limit it runs, above it waits.
    assert post(agent_client, "refund:ORD-2:dec-2", refund_body("ORD-2", amount="400.00", customer="CUST-2", decision="dec-2"))[1][
        "status"] == "queued"
    assert post(agent_client, "refund:ORD-3:dec-3", refund_body("ORD-3", amount="600.00", customer="CUST-3", decision="dec-3"))[1][
        "status"] == "awaiting_approval"


@pytest.mark.usefixtures("eur_and_usd")
def test_it_refuses_a_refund_in_a_currency_without_a_limit_when_set_to_and_writes_nothing(agent_client, settings):
    settings.LIMITS_UNCOVERED_CURRENCY = "refuse"
    events = AuditEvent.objects.count()
    response, problem = post(agent_client, "refund:ORD-1:dec-1", JPY)
    assert response.status_code == 422 and response["Content-Type"] == "application/problem+json"
    assert problem["code"] == "currency_not_covered" and problem["type"].endswith("/currency_not_covered")
    assert problem["detail"] == ("no refund limit covers JPY (limits are set in EUR, USD): refused at intake; "
                                 "nothing was recorded.")
    assert not Action.objects.exists() and AuditEvent.objects.count() == events
    assert post(agent_client, "refund:ORD-2:dec-2", refund_body("ORD-2", customer="CUST-2", decision="dec-2"))[1]["status"] == "queued"


def test_an_action_type_without_any_limit_runs_in_any_currency(agent_client, settings):
    settings.LIMITS_UNCOVERED_CURRENCY = "refuse"
    assert post(agent_client, "refund:ORD-1:dec-1", JPY)[1]["status"] == "queued"
    Limit.limit_set(actor="system:tests", reason="the tests' policy", action_type="refund", currency="EUR",
                    max_amount=Decimal("500.00"))
    assert post(agent_client, "msg:ada:receipt:dec-1", message_body())[1]["status"] == "queued"  # no amount


@pytest.mark.usefixtures("eur_and_usd")
def test_a_recorded_action_without_a_limit_waits_for_a_person_even_when_intake_refuses(settings):
    """The refusal is for a new request only: an action recorded before the setting changed
    (released from a hold, decided, verified) still goes to a person, never runs unchecked."""
    settings.LIMITS_UNCOVERED_CURRENCY = "refuse"
    agent, _ = make_agent("billing")
    action = make_action(agent, "unknown", amount="900000", currency="JPY",
                         params={"amount": "900000", "currency": "JPY"})
    verdict = verdict_for_action(action)
    assert verdict.approvals_needed == 1 and not verdict.refused
    assert needs_person_after_verification(action) == "verified, but no refund limit covers JPY (limits are set in " \
                                                      "EUR, USD)"


@pytest.mark.usefixtures("eur_and_usd")
def test_the_policies_page_says_which_currencies_each_action_type_covers(client, settings):
    client.force_login(get_user_model().objects.create_superuser("root", password="x"))
    page = client.get("/policies/").content.decode()
    assert 'covered in <span class="mono">EUR, USD</span> <span class="muted">— any other currency waits for a ' \
           'person</span>' in page
    assert page.count("no limit: runs without approval in any currency") == 2  # messages and bookings
    settings.LIMITS_UNCOVERED_CURRENCY = "refuse"
    assert "— any other currency is refused at intake" in client.get("/policies/").content.decode()


@pytest.mark.usefixtures("eur_and_usd")
def test_the_whatif_of_a_first_limit_in_a_currency_starts_from_the_intakes_rule(client):
    """Before a JPY limit exists, each JPY refund waited for a person: the preview says so and
    counts them under today's rule, as the intake decided them."""
    client.force_login(get_user_model().objects.create_superuser("root", password="x"))
    agent, _ = make_agent("billing")
    for n, amount in enumerate(["900000", "1000"]):
        make_action(agent, "awaiting_approval", key=f"refund:ORD-{n}:dec", target=f"ORD-{n}", amount=amount,
                    currency="JPY", params={"amount": amount, "currency": "JPY"})
    form = {"action_type": "refund", "currency": "JPY", "max_amount": "50000", "dual_approval_above": "",
            "daily_customer_total": "", "review_deadline_hours": "4", "days": "30"}
    page = client.post("/policies/whatif", form, headers={"HX-Request": "true"}).content.decode()
    assert "under today's rule (no refund limit covers JPY (limits are set in EUR, USD): each waits for a person)" \
        in page
    assert ('<tr data-row="uncovered"><th scope="row">needed one approver (no limit in the currency)</th>'
            '<td class="num">2</td>') in page
    assert '<tr data-row="waiting"><th scope="row">waited for a person</th><td class="num">2</td>' in page
    assert "1 would no longer wait" in page.replace("<strong>", "").replace("</strong>", "")


def refund(agent, n, amount, currency):
    return action_request(agent=agent, operation_key=f"refund:ORD-{n}:dec-{n}", action_type="refund",
                          target=f"ORD-{n}", customer=f"CUST-{n}", decision_id=f"dec-{n}",
                          params={"amount": amount, "currency": currency})[0]


@pytest.mark.parametrize(("setting", "becomes"), [("refuse", Refused), ("approve", ActionStatus.AWAITING_APPROVAL)])
def test_the_preview_of_a_types_first_limit_counts_the_requests_it_leaves_uncovered(settings, setting, becomes):
    """A type's first limit (refund EUR) makes every other currency Uncovered: the preview,
    which replays EUR only, says how many of the window's refunds in USD and GBP would then
    have waited for a person, or been refused, as the intake treats the next one."""
    settings.LIMITS_UNCOVERED_CURRENCY = setting
    agent, _ = make_agent("billing")
    for n, currency in enumerate(["USD", "USD", "USD", "GBP", ""]):
        assert refund(agent, n, "10.00" if currency else None, currency).status == ActionStatus.QUEUED
    preview = whatif(Proposal("refund", "EUR", Decimal("500.00")), days=1)
    assert preview["counts"]["actions"] == 0  # nothing in EUR to replay
    # Without a currency (or an amount) a request has no rule to fail: it runs still.
    assert preview["left_uncovered"] == {"currencies": {"GBP": 1, "USD": 3}, "refused": setting == "refuse"}
    Limit.limit_set(actor="system:tests", reason="first limit", action_type="refund", currency="EUR",
                    max_amount=Decimal("500.00"))
    if becomes is Refused:
        with pytest.raises(Refused):
            refund(agent, 9, "10.00", "USD")
    else:
        assert refund(agent, 9, "10.00", "USD").status == becomes


@pytest.mark.usefixtures("eur_and_usd")
def test_a_limit_of_a_type_that_has_limits_leaves_no_currency_uncovered():
    """Its other currencies are covered, or Uncovered already: the save changes neither."""
    agent, _ = make_agent("billing")
    make_action(agent, "awaiting_approval", amount="10.00", currency="JPY")
    for currency in ("EUR", "JPY"):
        assert whatif(Proposal("refund", currency, Decimal("50.00")))["left_uncovered"] is None


@pytest.mark.usefixtures("eur_and_usd")
def test_a_workflows_refund_in_a_currency_without_a_limit_fails_its_step_when_refused(settings):
    settings.LIMITS_UNCOVERED_CURRENCY = "refuse"
    settings.SANDBOX_BASE_URL = "http://127.0.0.1:9/sandbox/v1"  # never reached: the look-up is done below
    agent, _ = make_agent("billing")
    task, _ = task_request(agent=agent, task_id="refund-j1", workflow="refund",
                           input={**refund_input("ORD-J1", "C-J1", "900000"), "currency": "JPY"})
    task.steps.filter(name="lookup_order").update(status="done", result={"order_id": "ORD-J1"})

    task = task_run(task_claim_next("tests:1", only=task.pk))
    assert (task.state, task.last_error["code"]) == (TaskState.FAILED, "currency_not_covered")
    assert "no refund limit covers JPY" in task.last_error["message"]
    assert not Action.objects.filter(task=task).exists()
