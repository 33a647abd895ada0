"""Refunds through Surety's API to Stripe-compatible servers written by others
(stripe-stateful-mock and localstripe, tests/connectors/stripe_servers.py), driven by the
official `stripe` SDK: real gunicorn, RQ workers, PostgreSQL and Redis. Faults are staged by
the FaultProxy between the workers and the server; each server's gaps are said where a test
leaves it out."""

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.core.management import CommandError, call_command

from dlq.reconcile import findings_in
from ledger.connectors.fault_proxy import FaultProxy
from ledger.connectors.stripe import StripeConnector
from ledger.models import Action, GrantState, ReplayRun, Task, WebhookEvent
from ledger.replay import replay_key
from tests.conftest import free_port, thread_server
from tests.connectors.stripe_servers import (  # noqa: F401 (fixtures)
    configured_refund_connector, production_stack, production_stripe_env, provider_app, provider_stack,
    stripe_provider, uses)
from tests.connectors.stripe_stack import API_KEY
from tests.connectors.test_stripe import settled
from tests.factories import (api_client, make_agent, post_action, post_task, refund_body, refund_task_body,
                             send_together)
from tests.factories import settled as settled_task
from tests.ledger.test_grant_promote_command import person, state
from tests.ledger.test_replay_check import GARBAGE

REPLAY_CASES = ["clean_first_call", "retry_same_request", "timeout_after_commit", "webhook_twice",
                "same_key_other_params", "two_actions_same_object"]


@pytest.fixture
def agent(provider_stack):
    """The billing agent's API client on the app calling the server; its token is `agent.token`."""
    _, token = make_agent("billing")
    client = api_client(provider_stack.url, token)
    client.token = token
    return client


def evidence_codes(key):
    return [(entry.get("code"), entry.get("found")) for entry in Action.objects.get(operation_key=key).evidence]


def test_a_refund_is_made_once_with_the_operation_key_in_its_metadata(provider_stack, stripe_provider, agent):
    charge = stripe_provider.charge(10000, "eur")
    provider_stack.start_worker()
    key = f"refund:{charge}:full:dec-1"
    assert post_action(agent, key, refund_body(charge, reason="late")).status_code == 201
    action = settled(agent, key)
    assert (action["status"], action["attempts"]) == ("succeeded", 1), action
    [refund] = stripe_provider.refunds(charge)
    assert (refund["id"], refund["amount"], refund["currency"]) == (action["external_ref"], 2500, "eur")
    assert refund["metadata"] == {"operation_key": key, "reason": "late"}


def test_a_refund_task_reads_the_charge_at_the_server_then_refunds_it_once(provider_stack, stripe_provider, agent):
    """The task's first step read the order from the sandbox whatever served refunds: against Stripe
    every refund task failed `unknown_order` before it refunded. It reads the charge through the
    refund's connector now, and an id the server does not know fails the task there."""
    charge = stripe_provider.charge(10000, "eur")
    provider_stack.start_worker()
    for task_id, order in (("t-stripe-1", charge), ("t-stripe-2", "ch_nobody_knows")):
        assert post_task(agent, task_id, refund_task_body(order)).status_code == 201
    done, unknown = (settled_task(Task.objects.get(task_id=task_id)) for task_id in ("t-stripe-1", "t-stripe-2"))

    assert done.state == "succeeded", done.last_error
    looked_up = done.steps.get(name="lookup_order").result
    assert (looked_up["order_id"], looked_up["amount"]) == (charge, "100.00")
    [refund] = stripe_provider.refunds(charge)
    assert refund["amount"] == 2500 and refund["metadata"]["operation_key"] == f"t-stripe-1:call_refund_api:v1"
    assert (unknown.state, unknown.last_error["code"]) == ("failed", "unknown_order")


def test_the_same_key_again_is_replayed_and_the_server_still_holds_one_refund(provider_stack, stripe_provider,
                                                                             agent):
    charge = stripe_provider.charge(10000, "eur")
    provider_stack.start_worker()
    key = f"refund:{charge}:full:dec-2"
    post_action(agent, key, refund_body(charge))
    done = settled(agent, key)
    again = post_action(agent, key, refund_body(charge))
    assert (again.status_code, again.headers.get("Idempotent-Replayed")) == (200, "true")
    assert again.json()["external_ref"] == done["external_ref"]
    assert [r["id"] for r in stripe_provider.refunds(charge)] == [done["external_ref"]]


def test_twenty_identical_posts_at_once_make_one_action_and_one_refund(provider_stack, stripe_provider, agent):
    charge = stripe_provider.charge(10000, "eur")
    provider_stack.start_worker()  # running while the copies still arrive
    key = f"refund:{charge}:full:dec-3"
    answers = send_together(provider_stack.url, agent.token,
                            [lambda client: post_action(client, key, refund_body(charge))] * 20)
    statuses = sorted(answer.status_code for answer in answers)
    assert statuses == [200] * 19 + [201], [a.text for a in answers if a.status_code not in (200, 201)][:3]
    assert all(a.headers.get("Idempotent-Replayed") == "true" for a in answers if a.status_code == 200)
    action = settled(agent, key)
    assert action["status"] == "succeeded" and Action.objects.filter(target=charge).count() == 1
    assert [r["id"] for r in stripe_provider.refunds(charge)] == [action["external_ref"]]


@pytest.mark.parametrize(("fault", "attempts", "verified"), [
    ("error_500_after_commit", 1, [True]),  # the refund is there: found, never sent again
    ("error_500_before_commit", 2, [False]),  # nothing there: verified absent, sent again
])
def test_a_500_after_or_before_the_server_committed_ends_with_one_refund(provider_stack, stripe_provider, agent,
                                                                         fault, attempts, verified):
    charge = stripe_provider.charge(10000, "eur")
    key = f"refund:{charge}:full:dec-4"
    with FaultProxy(stripe_provider.url) as proxy:
        proxy.arm(fault)
        provider_stack.start_worker(STRIPE_API_BASE=proxy.url)
        post_action(agent, key, refund_body(charge))
        action = settled(agent, key)
    assert (action["status"], action["attempts"]) == ("succeeded", attempts), action
    codes = evidence_codes(key)
    assert codes[0] == ("http_500", None) and [found for code, found in codes if found is not None] == verified
    assert [(s["fault"], s["method"]) for s in proxy.staged] == [(fault, "POST")]
    assert [r["id"] for r in stripe_provider.refunds(charge)] == [action["external_ref"]]


@pytest.mark.parametrize(("fault", "status", "refunds"), [
    # The first write made the refund: verification finds it, and nothing is written again.
    ("error_500_after_commit", "succeeded", 1),
    # No write ever arrives: each attempt is verified absent before the next, until the
    # executor's attempts run out; the action fails for a person (its dead letter) to decide.
    ("error_500_before_commit", "failed", 0),
])
def test_every_write_under_the_key_answering_500_never_makes_a_second_refund(provider_stack, stripe_provider, agent,
                                                                             settings, fault, status, refunds):
    charge = stripe_provider.charge(10000, "eur")
    key = f"refund:{charge}:full:dec-5"
    with FaultProxy(stripe_provider.url) as proxy:
        proxy.arm(fault, times=10)
        provider_stack.start_worker(STRIPE_API_BASE=proxy.url)
        post_action(agent, key, refund_body(charge))
        action = settled(agent, key, seconds=60)
    assert action["status"] == status, action
    assert len(stripe_provider.refunds(charge)) == refunds
    writes = len(proxy.staged)
    assert writes == (1 if refunds else settings.MAX_ATTEMPTS) and action["attempts"] == writes
    if status == "failed":
        assert action["error"]["code"] == "attempts_exhausted"
        assert [found for _, found in evidence_codes(key) if found is not None] == [False] * writes


# Only localstripe ignores Idempotency-Key; stripe-stateful-mock would replay the first answer.
@uses("localstripe")
def test_a_server_that_ignores_the_idempotency_key_still_gets_one_refund_per_key(provider_stack, stripe_provider,
                                                                                agent):
    charge = stripe_provider.charge(10000, "eur")
    sdk = stripe_provider.client()
    params = {"charge": charge, "amount": 100}
    first, second = (sdk.v1.refunds.create(params=params, options={"idempotency_key": "k"}) for _ in range(2))
    assert first.id != second.id  # the server makes a refund per request whatever the key
    key = f"refund:{charge}:full:dec-6"
    with FaultProxy(stripe_provider.url) as proxy:
        proxy.arm("error_500_after_commit", times=5)  # a blind retry would refund again
        provider_stack.start_worker(STRIPE_API_BASE=proxy.url)
        post_action(agent, key, refund_body(charge))
        action = settled(agent, key)
        assert post_action(agent, key, refund_body(charge)).status_code == 200
    assert action["status"] == "succeeded" and len(proxy.staged) == 1
    ours = [r for r in stripe_provider.refunds(charge) if r["metadata"].get("operation_key") == key]
    assert [r["id"] for r in ours] == [action["external_ref"]]


@pytest.mark.parametrize(("currency", "amount", "charged", "refunded"), [
    ("HUF", "5000", 1000000, 500000),  # two decimals at Stripe, whatever CLDR says
    ("ISK", "5000", 1000000, 500000),
    ("JPY", "1500", 3000, 1500),
    ("KWD", "1.250", 5000, 1250),  # three decimals
])
def test_amounts_reach_the_server_in_stripes_units(provider_stack, stripe_provider, agent, currency, amount, charged,
                                                   refunded):
    if currency.lower() in stripe_provider.currencies_missing:
        pytest.skip(f"{stripe_provider.name} knows no {currency} (localstripe covers it)")
    charge = stripe_provider.charge(charged, currency.lower())
    provider_stack.start_worker()
    key = f"refund:{charge}:partial:dec-7"
    post_action(agent, key, refund_body(charge, amount=amount, currency=currency))
    action = settled(agent, key)
    assert action["status"] == "succeeded", action
    [refund] = stripe_provider.refunds(charge)
    assert (refund["amount"], refund["currency"]) == (refunded, currency.lower())


# localstripe answers a refund list filtered by `created` with a 500: reconciliation cannot read it.
@uses("stripe-stateful-mock")
def test_reconciliation_reads_the_refunds_back_in_stripes_units_and_flags_one_a_hundredth_of_the_ledgers(
        provider_stack, stripe_provider, agent):
    """Stripe's units, not CLDR's digits: HUF has none in CLDR, two at Stripe. Reconciliation
    reads the server's refunds back by the same rule, and flags a refund a hundredth of the
    ledger's (what a connector counting HUF in CLDR's digits made of a ledger's 500,000 HUF)."""
    orders = {"JPY": (5000, "500", 500), "HUF": (900000, "5000", 500000)}  # charged, refunded, in Stripe's units
    charges = {stripe_provider.charge(charged, currency.lower()): currency
               for currency, (charged, _, _) in orders.items()}
    for n, (charge, currency) in enumerate(charges.items()):
        post_action(agent, f"refund:{charge}", refund_body(charge, amount=orders[currency][1], currency=currency,
                                                            customer=f"CUST-{n}"))
    provider_stack.start_worker()
    assert [settled(agent, f"refund:{charge}")["status"] for charge in charges] == ["succeeded"] * 2
    connector = StripeConnector(api_key=API_KEY, api_base=stripe_provider.url)
    now = datetime.now(UTC)

    def ours():  # the session's server holds other tests' refunds too
        return [r for r in connector.records(now - timedelta(minutes=5), now + timedelta(minutes=1))
                if r.raw["charge"] in charges]

    assert sorted((r.operation_key, r.amount, r.units, r.currency) for r in ours()) == sorted(
        (f"refund:{charge}", Decimal(orders[currency][1]), orders[currency][2], currency)
        for charge, currency in charges.items())
    assert findings_in(connector, ours()) == (2, [])

    huf = next(charge for charge, currency in charges.items() if currency == "HUF")
    Action.objects.filter(operation_key=f"refund:{huf}").update(amount=Decimal("500000"))
    _, [mismatch] = findings_in(connector, ours())
    assert (mismatch.kind, mismatch.operation_key) == ("amount_mismatch", f"refund:{huf}")
    assert (mismatch.effects[0]["units"], mismatch.ledger["amount"]) == (500000, "500000.000")


def test_the_replay_set_passes_with_the_server_as_stripes_test_mode_and_a_grant_is_promoted(
        production_stack, stripe_provider, settings, capsys):
    """One deployment's settings (a live key; the server as its test mode, with the test-mode
    endpoint's own webhook secret) in each process: this one, where the replay set runs; the web,
    where its webhook case posts a test-mode event, which a live key's connector verifies with
    the test secret alone; and the worker grant_promote asks which connector it runs, whose
    version the grant is bound to and the web checks it with."""
    settings.SITE_URL = production_stack.url  # the webhook case posts there
    settings.SURETY_CONNECTORS = {**settings.SURETY_CONNECTORS,
                                  "refund": configured_refund_connector(**production_stack.env)}
    scout, token = make_agent("scout", grants=("refund",), owner=person("olga"), live=False)
    person("ada")

    call_command("replay_check", "refund")
    run = ReplayRun.objects.get()
    assert {c["case"]: c["outcome"] for c in run.cases} == dict.fromkeys(REPLAY_CASES, "passed"), run.cases
    assert run.passed is True and run.connector == "stripe"
    for case in ("clean", "timeout"):
        action = Action.objects.get(operation_key=replay_key(run, case))
        assert action.target.startswith("ch_") and action.external_ref.startswith("re_")
        assert [(r["id"], r["metadata"]["operation_key"]) for r in stripe_provider.refunds(action.target)] == [
            (action.external_ref, action.operation_key)]
    timeout = next(c for c in run.cases if c["case"] == "timeout_after_commit")["evidence"]
    assert [s["path"] for s in timeout["staged"]] == ["/v1/refunds"]  # by the run's own proxy
    assert WebhookEvent.objects.filter(connector="stripe").count() == 1  # the webhook sent twice, stored once

    worker = production_stack.start_worker()
    call_command("grant_promote", "scout", "refund", "--by", "ada", "--reason", f"replay run {run.pk} passed")
    out = capsys.readouterr().out
    assert "Asking a worker which refund connector it runs" in out and "is not the one the workers run" not in out
    assert state(scout) == GrantState.LIVE
    # Live at the web too: its refund is queued, not recorded shadow. Nothing runs it (the live
    # API base is nowhere).
    production_stack.kill_worker(worker)
    answer = post_action(api_client(production_stack.url, token), "refund:ch_after:full:dec-1", refund_body("ch_after"))
    assert (answer.status_code, answer.json()["status"]) == (201, "queued"), answer.text


@pytest.fixture(params=["down", "garbage"])
def broken_test_mode(request):
    """A test-mode base URL where nothing listens, or where a server that is no Stripe answers
    every request with an HTML page; and what its evidence must show."""
    if request.param == "down":
        yield f"http://127.0.0.1:{free_port()}", "Connection refused"
    else:
        with thread_server(GARBAGE) as garbage:
            yield garbage.url, "It works!"


def test_a_test_mode_server_that_is_down_or_answers_garbage_fails_the_run_with_the_answer_and_nothing_is_promoted(
        db, settings, broken_test_mode):
    base, answer = broken_test_mode
    settings.SITE_URL = base  # never another server's
    settings.SURETY_CONNECTORS = {**settings.SURETY_CONNECTORS,
                                  "refund": configured_refund_connector(**production_stripe_env(base))}
    scout = make_agent("scout", grants=("refund",), owner=person("olga"), live=False)[0]
    person("ada")

    with pytest.raises(CommandError, match="failed"):
        call_command("replay_check", "refund")
    run = ReplayRun.objects.get()
    failed = [case for case in run.cases if case["outcome"] == "failed"]
    assert run.passed is False and failed
    assert answer in json.dumps([case["evidence"] for case in failed]), failed
    assert not Action.objects.filter(status="succeeded").exists()

    with pytest.raises(CommandError, match="no replay run passed"):
        call_command("grant_promote", "scout", "refund", "--by", "ada", "--reason", "try anyway")
    assert state(scout) == GrantState.SHADOW
