"""A provider's failure code reaches the action's error (and its evidence, and a task's last error)
as a short string, whatever the provider, or anything answering in its place, put there: the
contract's error `code` is text (the OpenAPI document's too) that agents, the client and the MCP
server read and branch on. A code of up to 64 letters, digits, `_`, `-` and `.` is kept as it came;
any other (an object, a list, a number, a megabyte of text, spaces or markup) is `unreadable_code`,
and the start of what came is kept in the message. The providers are stubs over real HTTP: the
sandbox's and Stripe's wire formats, which never answer so themselves."""

import json

import pytest

from ledger.actions import action_request
from tests.conftest import thread_server
from tests.connectors.test_sandbox_answers import provider
from tests.connectors.test_signed_http import run_once
from tests.connectors.test_stripe_failures import run_once as run_once_at_stripe
from tests.connectors.test_stripe_failures import scripted, stripe_error  # noqa: F401 (a fixture)
from tests.factories import make_agent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("jobs_to_test_redis")]

UNREADABLE = {
    "an_object": {"reason": "declined", "detail": {"nested": [1, 2]}},
    "a_list": ["declined", "retry_later"],
    "a_number": 4021,
    "true": True,
    "a_megabyte": "x" * 1_000_000,
    "one_too_many": "c" * 65,
    "spaces_and_markup": "card declined <script>alert(1)</script>",
    "a_line_break": "declined\nforged: log line",
    "beyond_ascii": "décliné",
}
READABLE = ["card_declined", "E-4021.v2", "SLOT_TAKEN", "c" * 64]


def refused_by_the_sandbox(settings, status, code):
    handler, _ = provider(status, code)
    with thread_server(handler) as stub:
        settings.SANDBOX_BASE_URL = f"{stub.url}/sandbox/v1"
        action, _ = action_request(agent=make_agent("billing")[0], operation_key="refund:ORD-C:full:dec-1",
                                   action_type="refund", target="ORD-C", params={"amount": "25.00", "currency": "EUR"})
        return run_once(action)


def assert_shown_in_part(message, code):
    """The message keeps the start of what came, and no more than a short message's worth."""
    assert json.dumps(code)[:40] in message
    assert len(message) < 1000


@pytest.mark.parametrize("code", UNREADABLE.values(), ids=UNREADABLE.keys())
def test_a_refusal_whose_code_is_no_short_string_fails_as_unreadable_code(settings, code):
    action = refused_by_the_sandbox(settings, 422, code)

    assert (action.status, action.error["code"], action.error["retryable"]) == ("failed", "unreadable_code", False)
    assert_shown_in_part(action.error["message"], code)


@pytest.mark.parametrize("code", READABLE)
def test_a_refusal_whose_code_is_a_short_string_keeps_it_as_it_came(settings, code):
    action = refused_by_the_sandbox(settings, 422, code)

    assert (action.status, action.error["code"]) == ("failed", code)
    assert "unreadable" not in action.error["message"]


def test_an_answer_that_is_no_refusal_keeps_the_code_bounded_in_its_evidence(settings):
    """A 409 is an unknown outcome (the key still in use), its code kept in the evidence."""
    settings.CONNECTOR_TIMEOUT = 1
    code = UNREADABLE["an_object"]
    action = refused_by_the_sandbox(settings, 409, code)

    assert (action.status, action.evidence[-1]["code"]) == ("unknown", "unreadable_code")
    assert_shown_in_part(action.evidence[-1]["message"], code)


@pytest.mark.parametrize("code", [UNREADABLE["an_object"], UNREADABLE["a_megabyte"], UNREADABLE["a_number"]],
                         ids=["an_object", "a_megabyte", "a_number"])
def test_a_stripe_refusal_whose_code_is_no_short_string_fails_as_unreadable_code(scripted, code):  # noqa: F811
    scripted.script.append(stripe_error(402, "card_error", "Your card was declined.", code=code))

    action = run_once_at_stripe("refund:ch_c:full", "ch_c")

    assert (action.status, action.error["code"], action.error["retryable"]) == ("failed", "unreadable_code", False)
    assert_shown_in_part(action.error["message"], code)


def test_a_stripe_refusal_keeps_its_own_code(scripted):  # noqa: F811
    scripted.script.append(stripe_error(402, "card_error", "Your card was declined.", code="card_declined"))

    action = run_once_at_stripe("refund:ch_k:full", "ch_k")

    assert (action.status, action.error["code"]) == ("failed", "card_declined")
