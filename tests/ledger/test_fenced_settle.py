"""A claimed action is settled by its fence: the settle writes with UPDATE ... WHERE fence =
<claim> AND status = pending, without reading the row FOR UPDATE first, and with its audit event
in the same statement; a write that the row no longer matches is refused as before and writes no
audit event (decisions 53, 54)."""

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from ledger import clock
from ledger.actions import action_request
from ledger.executor import action_claim_next, action_expire_leases
from ledger.models import Action, AuditEvent, StaleClaim
from tests.factories import make_action

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("jobs_to_test_redis")]


def claimed(agent, key="k-1"):
    action, _ = action_request(agent=agent, operation_key=key, action_type="refund", target=f"ORD-{key}",
                               params={"amount": "5.00", "currency": "EUR"})
    return action_claim_next("worker", only=action.pk)


def test_a_settle_writes_once_by_its_fence_and_reads_nothing_locked(agent):
    action = claimed(agent)
    with CaptureQueriesContext(connection) as queries:
        action.mark_succeeded(actor="system:executor", claim=action.fence, external_ref="re_1")
    statements = [q["sql"] for q in queries]
    assert not [sql for sql in statements if "FOR UPDATE" in sql], statements
    writes = [sql for sql in statements if 'UPDATE "ledger_action"' in sql]
    assert len(writes) == 1 and '"fence" = ' in writes[0].split("WHERE")[1], writes
    if connection.vendor == "postgresql":
        # Its audit event goes in the same statement, and with nothing held on its subjects
        # there is no look for held actions either: the settle is that one statement (decision 54).
        assert 'INSERT INTO "ledger_auditevent"' in writes[0]
        assert [sql for sql in statements if sql not in ("BEGIN", "COMMIT")] == writes
    row = Action.objects.get(pk=action.pk)
    assert (row.status, row.external_ref, row.lease_owner) == ("succeeded", "re_1", "")
    assert AuditEvent.objects.filter(object_id=str(action.pk), verb="succeeded").count() == 1


def test_a_settle_under_a_claim_that_was_taken_over_is_refused_and_writes_nothing(agent):
    action = claimed(agent)
    stale = Action.objects.get(pk=action.pk)
    Action.objects.filter(pk=action.pk).update(lease_expires_at="2000-01-01T00:00:00Z")
    assert action_expire_leases() == 1  # unknown now, under a new fence
    with pytest.raises(StaleClaim):
        stale.mark_succeeded(actor="system:executor", claim=stale.fence, external_ref="re_late")
    row = Action.objects.get(pk=action.pk)
    assert (row.status, row.external_ref) == ("unknown", "")
    assert stale.status == "pending"  # the worker's copy is left as it was
    assert not AuditEvent.objects.filter(object_id=str(action.pk), verb="succeeded").exists()


def test_a_settle_after_someone_settled_it_without_a_claim_is_refused_and_writes_nothing(agent):
    action = claimed(agent)
    # A webhook (or a person) settles it meanwhile: the status moves, and the fence with it.
    Action.objects.get(pk=action.pk).mark_succeeded(actor="system:webhooks", external_ref="re_hook")
    with pytest.raises(StaleClaim):
        action.mark_failed(actor="system:executor", claim=action.fence, code="timeout", message="t", retryable=True)
    row = Action.objects.get(pk=action.pk)
    assert (row.status, row.external_ref, row.error) == ("succeeded", "re_hook", None)


def test_a_verifiers_look_from_before_a_webhook_does_not_land_once_the_row_is_back_where_it_claimed_it(agent):
    """unknown -> (a webhook: an over-limit success) needs_review -> (a failure event) unknown: the
    status is the one the verifier claimed again, and its look, taken before the webhook, said
    absent. Written, it would send again an effect the provider just reported."""
    action = claimed(agent)
    action.mark_unknown(actor="system:executor", claim=action.fence, evidence={"call": "timeout"},
                        verify_at=clock.now() - timedelta(seconds=1))
    verifier = action_claim_next("verifier", only=action.pk)
    assert verifier.status == "unknown"
    Action.objects.get(pk=action.pk).mark_needs_review(actor="system:webhook:sandbox", reason="over the limit",
                                                       evidence={"webhook": "refund.succeeded"})
    Action.objects.get(pk=action.pk).verify_again(actor="system:webhook:sandbox", reason="refund.failed received")
    assert Action.objects.get(pk=action.pk).status == "unknown"
    with pytest.raises(StaleClaim):
        verifier.requeue(actor="system:executor", claim=verifier.fence, reason="absent at the provider",
                         evidence={"found": False})
    row = Action.objects.get(pk=action.pk)
    assert row.status == "unknown" and {"webhook": "refund.succeeded"} in row.evidence


def test_a_settle_with_an_action_held_on_its_target_says_so_and_releases_it(agent):
    action = claimed(agent)
    held, _ = action_request(agent=agent, operation_key="k-2", action_type="refund", target=action.target,
                             params={"amount": "6.00", "currency": "EUR"})
    assert held.status == "held"
    settled = action.mark_succeeded(actor="system:executor", claim=action.fence, external_ref="re_1")
    assert settled.held_nearby
    assert Action.objects.get(pk=held.pk).status == "queued"


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite serialises writers")
def test_a_settle_that_waited_for_its_row_sees_an_action_held_meanwhile_and_releases_it(agent):
    """The intake locks the action in flight (its siblings) and stores a new one on its target
    held; the worker's settle waits for that row lock meanwhile. What it reads back is read once
    it has the row, so the action held while it waited is released, not left held for good."""
    action = claimed(agent)
    locked, go = threading.Event(), threading.Event()

    def intake():
        try:
            with transaction.atomic():
                Action.objects.select_for_update().get(pk=action.pk)
                make_action(agent, "queued", key="k-2", target=action.target)  # stored held by the database
                locked.set()
                go.wait(10)
        finally:
            connection.close()

    def settle():
        try:
            action.mark_succeeded(actor="system:executor", claim=action.fence, external_ref="re_1")
        finally:
            connection.close()

    threads = [threading.Thread(target=intake)]
    threads[0].start()
    assert locked.wait(10)
    threads.append(threading.Thread(target=settle))
    threads[1].start()
    time.sleep(0.5)
    assert threads[1].is_alive()  # waiting for the row the intake holds
    go.set()
    for thread in threads:
        thread.join(10)
    assert Action.objects.get(pk=action.pk).status == "succeeded"
    assert Action.objects.get(operation_key="k-2").status == "queued"
