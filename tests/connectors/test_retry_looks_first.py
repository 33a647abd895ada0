"""A failed refund tried again asks the provider first, against the Stripe-compatible servers
written by others (tests/connectors/stripe_servers.py): real gunicorn, RQ workers, PostgreSQL.

The case a review found: an attempt's outcome was unknown; the look could not tell, so a person
reviewed it and marked it failed ("confirmed absent") while the refund was in fact there (the
provider made it late, the person read the wrong page). Reconciliation saw the refund while the
action was in review, which is no finding, so no incident refuses its redrive. Redriven, a call
under the same key would refund again at a server that ignores the key (localstripe) or has
forgotten it (Stripe keeps keys a day): the refund here is made under no Idempotency-Key, as a
forgotten key leaves it."""

import pytest

from dlq.entries import deadletter_redrive
from dlq.models import DeadLetter
from ledger.models import Action
from tests.connectors.stripe_servers import provider_app, provider_stack, stripe_provider  # noqa: F401 (fixtures)
from tests.connectors.test_stripe import settled
from tests.connectors.test_stripe_independent_servers import agent  # noqa: F401 (fixture)
from tests.factories import confirmed_absent, person, post_action, refund_body


def failed_by_a_person(agent, key, charge):
    """The refund recorded, its attempt's outcome unknown, reviewed and marked failed by a person:
    the ledger's own moves, as the executor and the review page make them (no worker runs yet)."""
    assert post_action(agent, key, refund_body(charge)).status_code == 201
    action = confirmed_absent(Action.objects.get(operation_key=key))
    return DeadLetter.objects.get(action=action, status="open")


def test_a_redrive_finds_the_refund_a_person_confirmed_absent_and_makes_no_second(provider_stack, stripe_provider,
                                                                                 agent):
    charge = stripe_provider.charge(10000, "eur")
    key = f"refund:{charge}:full:dec-look-1"
    entry = failed_by_a_person(agent, key, charge)
    there = stripe_provider.client().v1.refunds.create(params={
        "charge": charge, "amount": 2500, "metadata": {"operation_key": key}})

    deadletter_redrive(entry, actor=person("olga", "operators"), reason="the customer still waits")
    provider_stack.start_worker()
    action = settled(agent, key)

    assert (action["status"], action["external_ref"], action["attempts"]) == ("succeeded", there.id, 2), action
    assert [refund["id"] for refund in stripe_provider.refunds(charge)] == [there.id]
    assert Action.objects.get(operation_key=key).evidence[-1]["found"] is True


def test_a_redrive_the_provider_confirms_absent_refunds_once(provider_stack, stripe_provider, agent):
    charge = stripe_provider.charge(10000, "eur")
    key = f"refund:{charge}:full:dec-look-2"
    entry = failed_by_a_person(agent, key, charge)

    deadletter_redrive(entry, actor=person("olga", "operators"), reason="the customer still waits")
    provider_stack.start_worker()
    action = settled(agent, key)

    assert (action["status"], action["attempts"]) == ("succeeded", 2), action
    [refund] = stripe_provider.refunds(charge)
    assert (refund["id"], refund["metadata"]["operation_key"]) == (action["external_ref"], key)
    # The look before the call is in the evidence of its outcome.
    assert Action.objects.get(operation_key=key).evidence[-1]["looked_first"]["found"] is False
