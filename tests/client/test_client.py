"""The Python client against the live server (gunicorn, PostgreSQL, Redis, an RQ worker)."""

import time
from datetime import timedelta
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.utils import timezone

from approvals.decisions import review_decide
from approvals.models import Limit, ReviewItem
from ledger.models import Action, Task
from surety_client import (
    CurrencyNotCovered,
    Forbidden,
    IdempotencyKeyReused,
    Invalid,
    NotFound,
    OperationKeyExpired,
    RefundAlreadyRecorded,
    SuretyClient,
    Unauthenticated,
    Unsendable,
    refund_key,
)
from surety_client import mcp_server
from tests.conftest import serving
from tests.factories import api_client, make_agent, person, sandbox_list, sandbox_order, settled

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def token(stack):
    return make_agent("client-bot")[1]


@pytest.fixture
def agent_client(stack, token):
    with SuretyClient(stack.url, token, retries=2, backoff=0.05) as client:
        yield client


def test_a_refund_is_posted_and_waited_for_until_it_succeeds(stack, agent_client, token):
    stack.start_worker()
    posted = agent_client.refund(order="ORD-C1", amount="25.00", currency="EUR", decision_id="dec-c1",
                                 customer="CUST-C1", reason="duplicate charge")
    assert posted.operation_key == "refund:ORD-C1:dec-c1" == refund_key("ORD-C1", "dec-c1")
    assert not posted.replayed and posted.params == {"amount": "25.00", "currency": "EUR", "reason": "duplicate charge"}
    done = agent_client.wait_for(posted.operation_key, timeout=30)
    assert done.status == "succeeded" and done.external_ref and done.review is None
    with api_client(stack.url, token) as provider:
        assert len(sandbox_list(provider, "refunds", order_id="ORD-C1")) == 1


def test_the_same_call_twice_is_one_action(stack, agent_client):
    first = agent_client.refund(order="ORD-C2", amount=Decimal("40.50"), currency="EUR", decision_id="dec-c2")
    again = agent_client.refund(order="ORD-C2", amount="40.50", currency="EUR", decision_id="dec-c2")
    assert (first.replayed, again.replayed) == (False, True)
    assert again.operation_key == first.operation_key
    assert Action.objects.filter(target="ORD-C2").count() == 1
    other_decision = agent_client.refund(order="ORD-C2", amount="40.50", currency="EUR", decision_id="dec-c3")
    assert other_decision.operation_key != first.operation_key and not other_decision.replayed


def test_a_decimal_in_exponent_form_is_sent_as_a_plain_decimal_string(stack, agent_client):
    """Decimal("100.00").normalize() prints "1E+2", which the API refuses as no decimal number."""
    posted = agent_client.refund(order="ORD-C5", amount=Decimal("100.00").normalize(), currency="EUR",
                                 decision_id="dec-c5")
    assert posted.params["amount"] in ("100", "100.00") and not posted.replayed


def test_the_same_decision_with_its_amount_written_otherwise_is_one_refund_and_another_amount_is_refused(
        stack, agent_client):
    first = agent_client.refund(order="ORD-C3", amount="25.00", currency="EUR", decision_id="dec-c3")
    respelt = agent_client.refund(order="ORD-C3", amount="25", currency="EUR", decision_id="dec-c3")
    assert respelt.replayed and respelt.operation_key == first.operation_key == "refund:ORD-C3:dec-c3"
    with pytest.raises(IdempotencyKeyReused):
        agent_client.refund(order="ORD-C3", amount="24.99", currency="EUR", decision_id="dec-c3")
    assert list(Action.objects.filter(target="ORD-C3").values_list("params__amount", flat=True)) == ["25.00"]


def test_an_over_limit_refund_says_a_person_must_decide_with_the_dashboard_link(stack, agent_client):
    Limit.limit_set(actor="system:tests", reason="the tests' policy",
                    action_type="refund", currency="EUR", max_amount=Decimal("500.00"))
    posted = agent_client.refund(order="ORD-C4", amount="900.00", currency="EUR", decision_id="dec-c4")
    waited = agent_client.wait_for(posted.operation_key, timeout=10)
    pk = Action.objects.get(operation_key=posted.operation_key).pk
    assert waited.status == "awaiting_approval" and waited.settled and waited.needs_person
    assert waited.review.url == f"{stack.url}/actions/{pk}/" and waited.review.reason is None


def test_a_rejected_refund_comes_back_with_the_reviewers_reason(stack, agent_client):
    Limit.limit_set(actor="system:tests", reason="the tests' policy",
                    action_type="refund", currency="EUR", max_amount=Decimal("500.00"))
    posted = agent_client.refund(order="ORD-C5", amount="900.00", currency="EUR", decision_id="dec-c5")
    reviewer = person("rita", "approvers")
    item = ReviewItem.objects.get(action__operation_key=posted.operation_key)
    review_decide(item, user=reviewer, decision="reject", reason="the order was already refunded by hand")
    rejected = agent_client.get_action(posted.operation_key)
    assert rejected.status == "rejected" and not rejected.needs_person
    assert (rejected.review.by, rejected.review.reason) == ("user:rita", "the order was already refunded by hand")


def test_wait_for_outcome_goes_on_reading_while_a_person_decides(stack, agent_client):
    Limit.limit_set(actor="system:tests", reason="the tests' policy",
                    action_type="refund", currency="EUR", max_amount=Decimal("500.00"))
    posted = agent_client.refund(order="ORD-C10", amount="900.00", currency="EUR", decision_id="dec-c10")
    with ThreadPoolExecutor(1) as thread:
        waiting = thread.submit(agent_client.wait_for_outcome, posted.operation_key, timeout=30, interval=0.2)
        time.sleep(1)  # it reads on meanwhile: the API's wait answers awaiting_approval at once
        assert not waiting.done()
        review_decide(ReviewItem.objects.get(action__operation_key=posted.operation_key),
                      user=person("rita", "approvers"), decision="reject", reason="refunded by phone")
        assert waiting.result(timeout=10).status == "rejected"


def test_a_colon_in_the_order_and_a_padded_decision_make_a_key_the_api_takes_and_answers(stack, agent_client):
    posted = agent_client.refund(order="gid://shop/Order/1", amount="25.00", currency="EUR", decision_id="dec-c9 ")
    assert posted.operation_key == "refund:gid%3A//shop/Order/1:dec-c9" and posted.decision_id == "dec-c9"
    assert agent_client.get_action(posted.operation_key).target == "gid://shop/Order/1"
    other = agent_client.refund(order="gid", amount="25.00", currency="EUR", decision_id="//shop/Order/1:dec-c9")
    assert other.operation_key == "refund:gid://shop/Order/1%3Adec-c9" and not other.replayed
    assert Action.objects.filter(target__startswith="gid").count() == 2


@pytest.mark.parametrize("key", [".", ".."])
def test_a_key_of_dots_alone_is_read_back_under_itself(stack, agent_client, key):
    """"." and ".." are keys like any other, but in a URL path they are dot segments, which HTTP
    clients and proxies remove ("/actions/.." is "/api/v1"): encoded, they name the action."""
    posted = agent_client.post_action(key, action_type="refund", target=f"ORD-DOTS{len(key)}",
                                      params={"amount": "5.00", "currency": "EUR"}, decision_id=f"dec-dots{len(key)}")
    assert posted.url.endswith("/api/v1/actions/" + "%2E" * len(key))
    assert agent_client.get_action(key).operation_key == key


def test_the_same_key_for_another_request_raises_idempotency_key_reused(stack, agent_client):
    agent_client.post_action("refund:ORD-C6:manual", action_type="refund", target="ORD-C6",
                             params={"amount": "10.00", "currency": "EUR"})
    with pytest.raises(IdempotencyKeyReused) as raised:
        agent_client.post_action("refund:ORD-C6:manual", action_type="refund", target="ORD-C6",
                                 params={"amount": "11.00", "currency": "EUR"})
    assert (raised.value.status, raised.value.code) == (422, "idempotency_key_reused")
    assert Action.objects.get(operation_key="refund:ORD-C6:manual").params["amount"] == "10.00"


def test_another_agents_refund_for_the_same_decision_raises_refund_already_recorded(stack, agent_client):
    agent_client.refund(order="ORD-C10", amount="25.00", currency="EUR", decision_id="dec-c10")
    _, other = make_agent("other-bot")
    with SuretyClient(stack.url, other, retries=0) as another, pytest.raises(RefundAlreadyRecorded) as raised:
        another.post_action("refund:ORD-C10:other-bot", action_type="refund", target="ORD-C10", decision_id="dec-c10",
                            params={"amount": "25.00", "currency": "EUR"})
    assert raised.value.status == 409 and Action.objects.filter(target="ORD-C10").count() == 1


def test_bad_params_raise_invalid_with_the_fields_errors(stack, agent_client):
    with pytest.raises(Invalid) as raised:
        agent_client.refund(order="ORD-C7", amount=25.0, currency="ZZZ", decision_id="dec-c7")
    assert raised.value.status == 400
    assert set(raised.value.errors) == {"params.amount", "params.currency"}
    assert not Action.objects.filter(target="ORD-C7").exists()


def test_other_problems_raise_their_own_types(stack, agent_client):
    with pytest.raises(NotFound):
        agent_client.get_action("refund:nobody:knows")
    _, refunds_only = make_agent("refunds-only", grants=("refund",))
    with SuretyClient(stack.url, refunds_only, retries=0) as limited, pytest.raises(Forbidden):
        limited.send_message(recipient="ana@example.com", channel="email", message_type="receipt", body="Hi",
                             decision_id="dec-c8")
    with SuretyClient(stack.url, "not-a-token", retries=0) as stranger, pytest.raises(Unauthenticated):
        stranger.get_action("refund:ORD-C1:dec-c1")
    # The same call once its key's lifetime has passed (its recording moved back past it).
    expired = agent_client.refund(order="ORD-C9", amount="5.00", currency="EUR", decision_id="dec-c9")
    Action.objects.filter(operation_key=expired.operation_key).update(
        created_at=timezone.now() - timedelta(days=settings.OPERATION_KEY_LIFETIME_DAYS + 1))
    with pytest.raises(OperationKeyExpired) as raised:
        agent_client.refund(order="ORD-C9", amount="5.00", currency="EUR", decision_id="dec-c9")
    assert (raised.value.status, raised.value.code) == (410, "operation_key_expired")


def test_a_currency_no_limit_covers_raises_currency_not_covered_where_the_deployment_refuses_it(stack, token):
    """A server with LIMITS_UNCOVERED_CURRENCY=refuse answers a refund in a currency none of the
    refund limits covers 422 currency_not_covered, and records nothing: the client raises its own
    class for it, which an agent tells apart from a refusal of its params (Invalid)."""
    Limit.limit_set(actor="system:tests", reason="the tests' policy",
                    action_type="refund", currency="EUR", max_amount=Decimal("500.00"))
    with serving(stack.env["DATABASE_URL"], workers=1, threads=4, LIMITS_UNCOVERED_CURRENCY="refuse") as refusing, \
            SuretyClient(refusing.url, token, retries=0) as client, pytest.raises(CurrencyNotCovered) as raised:
        client.refund(order="ORD-C11", amount="25.00", currency="JPY", decision_id="dec-c11")
    assert (raised.value.status, raised.value.code) == (422, "currency_not_covered")
    assert "JPY" in raised.value.detail, raised.value.body
    assert not Action.objects.filter(target="ORD-C11").exists()


# Production's own settings (tests.settings refuses PRODUCTION), as a deployment starts them.
PRODUCTION = {"DJANGO_SETTINGS_MODULE": "config.settings", "PRODUCTION": "true", "SECRET_KEY": "p" * 60,
              "ALLOWED_HOSTS": "127.0.0.1", "SECURE_SSL_REDIRECT": "true",
              "CONNECTOR_REFUND": "sandbox", "CONNECTOR_SEND_MESSAGE": "sandbox", "CONNECTOR_CREATE_BOOKING": "sandbox"}


def test_a_redirect_to_https_is_unsendable_not_the_apis_answer_and_records_nothing(stack, token):
    """Production's SECURE_SSL_REDIRECT moves an http:// request to https:// before the API sees it:
    the 301's empty body is no action, nothing was recorded, and the same URL is moved alike, so
    the client says its URL is wrong (Unsendable, through the MCP server a tool error not to retry
    unchanged) after one request, instead of following it or retrying it."""
    answers = []
    with serving(stack.env["DATABASE_URL"], workers=1, threads=4, **PRODUCTION) as production, \
            SuretyClient(production.url, token, retries=4, backoff=0.05) as client:
        client._http.event_hooks["response"].append(answers.append)
        with pytest.raises(Unsendable) as raised:
            client.refund(order="ORD-C12", amount="25.00", currency="EUR", decision_id="dec-c12")
        result = mcp_server.call(client, "refund", {"order": "ORD-C12", "amount": "25.00", "currency": "EUR",
                                                    "decision_id": "dec-c12"})
    moved_to = f"https://127.0.0.1:{urlsplit(production.url).port}/api/v1/actions"
    assert [(response.status_code, response.headers["Location"]) for response in answers] == [(301, moved_to)] * 2
    assert raised.value.operation_key == "refund:ORD-C12:dec-c12" and moved_to in str(raised.value)
    assert result.is_error and result.structured_content["code"] == "unsendable"
    assert moved_to in result.structured_content["detail"] and result.structured_content["retry"] is False
    assert not Action.objects.filter(target="ORD-C12").exists()


def test_a_refund_task_is_started_once_and_its_checkpoint_read_until_done(stack, agent_client, token):
    with api_client(stack.url, token) as provider:
        sandbox_order(provider, "ORD-C9", "CUST-C9")
    stack.start_worker()
    task_input = {"order": "ORD-C9", "amount": "25.00", "currency": "EUR", "customer": "CUST-C9",
                  "decision_id": "dec-c9"}
    started = agent_client.start_refund_task(**task_input)
    assert started.task_id == "task:refund:ORD-C9:dec-c9" and not started.replayed
    assert agent_client.start_refund_task(**task_input).replayed
    settled(Task.objects.get(task_id=started.task_id), seconds=60)  # sweeping, as the sweeper would
    done = agent_client.wait_for_task(started.task_id, timeout=30)
    assert done.state == "succeeded", done.raw
    assert list(done.steps) == ["lookup_order", "call_refund_api", "write_confirmation", "notify_customer"]
    assert all(step.status == "done" for step in done.steps.values())
    refund_step = agent_client.get_action(done.steps["call_refund_api"].idempotency_key)
    assert refund_step.status == "succeeded" and refund_step.task_id == started.task_id
    # The task carried its decision: the same decision's refund asked directly is the task's refund.
    direct = agent_client.refund(order="ORD-C9", amount="25", currency="EUR", customer="CUST-C9", decision_id="dec-c9")
    assert direct.replayed and direct.operation_key == refund_step.operation_key
