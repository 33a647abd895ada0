"""The demo's provider: the guarded executor drives `DemoConnector` as it drives any
connector, effects land in the sandbox's tables through the sandbox's own save, and each
scripted fault ends as the same fault at a real provider would (see docs/design.md, the guarded
executor's branches). No mock: real PostgreSQL, the real executor."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from demo.connector import (
    CANNOT_TELL,
    DECLINE,
    NOT_SENT,
    TIMEOUT_AFTER_COMMIT,
    TIMEOUT_BEFORE_COMMIT,
    DemoConnector,
    demo_provider,
)
from demo.seed import execute, time_passes
from ledger.actions import action_request
from ledger.connectors import connector_for, http
from ledger.connectors.base import write_permit
from ledger.executor import action_claim_next
from ledger.connectors.sandbox import SandboxConnector
from ledger.models import ActionType
from ledger.workflows import WORKFLOWS
from ledger.workflows.refund import REFUND
from sandbox.models import SandboxBooking, SandboxIdempotencyKey, SandboxMessage, SandboxRefund

pytestmark = pytest.mark.django_db

START = (timezone.now() + timedelta(days=1)).replace(hour=9, minute=0, second=0, microsecond=0)
REQUESTS = {  # action type -> (target, customer, params, the sandbox's model, its id field)
    ActionType.REFUND: ("ORD-1", "CUST-1", {"amount": "25.00", "currency": "EUR"}, SandboxRefund, "refund_id"),
    ActionType.SEND_MESSAGE: ("cust-1@customers.surety.example", "CUST-1",
                              {"channel": "email", "message_type": "refund_confirmation", "body": "Refunded."},
                              SandboxMessage, "message_id"),
    ActionType.CREATE_BOOKING: ("room-1", "CUST-1", {"service": "consultation", "start": START.isoformat(),
                                                     "end": (START + timedelta(hours=1)).isoformat()},
                                SandboxBooking, "booking_id"),
}


def request(agent, action_type=ActionType.REFUND, key="op-1"):
    target, customer, params, _, _ = REQUESTS[action_type]
    action, _ = action_request(agent=agent, operation_key=key, action_type=action_type, target=target,
                               customer=customer, params=params)
    return action


def refunds(action):
    return list(SandboxRefund.objects.filter(operation_key=action.operation_key))


@pytest.mark.parametrize("action_type", list(REQUESTS))
def test_an_effect_is_committed_at_the_sandbox_under_its_operation_key(agent, action_type):
    with demo_provider():
        action = execute(request(agent, action_type))

    _, _, _, model, ref = REQUESTS[action_type]
    effect = model.objects.get(operation_key=action.operation_key)
    assert action.status == "succeeded" and action.external_ref == getattr(effect, ref)
    assert action.result["id"] == action.external_ref
    # The sandbox's own idempotency saw the operation key, as the sandbox connector sends it.
    assert SandboxIdempotencyKey.objects.filter(key=action.operation_key, effect_id=action.external_ref).exists()


def test_a_decline_fails_the_action_for_good(agent):
    with demo_provider() as script:
        script.arm("ORD-1", DECLINE)
        action = execute(request(agent))

    assert action.status == "failed" and action.error["code"] == "declined" and not action.error["retryable"]
    assert refunds(action) == []


def test_a_call_that_never_reached_the_provider_is_tried_again_after_a_backoff(agent):
    with demo_provider() as script:
        script.arm("ORD-1", NOT_SENT, times=2)
        action = execute(request(agent))
        assert action.status == "queued" and action.next_attempt_at > timezone.now()
        assert refunds(action) == []

        time_passes(action, settings.BACKOFF_MAX_SECONDS)
        assert execute(action).status == "queued"  # the second fault armed
        time_passes(action, settings.BACKOFF_MAX_SECONDS)
        action = execute(action)  # none left: it goes through

    assert action.status == "succeeded" and action.attempts == 3 and len(refunds(action)) == 1


def test_a_timeout_after_the_commit_is_unknown_until_verification_finds_the_effect(agent):
    with demo_provider() as script:
        script.arm("ORD-1", TIMEOUT_AFTER_COMMIT)
        action = execute(request(agent))
        assert action.status == "unknown" and action.evidence[-1]["code"] == "timeout"
        [refund] = refunds(action)
        assert action.next_attempt_at > timezone.now()  # verified only once no answer can come

        time_passes(action, settings.CONNECTOR_TIMEOUT)
        action = execute(action)

    assert action.status == "succeeded" and action.external_ref == refund.refund_id
    assert action.evidence[-1]["found"] is True and action.attempts == 1  # found, never sent again


def test_a_commit_whose_answer_was_lost_stays_whatever_the_caller_rolls_back(agent):
    """The provider's commit is its own: a caller that called within a transaction of its own and
    rolls it back on the error (a test's, a shell's) still finds the effect at the provider, as a
    caller of the sandbox over HTTP would."""
    with demo_provider() as script:
        script.arm("ORD-1", TIMEOUT_AFTER_COMMIT)
        claimed = action_claim_next("demo-test", only=request(agent).pk)
        connector = connector_for(ActionType.REFUND)
        with pytest.raises(http.OutcomeUnknown), write_permit(claimed), transaction.atomic():
            connector.perform(claimed)

        lookup = connector.find_effect(claimed)

    [refund] = refunds(claimed)
    assert lookup.found is True and lookup.external_ref == refund.refund_id


def test_a_timeout_before_the_commit_is_verified_absent_and_tried_again(agent):
    with demo_provider() as script:
        script.arm("ORD-1", TIMEOUT_BEFORE_COMMIT)
        action = execute(request(agent))
        assert action.status == "unknown" and refunds(action) == []

        time_passes(action, settings.CONNECTOR_TIMEOUT)
        action = execute(action)
        assert action.status == "queued" and action.evidence[-1]["found"] is False

        time_passes(action, settings.BACKOFF_MAX_SECONDS)
        action = execute(action)

    assert action.status == "succeeded" and len(refunds(action)) == 1


def test_a_lookup_that_cannot_tell_sends_the_action_to_a_person(agent):
    with demo_provider() as script:
        script.arm("ORD-1", TIMEOUT_AFTER_COMMIT)
        script.arm("ORD-1", CANNOT_TELL)
        action = execute(request(agent))
        time_passes(action, settings.CONNECTOR_TIMEOUT)
        action = execute(action)

    assert action.status == "needs_review"
    assert action.evidence[-1]["found"] is None and action.evidence[-1]["verification"]["lookup"]["code"] == "http_503"


def test_the_sandbox_connector_and_the_workflow_are_back_after_the_demo_even_if_it_failed():
    with pytest.raises(RuntimeError), demo_provider():
        assert all(isinstance(connector_for(t), DemoConnector) for t in ActionType.values)
        assert WORKFLOWS["refund"] is not REFUND
        assert [s.name for s in WORKFLOWS["refund"].steps] == [s.name for s in REFUND.steps]
        raise RuntimeError("the seed failed midway")

    assert isinstance(connector_for(ActionType.REFUND), SandboxConnector)
    assert WORKFLOWS["refund"] is REFUND
