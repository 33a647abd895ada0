"""The replay set passes against each kind of connector in its test mode: a team's signed-HTTP
service (the example receiver in test mode, which arms the timeout-after-commit fault) and Stripe
(the sandbox's Stripe wire format: a charge made for the run, its webhook signed as Stripe signs);
a test service that cannot stage a fault fails the run with the evidence, and nothing is promoted."""

import json
import os
import sqlite3
import subprocess
import threading

import pytest
from django.core.management import CommandError, call_command

from examples.receiver.receiver import PATH, make_app, serve
from ledger.models import Action, ReplayRun, WebhookEvent
from tests.conftest import PYTHON, ROOT
from tests.connectors.stripe_stack import API_KEY, WEBHOOK_SECRET, stripe_client, stripe_server, stripe_stack  # noqa: F401
from tests.factories import api_client, sandbox_list

SECRET = "whsec-team-test-service"
CASES = ["clean_first_call", "retry_same_request", "timeout_after_commit", "webhook_twice", "same_key_other_params",
         "two_actions_same_object"]


def outcomes(run):
    return {c["case"]: c["outcome"] for c in run.cases}


@pytest.fixture
def receiver(tmp_path, settings):
    """The example receiver, serving its test mode, as the refund connector's test URL."""
    settings.CONNECTOR_TIMEOUT = 1

    def start(test_mode=True):
        database = str(tmp_path / "effects.sqlite3")
        server = serve(make_app(SECRET, database, test_mode=test_mode, stall_seconds=2))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_port}{PATH}"
        settings.SURETY_CONNECTORS = {**settings.SURETY_CONNECTORS, "refund": {
            "class": "ledger.connectors.signed_http.SignedHttpConnector",
            "options": {"url": "https://refunds.example.test/live", "secret": SECRET},
            "test_mode": {"options": {"url": url}},
        }}
        started.append(server)
        return database

    started = []
    yield start
    for server in started:
        server.shutdown()


def effects(database):
    with sqlite3.connect(database) as db:
        return [key for (key,) in db.execute("SELECT operation_key FROM effects")]


def test_replay_check_passes_against_a_teams_signed_http_test_service(db, receiver):
    database = receiver()
    call_command("replay_check", "refund")

    run = ReplayRun.objects.get()
    assert [c["case"] for c in run.cases] == CASES
    assert outcomes(run) == {**dict.fromkeys(CASES, "passed"), "webhook_twice": "not_applicable"}, run.cases
    assert run.passed is True and run.connector == "http"
    timeout = Action.objects.get(operation_key=f"replay:{run.pk}:timeout")
    assert timeout.attempts == 1 and any(e.get("code") == "timeout" for e in timeout.evidence)
    # Each effect once at the test service, the live URL never called (it does not resolve).
    made = effects(database)
    assert sorted(made) == sorted(set(made))
    assert {f"replay:{run.pk}:clean", f"replay:{run.pk}:timeout"} <= set(made)


def test_a_test_service_that_cannot_stage_the_fault_fails_the_run_with_the_evidence(db, receiver):
    receiver(test_mode=False)  # answers POST <url>/faults with 404: no test mode there
    with pytest.raises(CommandError, match="failed"):
        call_command("replay_check", "refund")

    run = ReplayRun.objects.get()
    assert run.passed is False and outcomes(run)["timeout_after_commit"] == "failed"
    timeout = next(c for c in run.cases if c["case"] == "timeout_after_commit")
    assert "/faults" in timeout["evidence"]["error"]
    assert (timeout["evidence"]["answer"]["status"], timeout["evidence"]["answer"]["code"]) == (404, "no_such_route")
    assert outcomes(run)["clean_first_call"] == "passed"


def test_replay_check_passes_against_stripe_in_the_sandboxs_stripe_wire_format(stripe_stack, settings):
    url = stripe_stack.url
    settings.SITE_URL = url  # the webhook case posts to this server's /webhooks/stripe/
    settings.SURETY_CONNECTORS = {**settings.SURETY_CONNECTORS, "refund": {
        "class": "ledger.connectors.stripe.StripeConnector",
        "options": {"api_key": API_KEY, "api_base": f"{url}/sandbox/stripe", "webhook_secret": WEBHOOK_SECRET},
        "test_mode": {"options": {}, "faults_url": f"{url}/sandbox/v1/faults"},
    }}
    call_command("replay_check", "refund")

    run = ReplayRun.objects.get()
    assert outcomes(run) == dict.fromkeys(CASES, "passed"), run.cases
    assert run.passed is True and run.connector == "stripe"
    clean = Action.objects.get(operation_key=f"replay:{run.pk}:clean")
    assert clean.target.startswith("ch_") and clean.external_ref.startswith("re_")
    refunds = stripe_client(url).v1.refunds.list(params={"charge": clean.target}).data
    assert [r.metadata["operation_key"] for r in refunds] == [clean.operation_key]
    provider = api_client(url, settings.SANDBOX_API_KEY)
    assert len(sandbox_list(provider, "refunds", operation_key=f"replay:{run.pk}:timeout")) == 1
    assert WebhookEvent.objects.filter(connector="stripe").count() == 1


def test_stripes_test_mode_is_configured_from_the_environment():
    """STRIPE_TEST_API_KEY gives the Stripe connector a test mode: the sandbox's Stripe wire format
    and its faults while the sandbox is enabled; Stripe's own (no faults to stage) otherwise."""
    def test_mode(**env):
        shown = subprocess.run(
            [PYTHON, "-c", "import json, django; django.setup(); from django.conf import settings; "
                           "print(json.dumps(settings.SURETY_CONNECTORS['refund'].get('test_mode')))"],
            cwd=ROOT, capture_output=True, text=True, timeout=60, env={
                **os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", "CONNECTOR_REFUND": "stripe",
                "STRIPE_API_KEY": "sk_live_x", "SANDBOX_BASE_URL": "http://surety.test/sandbox/v1", **env})
        assert shown.returncode == 0, shown.stderr
        return json.loads(shown.stdout)

    assert test_mode() is None
    assert test_mode(STRIPE_TEST_API_KEY="sk_test_y") == {
        "options": {"api_key": "sk_test_y", "api_base": "http://surety.test/sandbox/stripe"},
        "faults_url": "http://surety.test/sandbox/v1/faults"}
    assert test_mode(STRIPE_TEST_API_KEY="sk_test_y", SANDBOX_ENABLED="false") == {
        "options": {"api_key": "sk_test_y", "api_base": ""}, "faults_url": ""}
