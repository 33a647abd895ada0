"""The replay set passes against a team's signed-HTTP service in its test mode, its faults staged
by the run's own fault proxy (the example receiver without its faults endpoint), or at the
faults endpoint the test mode names. Stripe's test mode is run against Stripe-compatible servers
written by others (tests/connectors/test_stripe_independent_servers.py); here only how the
environment configures it."""

import json
import os
import sqlite3
import subprocess
import threading

import pytest
from django.core.management import call_command

from examples.receiver.receiver import PATH, make_app, serve
from ledger.models import Action, ReplayRun
from ledger.replay import replay_key
from tests.conftest import PYTHON, ROOT

SECRET = "whsec-team-test-service"
CASES = ["clean_first_call", "retry_same_request", "timeout_after_commit", "webhook_twice", "same_key_other_params",
         "two_actions_same_object"]


def outcomes(run):
    return {c["case"]: c["outcome"] for c in run.cases}


@pytest.fixture
def receiver(tmp_path, settings):
    """The example receiver, serving its test mode, as the refund connector's test URL."""
    settings.CONNECTOR_TIMEOUT = 1

    def start(faults=False):
        """Started with its faults endpoint (`faults`, named as the test mode's) or without one."""
        database = str(tmp_path / "effects.sqlite3")
        server = serve(make_app(SECRET, database, test_mode=faults, stall_seconds=2))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_port}{PATH}"
        settings.SURETY_CONNECTORS = {**settings.SURETY_CONNECTORS, "refund": {
            "class": "ledger.connectors.signed_http.SignedHttpConnector",
            "options": {"url": "https://refunds.example.test/live", "secret": SECRET},
            "test_mode": {"options": {"url": url}, **({"faults_url": f"{url}/faults"} if faults else {})},
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


def timeout_case(run):
    return next(c for c in run.cases if c["case"] == "timeout_after_commit")["evidence"]


def test_replay_check_passes_against_the_example_receiver_without_its_faults_endpoint(db, receiver):
    database = receiver()  # POST <url>/faults answers 404 here: the run must not need it
    call_command("replay_check", "refund")

    run = ReplayRun.objects.get()
    assert [c["case"] for c in run.cases] == CASES
    assert outcomes(run) == {**dict.fromkeys(CASES, "passed"), "webhook_twice": "not_applicable"}, run.cases
    assert run.passed is True and run.connector == "http"
    timeout = Action.objects.get(operation_key=replay_key(run, "timeout"))
    assert timeout.attempts == 1 and any(e.get("code") == "timeout" for e in timeout.evidence)
    staged = timeout_case(run)["staged"]
    assert [(s["fault"], s["method"], s["upstream_status"]) for s in staged] == [("timeout_after_commit", "POST", 201)]
    assert "faults_url" not in timeout_case(run)
    # Each effect once at the test service, the live URL never called (it does not resolve).
    made = effects(database)
    assert sorted(made) == sorted(set(made))
    assert {replay_key(run, "clean"), replay_key(run, "timeout")} <= set(made)


def test_a_test_service_that_names_its_own_faults_endpoint_has_the_timeout_staged_there(db, receiver):
    database = receiver(faults=True)
    call_command("replay_check", "refund")

    run = ReplayRun.objects.get()
    assert run.passed is True, run.cases
    evidence = timeout_case(run)
    assert evidence["faults_url"].endswith("/faults") and evidence["staged"] == []  # the proxy staged nothing
    assert effects(database).count(replay_key(run, "timeout")) == 1


def test_stripes_test_mode_is_configured_from_the_environment():
    """STRIPE_TEST_API_KEY gives the Stripe connector a test mode: the sandbox's Stripe wire format
    while the sandbox is enabled, Stripe's own otherwise, never a faults URL (the run stages its
    faults itself); STRIPE_TEST_WEBHOOK_SECRET is its webhook secret."""
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
        "options": {"api_key": "sk_test_y", "api_base": "http://surety.test/sandbox/stripe"}}
    assert test_mode(STRIPE_TEST_API_KEY="sk_test_y", SANDBOX_ENABLED="false", STRIPE_TEST_WEBHOOK_SECRET="whsec_t") == {
        "options": {"api_key": "sk_test_y", "api_base": "", "webhook_secret": "whsec_t"}}
