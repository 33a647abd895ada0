"""A worker that dies (SIGKILL) while its action is `pending` loses nothing and doubles nothing.

The sandbox's own idempotency is off, so only the ledger stands between a lost worker and a
second refund. The late-worker rule (fencing tokens) is checked on the rows directly.
"""

from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from console.sweeper import sweep_once
from ledger import executor
from ledger.models import Action, ActionStatus, StaleClaim
from sandbox.models import SandboxRefund
from tests.conftest import wait_until
from tests.factories import (agent_api, audit_events, make_action, make_agent, post_action, refund_body, sandbox,
                             sandbox_list, sandbox_without_idempotency)

S = ActionStatus


def test_a_worker_killed_while_pending_is_verified_after_its_lease_not_repeated(stack, settings):
    client = agent_api(stack.url)
    key = "refund:ORD-K1:full:dec-1"
    sandbox_without_idempotency(client)
    # The sandbox commits, then stalls 3 s (SANDBOX_TIMEOUT_SLEEP); this worker would wait 6 s.
    sandbox(client, "POST", "faults", json={"target": "ORD-K1", "fault": "timeout_after_commit", "times": 1})
    doomed = stack.start_worker(CONNECTOR_TIMEOUT=6, LEASE_SECONDS=8)

    assert post_action(client, key, refund_body("ORD-K1")).status_code == 201
    # Read the sandbox's table directly: the kill must land inside the 3 s stall.
    wait_until(lambda: SandboxRefund.objects.filter(operation_key=key).exists(), seconds=20, interval=0.02,
               message="the refund to be committed")
    stack.kill_worker(doomed)  # inside the stall: the worker never hears the answer
    claimed = Action.objects.get(operation_key=key)
    assert (claimed.status, claimed.attempts) == (S.PENDING, 1)

    settings.CONNECTOR_TIMEOUT = 6
    settings.LEASE_SECONDS = 8
    stack.start_worker()

    def swept_and_settled():
        sweep_once()
        action = Action.objects.get(operation_key=key)
        return action.status not in (S.PENDING, S.UNKNOWN) and action

    action = wait_until(swept_and_settled, seconds=30, interval=0.25, message="the sweeper to settle the action")

    assert action.status == S.SUCCEEDED
    assert action.attempts == 1
    refunds = sandbox_list(client, "refunds", operation_key=key)
    assert [r["id"] for r in refunds] == [action.external_ref]
    expiry = [e for e in action.evidence if "lease_expired" in e]
    assert expiry and expiry[0]["owner"] == claimed.lease_owner
    # Not before lease end + CONNECTOR_TIMEOUT: until then a call of the old claim may be in flight.
    marked_at = datetime.fromisoformat(expiry[0]["at"])
    assert marked_at >= claimed.lease_expires_at + timedelta(seconds=6)
    assert action.evidence[-1]["found"] is True
    verbs = list(audit_events(action).values_list("verb", flat=True))
    assert verbs == ["requested", "claimed", "outcome_unknown", "succeeded"]


@pytest.fixture
def agent(db):
    return make_agent("billing", grants=())[0]


def test_a_late_worker_whose_claim_was_superseded_cannot_write_its_outcome(agent):
    late = make_action(agent, S.QUEUED).claim(owner="host:late")
    old_claim = late.fence
    # Its lease lapsed; the sweeper made the outcome unknown and a second worker took it over.
    Action.objects.get(pk=late.pk).mark_unknown(
        actor="system:sweeper", claim=old_claim, verify_at=timezone.now(), evidence={"lease_expired": "…"},
    )
    Action.objects.get(pk=late.pk).claim_for_verification(owner="host:new")
    row_before = Action.objects.values().get(pk=late.pk)

    with pytest.raises(StaleClaim):
        late.mark_succeeded(actor="system:executor", external_ref="re_late", claim=old_claim)
    with pytest.raises(StaleClaim):
        late.mark_failed(actor="system:executor", code="x", message="x", retryable=False, claim=old_claim)

    assert Action.objects.values().get(pk=late.pk) == row_before
    assert row_before["fence"] > old_claim


def test_the_executor_drops_a_late_write_instead_of_failing(agent):
    late = make_action(agent, S.QUEUED).claim(owner="host:late")
    Action.objects.get(pk=late.pk).mark_unknown(
        actor="system:sweeper", claim=late.fence, verify_at=timezone.now(), evidence={"lease_expired": "…"},
    )
    assert executor._settle(late.mark_succeeded, actor="system:executor", claim=late.fence,
                            external_ref="re_late") is None
    assert Action.objects.get(pk=late.pk).status == S.UNKNOWN


def test_an_action_being_verified_is_not_claimed_again_while_its_lease_runs(agent, settings):
    settings.LEASE_SECONDS = 30
    action = make_action(agent, S.QUEUED).claim(owner="host:1")
    action.mark_unknown(actor="system:sweeper", claim=action.fence, verify_at=timezone.now(), evidence={"x": 1})

    first = executor.action_claim_next("host:a")
    second = executor.action_claim_next("host:b")

    assert first is not None and first.pk == action.pk
    assert second is None, "a second worker took over a verification in progress"
    assert not executor.action_runnable_exists()


def test_an_action_whose_verifier_died_is_claimed_again_after_its_lease(agent, settings):
    action = make_action(agent, S.QUEUED).claim(owner="host:1")
    action.mark_unknown(actor="system:sweeper", claim=action.fence, verify_at=timezone.now(), evidence={"x": 1})
    first = executor.action_claim_next("host:a")
    Action.objects.filter(pk=first.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))

    again = executor.action_claim_next("host:b")

    assert again is not None and again.pk == action.pk and again.fence > first.fence
    assert again.lease_owner == "host:b"
