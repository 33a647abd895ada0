"""The replay gate opens only on what it tested: a run executed with other settings than it was
started with fails; only the newest finished run of the connector's version counts, and only for
REPLAY_PASS_MAX_AGE_DAYS; no agent can record a run's keys before it; and a decision recorded in
shadow, which holds no effect, runs once the grant is live."""

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from ledger import replay
from ledger.actions import action_request
from ledger.connectors.test_mode import connector_version
from ledger.grants import GrantRefused, capability, grant_promote, passing_run
from ledger.models import Action, ActionStatus, Capability, ReplayRun
from tests.factories import make_agent, make_grants_live, message_body, post_action_in_process, refund_body

REFUND = Capability.Kind.ACTION_TYPE, "refund"


@pytest.fixture
def scout(db):
    """An agent owned by olga, its grants shadow; ada (not its owner) may promote them."""
    olga = get_user_model().objects.create_user("olga")
    return make_agent("scout", owner=olga, live=False)[0]


def finished_run(passed, *, ago, version=None):
    started = timezone.now() - ago
    return ReplayRun.objects.create(action_type="refund", connector="sandbox", ran_by="system:tests", passed=passed,
                                    connector_version=version or connector_version("refund"), started_at=started,
                                    finished_at=None if passed is None else started + timedelta(minutes=1))


# -- 1. the run is executed with the connector it was started for ----------------------------------

def test_a_run_executed_with_another_connector_than_it_was_started_for_fails_before_any_case(db, settings):
    """The console starts a run in the web process and a worker executes it with its own settings:
    a pass there would open the gate for the connector the web process has, never tested."""
    run = replay.replay_start("refund", actor="system:tests")  # the sandbox, as the web process has it
    started_for = run.connector_version
    settings.SURETY_CONNECTORS = {**settings.SURETY_CONNECTORS, "refund": {
        "class": "ledger.connectors.signed_http.SignedHttpConnector",
        "options": {"url": "https://refunds.example.test/", "secret": "s3cret"},
        "test_mode": {"options": {"url": "https://refunds.example.test/test"}}}}

    replay.replay_run(run)

    run.refresh_from_db()
    assert run.passed is False and run.finished_at is not None
    [case] = run.cases
    assert (case["case"], case["outcome"]) == ("connector_version", "failed")
    assert case["evidence"]["started_for"] == started_for
    assert case["evidence"]["running"] == connector_version("refund") != started_for
    assert not Action.objects.exists()


# -- 2 and 5. which run opens the gate -------------------------------------------------------------

def test_a_failure_after_a_pass_of_the_same_connector_shuts_the_gate(scout, settings):
    ada = get_user_model().objects.create_user("ada")
    finished_run(True, ago=timedelta(hours=2))
    finished_run(False, ago=timedelta(hours=1))

    assert passing_run("refund") is None
    with pytest.raises(GrantRefused, match="no replay run passed"):
        grant_promote(scout, capability(*REFUND), actor=ada, reason="it passed once")


def test_a_run_still_going_or_a_failure_of_another_version_leaves_the_newest_pass_standing(db):
    passed = finished_run(True, ago=timedelta(hours=3))
    finished_run(False, ago=timedelta(hours=2), version="another connector")
    finished_run(None, ago=timedelta(hours=1))  # started, no verdict yet
    assert passing_run("refund") == passed


def test_a_pass_older_than_replay_pass_max_age_days_opens_no_gate(scout, settings):
    ada = get_user_model().objects.create_user("ada")
    settings.REPLAY_PASS_MAX_AGE_DAYS = 30
    run = finished_run(True, ago=timedelta(days=31))
    assert passing_run("refund") is None
    with pytest.raises(GrantRefused, match="within 30 days"):
        grant_promote(scout, capability(*REFUND), actor=ada, reason="it passed a month ago")

    ReplayRun.objects.filter(pk=run.pk).update(started_at=timezone.now() - timedelta(days=29))
    assert passing_run("refund") == run
    grant_promote(scout, capability(*REFUND), actor=ada, reason="it passed this month")


# -- 3. a run's keys are its own ---------------------------------------------------------------------

def cases_of(run):
    return replay._Cases(run, replay.replay_agent(), None, None, None, "")


def test_an_agent_that_records_a_runs_next_keys_first_does_not_decide_its_cases(db):
    """Run ids are sequential: an agent that records `replay:<next id>:clean` must not hand the
    next run its own action (which then failed every run, or passed one on what it recorded)."""
    impostor = make_agent("billing")[0]
    run = replay.replay_start("refund", actor="system:tests")
    case = cases_of(run)
    request = case.request("clean")
    assert not request["operation_key"].startswith(f"replay:{run.pk}:clean")
    action_request(**{**request, "agent": impostor, "operation_key": f"replay:{run.pk}:clean", "target": "ORD-1"})

    action, created, claimed = case.record_and_claim(**request)
    assert created and claimed is not None and action.agent_id == case.agent.pk


def test_an_action_of_another_agents_under_a_runs_key_fails_the_case_saying_so(db):
    impostor = make_agent("billing")[0]
    case = cases_of(replay.replay_start("refund", actor="system:tests"))
    request = case.request("clean")
    planted = action_request(**{**request, "agent": impostor})[0]

    with pytest.raises(replay.CaseFailed, match="not the replay agent's") as failed:
        case.record_and_claim(**request)
    assert failed.value.evidence["action"]["operation_key"] == planted.operation_key
    assert Action.objects.get(pk=planted.pk).status == ActionStatus.QUEUED  # never claimed by the run


# -- 4. a decision recorded in shadow runs once the grant is live ------------------------------------

@pytest.mark.parametrize("body", [refund_body("ORD-5"), message_body("ada@example.com")], ids=["refund", "message"])
def test_a_decision_recorded_in_shadow_is_recorded_and_runs_once_the_grant_is_live(db, client, body):
    agent, token = make_agent("scout-2", live=False)
    client.defaults["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    shadow = post_action_in_process(client, "shadow-key", body)
    assert (shadow.status_code, shadow.json()["status"]) == (201, "shadow")

    make_grants_live(agent)
    live = post_action_in_process(client, "live-key", body)
    assert live.status_code == 201, live.json()
    assert live.headers.get("Idempotent-Replayed") != "true"
    assert live.json()["status"] != "shadow" and live.json()["operation_key"] == "live-key"
    # Once live, the decision holds one effect: asked again under a third key, the live one answers.
    again = post_action_in_process(client, "third-key", body)
    assert (again.status_code, again.json()["operation_key"]) == (200, "live-key")
    assert Action.objects.get(operation_key="shadow-key").status == ActionStatus.SHADOW
