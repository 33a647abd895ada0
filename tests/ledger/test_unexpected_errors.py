"""An error no connector was meant to raise (an answer of a shape it did not expect, a bug, a
connector that cannot be built) settles the action as the design says of an outcome nobody can
prove: a call that met it is `unknown`, to be verified; a verification that met it goes to a
person with the error as evidence, never round again after each lease. And a drain lane that
meets one in a run goes on with the next action."""

import time
from datetime import timedelta

import pytest
from django.db import OperationalError

from ledger import clock, executor, jobs
from ledger.actions import action_request
from ledger.connectors.base import Effect
from ledger.executor import action_claim_next, action_run_claimed, drain_actions
from ledger.models import Action
from tests.factories import audit_events

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("jobs_to_test_redis")]


class Unexpected:
    """A provider that answers 200 with what the connector cannot read: its code fails on it."""

    name = "unexpected"

    def perform(self, action):
        return Effect(external_ref={}["id"], result={})

    def find_effect(self, action):
        return {}["data"]


def requested(agent, key, target):
    action, _ = action_request(agent=agent, operation_key=key, action_type="refund", target=target,
                               params={"amount": "5.00", "currency": "EUR"})
    return action


def unknown(agent, key, target):
    """An action whose call timed out, due for verification now."""
    action = action_claim_next("tests:1", only=requested(agent, key, target).pk)
    return action.mark_unknown(actor="system:tests", claim=action.fence, evidence={"call": "timeout"},
                               verify_at=clock.now() - timedelta(seconds=1))


def test_a_verification_that_fails_unexpectedly_goes_to_a_person_with_the_error(agent, monkeypatch):
    """Before, the KeyError escaped: the action stayed `unknown`, was claimed again after each
    lease, failed the same way each time and recorded nothing."""
    action = unknown(agent, "refund:ORD-U1:full:dec-1", "ORD-U1")
    monkeypatch.setattr(executor, "connector_for_action", lambda action: Unexpected())

    action_run_claimed(action_claim_next("tests:2", only=action.pk))

    row = Action.objects.get(pk=action.pk)
    assert row.status == "needs_review" and row.lease_owner == ""
    assert row.evidence[-1]["found"] is None
    assert row.evidence[-1]["verification"] == {"error": "KeyError", "message": "'data'"}
    [event] = audit_events(row, "needs_review")
    assert event.reason == "the look-up at the provider failed unexpectedly (KeyError)"


def test_a_connector_that_cannot_be_built_for_a_verification_goes_to_a_person(agent, monkeypatch):
    action = unknown(agent, "refund:ORD-U2:full:dec-1", "ORD-U2")

    def unbuildable(action):
        raise TypeError("SandboxConnector.__init__() got an unexpected keyword argument 'region'")

    monkeypatch.setattr(executor, "connector_for_action", unbuildable)
    action_run_claimed(action_claim_next("tests:2", only=action.pk))

    row = Action.objects.get(pk=action.pk)
    assert row.status == "needs_review" and row.evidence[-1]["verification"]["error"] == "TypeError"


def test_a_call_that_fails_unexpectedly_is_unknown_and_verified_once_no_call_can_be_in_flight(
        agent, monkeypatch, settings, caplog):
    """The provider may have acted before the connector tripped on its answer: never queued
    again blindly, but verified, as a timeout is, and only CONNECTOR_TIMEOUT after the call."""
    action = action_claim_next("tests:1", only=requested(agent, "refund:ORD-U3:full:dec-1", "ORD-U3").pk)
    monkeypatch.setattr(executor, "connector_for_action", lambda action: Unexpected())

    claim, before = action.fence, clock.now()
    action_run_claimed(action)

    row = Action.objects.get(pk=action.pk)
    assert row.status == "unknown" and row.attempts == 1 and row.fence > claim  # a late write of the call is stale
    assert row.evidence[-1]["error"] == "KeyError" and row.evidence[-1]["message"] == "'id'"
    assert row.next_attempt_at >= before + timedelta(seconds=settings.CONNECTOR_TIMEOUT)
    [event] = audit_events(row, "outcome_unknown")
    assert event.reason == "the call failed unexpectedly (KeyError)"
    assert "Traceback" in caplog.text and "KeyError: 'id'" in caplog.text


class DatabaseGone(Unexpected):
    """A connector whose call meets the database's error (one that reads it, a replay's check)."""

    def perform(self, action):
        raise OperationalError("server closed the connection unexpectedly")


def unbuildable(action):
    raise TypeError("SandboxConnector.__init__() got an unexpected keyword argument 'region'")


@pytest.mark.parametrize("connector, raised",
                         [(unbuildable, TypeError), (lambda action: DatabaseGone(), OperationalError)], ids=["no connector: nothing sent", "the database's error: handed back"])
def test_a_call_that_never_reached_the_provider_is_not_settled_as_unknown(agent, monkeypatch, connector, raised):
    """Neither is the provider's doing: a connector that cannot be built sent nothing, and the
    database's error is the drain's to hand back (ledger.jobs). The claim stands until its lease
    lapses; settling either as unknown would send a person an outcome nobody is unsure of."""
    action = action_claim_next("tests:1", only=requested(agent, "refund:ORD-U5:full:dec-1", "ORD-U5").pk)
    monkeypatch.setattr(executor, "connector_for_action", connector)
    with pytest.raises(raised):
        action_run_claimed(action)
    row = Action.objects.get(pk=action.pk)
    assert (row.status, row.fence, len(row.evidence or [])) == ("pending", action.fence, 0)
    assert not audit_events(row, "outcome_unknown").exists()


class Provider:
    def perform(self, action):
        return Effect(external_ref=f"re_{action.target}", result={})


def test_a_lane_that_meets_an_unexpected_error_in_one_run_goes_on_with_the_next(agent, monkeypatch, settings, caplog):
    """The run that failed keeps its claim until its lease lapses: the lane does not take it
    again at once, and the other action is carried out. (Before, the error ended the lane, and
    with several lanes failed the whole job.)"""
    settings.DRAIN_LANES = 1
    broken = requested(agent, "refund:ORD-U4:full:dec-1", "ORD-U4")
    other = requested(agent, "refund:ORD-U5:full:dec-1", "ORD-U5")
    runs = []

    def run_claimed(action):
        runs.append(action.pk)
        if action.pk == broken.pk:
            raise RuntimeError("a bug after the claim")
        return action_run_claimed(action)

    monkeypatch.setattr(executor, "action_run_claimed", run_claimed)
    monkeypatch.setattr(executor, "connector_for_action", lambda action: Provider())
    monkeypatch.setattr(jobs, "DRAIN_SECONDS", 5)

    started = time.monotonic()
    assert drain_actions() == 2
    assert time.monotonic() - started < 5  # it ended for want of work, not at the deadline

    assert sorted(runs) == sorted([broken.pk, other.pk])
    assert Action.objects.get(pk=other.pk).status == "succeeded"
    left = Action.objects.get(pk=broken.pk)
    assert left.status == "pending" and left.lease_expires_at > clock.now()  # the sweeper's, once it lapses
    assert "RuntimeError: a bug after the claim" in caplog.text


class NoReference:
    """A provider that carried the effect out and named no reference for it (an empty id)."""

    def perform(self, action):
        return Effect(external_ref="", result={"status": "done"})

    def find_effect(self, action):
        from ledger.connectors.base import Lookup

        return Lookup(found=True, result={"status": "done"})


@pytest.mark.parametrize("path", ["call", "verification"])
def test_an_effect_the_provider_named_no_reference_for_succeeds_under_its_key(agent, monkeypatch, path):
    """A succeeded action must have a reference (the database holds it): the settle failed on an
    empty one after the effect, the action stayed pending, then unknown, and every verification
    after it failed the same way. As a webhook's settle does, the operation key stands in."""
    key = f"refund:ORD-U6-{path}:full:dec-1"
    action = (unknown(agent, key, f"ORD-U6-{path}") if path == "verification"
              else requested(agent, key, f"ORD-U6-{path}"))
    monkeypatch.setattr(executor, "connector_for_action", lambda action: NoReference())
    action_run_claimed(action_claim_next("tests:2", only=action.pk))
    row = Action.objects.get(pk=action.pk)
    assert (row.status, row.external_ref) == ("succeeded", key)
