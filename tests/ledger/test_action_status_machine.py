"""The action status machine, exhaustively: every pair of statuses is either in the table
below and works (one audit event), or is refused and changes nothing. The table is written
out here, not read from the product: a transition added to ACTION_TRANSITIONS by mistake
(held -> pending: an effect without the person's decision) must fail a test."""

import itertools
from datetime import timedelta

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from ledger.models import ACTION_TRANSITIONS, Action, ActionStatus, AuditEvent, InvalidTransition, StaleClaim
from tests.factories import audit_events, make_action, make_agent, required_in

S = ActionStatus
EXPECTED = {
    "queued": {"pending", "held", "cancelled", "awaiting_approval"},  # its params are not the approved ones
    "awaiting_approval": {"queued", "held", "rejected", "cancelled", "expired", "superseded"},
    "held": {"queued", "awaiting_approval", "rejected", "cancelled"},
    "pending": {"succeeded", "failed", "unknown", "queued", "needs_review"},
    "unknown": {"succeeded", "failed", "queued", "needs_review"},
    "needs_review": {"succeeded", "failed", "queued", "unknown"},
    "failed": {"queued", "held", "awaiting_approval"},
    "succeeded": set(),
    "rejected": set(),
    "cancelled": set(),
    "shadow": set(),  # recorded under a shadow grant, never executed: nothing makes it pending
    "expired": set(),  # nobody decided in time: final, and not a rejection
    "superseded": set(),  # edited into a new version, which runs instead
}
ALL_PAIRS = list(itertools.product(S.values, S.values))
ALLOWED = [(a, b) for a, b in ALL_PAIRS if b in EXPECTED[a]]
REFUSED = [(a, b) for a, b in ALL_PAIRS if b not in EXPECTED[a]]


def test_the_product_has_exactly_this_table():
    assert {str(a): {str(b) for b in to} for a, to in ACTION_TRANSITIONS.items()} == EXPECTED


def pair_id(pair):
    return f"{pair[0]}->{pair[1]}"


@pytest.fixture
def agent(db):
    return make_agent("billing", grants=())[0]


def test_the_table_names_every_status_and_only_statuses():
    assert set(ACTION_TRANSITIONS) == set(S.values)
    assert all(targets <= set(S.values) for targets in ACTION_TRANSITIONS.values())
    assert len(ALLOWED) + len(REFUSED) == len(S.values) ** 2


def test_final_statuses_lead_nowhere():
    assert ACTION_TRANSITIONS[S.SUCCEEDED] == ACTION_TRANSITIONS[S.REJECTED] == ACTION_TRANSITIONS[S.CANCELLED] == set()
    assert ACTION_TRANSITIONS[S.EXPIRED] == ACTION_TRANSITIONS[S.SUPERSEDED] == set()


@pytest.mark.parametrize("pair", REFUSED, ids=pair_id)
def test_a_transition_not_in_the_table_is_refused_and_changes_nothing(agent, pair):
    source, target = pair
    action = make_action(agent, source)
    row_before = Action.objects.values().get(pk=action.pk)
    events_before = AuditEvent.objects.count()

    with pytest.raises(InvalidTransition):
        action._move(target, actor="system:tests", verb="test", external_ref="re_new")

    assert Action.objects.values().get(pk=action.pk) == row_before
    assert AuditEvent.objects.count() == events_before
    assert action.status == source


@pytest.mark.parametrize("pair", ALLOWED, ids=pair_id)
def test_a_transition_in_the_table_works_and_writes_exactly_one_audit_event(agent, pair):
    source, target = pair
    action = make_action(agent, source)
    events_before = AuditEvent.objects.filter(object_type="ledger.action").count()
    action._move(target, actor="system:tests", verb="test", reason="exhaustive", **required_in(target))

    assert Action.objects.get(pk=action.pk).status == target
    assert action.status == target
    [event] = audit_events(action)  # others may follow it (a review item opening), never about this row
    assert AuditEvent.objects.filter(object_type="ledger.action").count() == events_before + 1
    assert (event.actor, event.verb, event.reason) == ("system:tests", "test", "exhaustive")
    assert (event.before["status"], event.after["status"]) == (source, target)
    if target == S.SUPERSEDED:  # the database wants its version by the end of the transaction
        make_action(agent, S.QUEUED, key=action.operation_key + "~v2", supersedes=action)


@pytest.mark.parametrize(("status", "missing"), [
    (S.QUEUED, "next_attempt_at"), (S.UNKNOWN, "next_attempt_at"), (S.PENDING, "lease_expires_at"),
])
def test_the_database_refuses_a_row_no_worker_or_sweeper_would_ever_find(agent, status, missing):
    with pytest.raises(IntegrityError), transaction.atomic():
        make_action(agent, status, **{missing: None})
    assert not Action.objects.exists()


def test_a_failed_action_that_is_not_retryable_cannot_be_requeued(agent):
    action = make_action(agent, S.FAILED, retryable=False)
    row_before = Action.objects.values().get(pk=action.pk)

    with pytest.raises(InvalidTransition):
        action.requeue(actor="user:ops", reason="try again")

    assert Action.objects.values().get(pk=action.pk) == row_before
    assert not audit_events(action).exists()


def test_a_failed_action_that_is_retryable_can_be_requeued(agent):
    action = make_action(agent, S.FAILED, retryable=True)
    action.requeue(actor="user:ops", reason="the provider is back")
    action.refresh_from_db()
    assert action.status == S.QUEUED
    assert action.next_attempt_at is not None
    assert audit_events(action).get().reason == "the provider is back"


def test_a_succeeded_action_cannot_be_marked_failed(agent):
    action = make_action(agent, S.SUCCEEDED)
    with pytest.raises(InvalidTransition):
        action.mark_failed(actor="system:tests", code="late", message="too late", retryable=False)
    assert Action.objects.get(pk=action.pk).status == S.SUCCEEDED


def test_a_claim_takes_a_lease_and_bumps_the_fence(agent):
    action = make_action(agent, S.QUEUED, fence=4)
    action.claim(owner="host:1")
    row = Action.objects.get(pk=action.pk)
    assert (row.status, row.fence, row.attempts, row.lease_owner) == (S.PENDING, 5, 1, "host:1")
    assert row.lease_expires_at > timezone.now()


def test_a_stale_claim_is_refused_and_changes_nothing(agent):
    action = make_action(agent, S.PENDING, fence=2, lease_owner="host:new",
                         lease_expires_at=timezone.now() + timedelta(seconds=30))
    row_before = Action.objects.values().get(pk=action.pk)

    with pytest.raises(StaleClaim):
        action.mark_succeeded(actor="system:executor", external_ref="re_late", claim=1)
    with pytest.raises(StaleClaim):
        action.mark_failed(actor="system:executor", code="x", message="x", retryable=False, claim=1)
    with pytest.raises(StaleClaim):
        action.requeue(actor="system:executor", reason="x", claim=1)

    assert Action.objects.values().get(pk=action.pk) == row_before
    assert not audit_events(action).exists()


def test_the_current_claim_may_write_its_outcome(agent):
    action = make_action(agent, S.PENDING, fence=2)
    action.mark_succeeded(actor="system:executor", external_ref="re_1", result={"id": "re_1"}, claim=2)
    row = Action.objects.get(pk=action.pk)
    assert (row.status, row.external_ref, row.lease_owner, row.lease_expires_at) == (S.SUCCEEDED, "re_1", "", None)
