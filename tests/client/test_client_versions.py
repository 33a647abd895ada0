"""What the agent is told when a person edits its action down or nobody decides in time: the
API's action resource (and its document), the Python client (a typed error for an expired
approval; `wait_for(follow=True)` goes on to the version) and the MCP tools, against the live
server."""

from decimal import Decimal

import pytest

from approvals.decisions import review_edit
from approvals.models import Limit, ReviewItem
from approvals.reviews import approval_expire_due
from ledger.models import Action
from surety_client import ActionRejected, ApprovalExpired, SuretyClient
from tests.client.test_mcp_server import guidance_of, over_mcp
from tests.factories import api_client, make_agent, person, sandbox_list

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def token(stack):
    Limit.limit_set(actor="system:tests", reason="the tests' policy", action_type="refund", currency="EUR",
                    max_amount=Decimal("500.00"), approval_expires_after_hours=4)
    return make_agent("versions-bot")[1]


@pytest.fixture
def agent_client(stack, token):
    with SuretyClient(stack.url, token, retries=2, backoff=0.05) as client:
        yield client


def edit_down(operation_key, amount, reason):
    original = Action.objects.get(operation_key=operation_key)
    editor = person("rita", "approvers")
    return review_edit(ReviewItem.objects.get(action=original, status="open"), user=editor,
                       changes={"amount": amount}, reason=reason, fingerprint=original.params_fingerprint())[1]


def expire(operation_key):
    item = ReviewItem.objects.get(action__operation_key=operation_key, status="open")
    assert approval_expire_due(now=item.expires_at) == 1


def test_the_original_key_shows_the_approved_version_and_a_replay_answers_the_original(stack, agent_client, token):
    posted = agent_client.refund(order="ORD-V1", amount="900.00", currency="EUR", decision_id="dec-v1")
    version = edit_down(posted.operation_key, "400.00", "only the damaged item")

    original = agent_client.get_action(posted.operation_key)
    assert original.status == "superseded" and original.settled and not original.needs_person
    assert original.params == {"amount": "900.00", "currency": "EUR"}  # what the agent asked, unchanged
    assert original.superseded_by.operation_key == version.operation_key == posted.operation_key + "~v2"
    assert original.superseded_by.params == {"amount": "400.00", "currency": "EUR"}
    assert (original.superseded_by.by, original.superseded_by.reason) == ("user:rita", "only the damaged item")
    assert (original.review.by, original.review.reason) == ("user:rita", "only the damaged item")
    assert original.raise_for_outcome() is original  # not an error: the version runs instead

    # The agent retries the very same call: idempotency holds, the original answers, nothing runs twice.
    again = agent_client.refund(order="ORD-V1", amount="900.00", currency="EUR", decision_id="dec-v1")
    assert again.replayed and again.operation_key == posted.operation_key and again.status == "superseded"
    assert Action.objects.filter(target="ORD-V1").count() == 2

    stack.start_worker()
    done = agent_client.wait_for(posted.operation_key, timeout=30, follow=True)
    assert done.operation_key == version.operation_key and done.status == "succeeded"
    assert done.supersedes == posted.operation_key and done.superseded_by is None
    with api_client(stack.url, token) as api:
        assert [r["amount"] for r in sandbox_list(api, "refunds", order_id="ORD-V1")] == ["400.00"]


def test_an_expired_approval_is_its_own_outcome_and_a_typed_error(stack, agent_client):
    posted = agent_client.refund(order="ORD-V2", amount="900.00", currency="EUR", decision_id="dec-v2")
    expire(posted.operation_key)

    expired = agent_client.wait_for(posted.operation_key, timeout=5)
    assert expired.status == "expired" and expired.expired and expired.settled
    assert expired.error == {"code": "approval_expired", "retryable": False,
                             "message": "nobody approved or rejected it within 4 h (the limit's approval window)"}
    assert expired.review.by == "system:approvals"
    with pytest.raises(ApprovalExpired) as raised:
        expired.raise_for_outcome()
    assert not isinstance(raised.value, ActionRejected) and raised.value.action is expired
    assert raised.value.code == "approval_expired" and "expired by system:approvals" in str(raised.value)


def test_the_mcp_tools_say_expired_not_rejected_and_name_the_version_that_runs(stack, token):
    arguments = {"order": "ORD-M9", "amount": "900.00", "currency": "EUR", "decision_id": "dec-m9"}
    (waiting,) = over_mcp(stack.url, token, ("refund", arguments))
    key = waiting.structured_content["operation_key"]
    expire(key)
    (expired,) = over_mcp(stack.url, token, ("get_action", {"operation_key": key}))
    assert not expired.is_error and expired.structured_content["status"] == "expired"
    assert guidance_of(expired).startswith("Expired: nobody approved or rejected it")
    assert "not a rejection" in guidance_of(expired) and "Rejected" not in guidance_of(expired)

    arguments = {**arguments, "order": "ORD-M10", "decision_id": "dec-m10"}
    (waiting,) = over_mcp(stack.url, token, ("refund", arguments))
    version = edit_down(waiting.structured_content["operation_key"], "450.00", "one item")
    (superseded,) = over_mcp(stack.url, token, ("get_action", {"operation_key": waiting.structured_content[
        "operation_key"]}))
    assert superseded.structured_content["superseded_by"]["operation_key"] == version.operation_key
    assert guidance_of(superseded).startswith("Superseded: user:rita edited it into a new version")
    assert f"operation_key={version.operation_key!r}" in guidance_of(superseded)
