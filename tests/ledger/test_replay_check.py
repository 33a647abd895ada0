"""`manage.py replay_check <action type>`: the replay set run against the connector's test mode,
every run and case kept, passing for every action type against the sandbox on a fresh database;
a test mode that is down or answers garbage, or a SITE_URL that is another server, ends the run
failed with the evidence and promotes nothing."""


import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from ledger.actions import action_request
from ledger.agents import agent_create, agent_rotate_token
from ledger.connectors.test_mode import connector_for_action, connector_version, is_replay_action
from ledger.grants import GrantRefused, capability, grant_promote, grant_state
from ledger.models import Action, ActionStatus, Agent, Capability, GrantState, ReplayRun, WebhookEvent
from ledger.replay import replay_agent, replay_check, replay_key
from tests.conftest import answering, free_port, thread_server
from tests.factories import api_client, make_agent, sandbox_list
from tests.ledger.test_site_url import NotSurety

CASES = ["clean_first_call", "retry_same_request", "timeout_after_commit", "webhook_twice", "same_key_other_params",
         "two_actions_same_object"]


def test_replay_check_refund_against_the_sandbox_passes_and_keeps_six_cases(stack, settings):
    settings.SITE_URL = stack.url  # where the webhook case delivers its event
    stack.start_worker()  # workers may run: the replay's actions are this process's own

    call_command("replay_check", "refund")

    run = ReplayRun.objects.get()
    assert [c["case"] for c in run.cases] == CASES
    assert [c["outcome"] for c in run.cases] == ["passed"] * 6, run.cases
    assert run.passed is True and run.finished_at is not None
    assert (run.action_type, run.connector, run.ran_by) == ("refund", "sandbox", "system:replay_check")
    assert run.connector_version == connector_version("refund")
    client = api_client(stack.url, settings.SANDBOX_API_KEY)
    clean = replay_key(run, "clean")
    assert len(sandbox_list(client, "refunds", operation_key=clean)) == 1
    assert len(sandbox_list(client, "refunds", operation_key=replay_key(run, "timeout"))) == 1
    assert Action.objects.get(operation_key=replay_key(run, "timeout")).attempts == 1
    assert WebhookEvent.objects.filter(connector="sandbox").count() == 1
    # Nothing of the run is left waiting for a person or a worker.
    assert not Action.objects.filter(status__in=[ActionStatus.QUEUED, ActionStatus.HELD]).exists()
    # The timeout was staged in front of the sandbox, not by the sandbox's own faults.
    timeout = next(c for c in run.cases if c["case"] == "timeout_after_commit")["evidence"]
    assert [(s["fault"], s["method"], s["upstream_status"]) for s in timeout["staged"]] == [
        ("timeout_after_commit", "POST", 201)]
    assert timeout["lookup"]["matches"] == [timeout["action"]["external_ref"]]


@pytest.mark.parametrize("action_type", ["send_message", "create_booking"])
def test_replay_check_passes_for_every_action_type_against_the_sandbox(stack, settings, action_type):
    settings.SITE_URL = stack.url
    call_command("replay_check", action_type)

    run = ReplayRun.objects.get()
    assert [c["outcome"] for c in run.cases] == ["passed"] * 6, run.cases
    assert run.passed is True
    same_object = next(c for c in run.cases if c["case"] == "two_actions_same_object")["evidence"]
    if action_type == "create_booking":  # the slot's second booking refused at intake, the first made
        assert [a["status"] for a in same_object["actions"]] == ["succeeded"]
        assert [r["refused"] for r in same_object["refused"]] == ["booking_conflict"]
    else:  # two messages to one recipient: both held for a person, then cancelled with the run
        assert [a["status"] for a in same_object["actions"]] == ["held", "held"] and not same_object["refused"]
    resource = {"send_message": "messages", "create_booking": "bookings"}[action_type]
    client = api_client(stack.url, settings.SANDBOX_API_KEY)
    for case in ("clean", "timeout"):
        assert len(sandbox_list(client, resource, operation_key=replay_key(run, case))) == 1


def test_a_site_url_that_is_another_server_fails_the_webhook_case_before_any_event_is_sent(stack, settings):
    with thread_server(NotSurety) as other:
        settings.SITE_URL = other.url
        with pytest.raises(CommandError, match="failed"):
            call_command("replay_check", "refund")

    run = ReplayRun.objects.get()
    webhook = next(c for c in run.cases if c["case"] == "webhook_twice")
    assert webhook["outcome"] == "failed" and run.passed is False
    assert webhook["evidence"]["error"].startswith(f"SITE_URL {other.url} does not reach this deployment")
    assert not WebhookEvent.objects.exists()
    assert {c["outcome"] for c in run.cases if c["case"] != "webhook_twice"} == {"passed"}


@pytest.fixture
def refunds_to_nowhere(settings):
    """Refunds go to a team's service over signed HTTP whose test URL is a port where nothing listens."""
    url = f"http://127.0.0.1:{free_port()}/refunds"
    settings.SURETY_CONNECTORS = {**settings.SURETY_CONNECTORS, "refund": {
        "class": "ledger.connectors.signed_http.SignedHttpConnector", "options": {"url": url, "secret": "s3cret"},
        "test_mode": {"options": {"url": url}},
    }}
    return url


def test_a_replay_run_against_a_test_mode_that_is_down_ends_failed_with_the_answer(db, refunds_to_nowhere):
    with pytest.raises(CommandError, match="failed"):
        call_command("replay_check", "refund")

    run = ReplayRun.objects.get()
    assert run.passed is False and run.finished_at is not None
    assert (run.connector, run.connector_options["options"]) == ("http", {"url": refunds_to_nowhere, "secret": "•••"})
    [case] = run.cases  # before any case: nothing was recorded
    assert case["case"] == "test_mode" and refunds_to_nowhere in case["evidence"]["error"]
    assert (case["evidence"]["answer"]["error"], case["evidence"]["answer"]["code"]) == ("NotSent", "connect_failed")
    assert not Action.objects.exists()


# A test URL that answers every request 200 with an HTML page.
GARBAGE = answering(b"<html><body>It works!</body></html>")


def test_a_replay_run_against_a_test_mode_that_answers_garbage_fails_every_case_with_the_answer(db, settings):
    settings.CONNECTOR_TIMEOUT = 1
    with thread_server(GARBAGE) as garbage:
        settings.SURETY_CONNECTORS = {**settings.SURETY_CONNECTORS, "refund": {
            "class": "ledger.connectors.signed_http.SignedHttpConnector",
            "options": {"url": "https://refunds.example.test/live", "secret": "s3cret"},
            "test_mode": {"options": {"url": garbage.url}},
        }}
        with pytest.raises(CommandError, match="failed"):
            call_command("replay_check", "refund")

    run = ReplayRun.objects.get()
    outcomes = {c["case"]: c["outcome"] for c in run.cases}
    assert run.passed is False and outcomes["clean_first_call"] == "failed"
    assert {outcome for case, outcome in outcomes.items() if case != "webhook_twice"} == {"failed"}
    clean = next(c for c in run.cases if c["case"] == "clean_first_call")["evidence"]
    assert clean["action"]["status"] == "needs_review"  # never taken for a success
    assert "It works!" in clean["action"]["evidence"][0]["message"]
    assert not Action.objects.filter(status=ActionStatus.SUCCEEDED).exists()


def test_a_failed_run_promotes_nothing_and_the_gate_stays_shut(db, refunds_to_nowhere):
    owner, ada = (get_user_model().objects.create_user(name) for name in ("olga", "ada"))
    agent = make_agent("scout", owner=owner, live=False)[0]
    with pytest.raises(CommandError):
        call_command("replay_check", "refund")

    assert grant_state(agent, Capability.Kind.ACTION_TYPE, "refund") == GrantState.SHADOW
    with pytest.raises(GrantRefused, match="no replay run passed"):
        grant_promote(agent, capability(Capability.Kind.ACTION_TYPE, "refund"), actor=ada, reason="try")


def test_an_action_type_without_a_test_mode_ends_failed_and_says_why(db, settings):
    settings.SURETY_CONNECTORS = {**settings.SURETY_CONNECTORS, "refund": {
        "class": "ledger.connectors.signed_http.SignedHttpConnector",
        "options": {"url": "https://refunds.example.test/", "secret": "s3cret"}}}
    with pytest.raises(CommandError):
        call_command("replay_check", "refund")
    [case] = ReplayRun.objects.get().cases
    assert case["case"] == "test_mode" and "has no test mode" in case["evidence"]["error"]


def test_a_connector_that_cannot_be_asked_ends_failed_and_says_so_with_a_test_mode_or_without(db, settings):
    """The e-mail connector: SMTP keeps nothing to ask, so no case could pass against it. Without a
    test mode the run said to configure one (none can be configured for it: it takes no options);
    with one written by hand, three cases failed on "cannot tell" and the reason was left to guess."""
    for entry in ({}, {"test_mode": {"options": {}}}):
        settings.SURETY_CONNECTORS = {**settings.SURETY_CONNECTORS, "send_message": {
            "class": "ledger.connectors.email.EmailConnector", "options": {}, **entry}}
        run = replay_check("send_message", actor="system:tests")
        [case] = run.cases
        assert not run.passed and case["case"] == "test_mode"
        assert "cannot be asked whether an effect was made" in case["evidence"]["error"]


def test_nobody_else_may_take_the_replay_agents_name(db):
    """Its actions under replay keys skip the grant checks at the claim and go to the test
    connector: an agent of a person's under that name, with a token in their hands, would be
    adopted by the next replay run."""
    with pytest.raises(CommandError, match="the name of the replay set's own agent"):
        call_command("create_agent", "replay-set", "--owner", get_user_model().objects.create_user("ada").username)
    assert not Agent.objects.filter(name="replay-set").exists()
    with pytest.raises(ValueError, match="only its"):
        agent_create("billing", actor="system:tests", owner=get_user_model().objects.get(username="ada"),
                     replay_set=True)
    assert replay_agent().owner.get_username() == "replay-set-owner"


def test_an_agent_a_person_made_under_the_name_before_it_was_reserved_is_not_adopted_nor_treated_as_it(db):
    """Made before the name was reserved (a deployed database may hold one): no replay run adopts
    it, and its replay-keyed actions are its own, checked at the claim as any agent's are."""
    impostor, _ = make_agent("billing")
    Agent.objects.filter(pk=impostor.pk).update(name="replay-set")
    with pytest.raises(ValueError, match="exists that is not the replay set's"):
        replay_agent()
    action = action_request(agent=Agent.objects.get(pk=impostor.pk), operation_key="replay:9:clean",
                            action_type="refund", target="ORD-9", params={"amount": "5.00", "currency": "EUR"})[0]
    assert not is_replay_action(action)


def test_nobody_is_given_a_token_of_the_replay_sets_agent(db):
    agent = replay_agent()
    with pytest.raises(ValueError, match="has no token anyone holds"):
        agent_rotate_token(agent, actor=get_user_model().objects.create_user("ada"), reason="curious")
    assert Agent.objects.get(pk=agent.pk).token_hash == agent.token_hash


def test_only_the_replay_agents_actions_go_to_the_test_mode(db, settings):
    settings.SURETY_CONNECTORS = {**settings.SURETY_CONNECTORS, "refund": {
        "class": "ledger.connectors.signed_http.SignedHttpConnector",
        "options": {"url": "https://refunds.example.test/live", "secret": "s3cret"},
        "test_mode": {"options": {"url": "https://refunds.example.test/test"}},
    }}
    request = dict(action_type="refund", target="ORD-1", params={"amount": "5.00", "currency": "EUR"})
    impostor = action_request(agent=make_agent("billing")[0], operation_key="replay:1:clean", **request)[0]
    replayed = action_request(agent=replay_agent(), operation_key="replay:2:clean", **{**request, "target": "ORD-2"})[0]
    assert connector_for_action(impostor).url == "https://refunds.example.test/live"
    assert connector_for_action(replayed).url == "https://refunds.example.test/test"
