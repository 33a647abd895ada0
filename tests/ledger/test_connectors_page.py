"""The connectors page (readiness per action type, the replay set's button) and promoting a
grant from the agents page: only admins act, the agent's owner never promotes, every answer
is said on the page."""

from datetime import timedelta

import pytest
import redis
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone
from rq import Queue

from ledger.connectors.test_mode import connector_version
from ledger.grants import grant_state
from ledger.models import Agent, Capability, GrantState, ReplayRun
from tests.conftest import REDIS_URL
from tests.factories import audit_events, make_agent

pytestmark = pytest.mark.django_db


def person(client, name, role):
    call_command("setup_roles", verbosity=0)
    user = get_user_model().objects.create(username=name)
    user.groups.add(Group.objects.get(name=role))
    client.force_login(user)
    return user


def test_the_page_shows_each_action_types_connector_and_whether_it_is_ready(client):
    person(client, "ada", "approvers")
    ReplayRun.objects.create(action_type="refund", connector="sandbox", ran_by="user:ada", passed=True,
                             connector_version=connector_version("refund"))
    ReplayRun.objects.create(action_type="send_message", connector="sandbox", ran_by="user:ada", passed=True,
                             connector_version="0" * 64)
    page = client.get(reverse("connectors"))
    assert page.status_code == 200
    rows = {row["action_type"]: row for row in page.context["rows"]}
    assert [bool(rows[t]["passing"]) for t in ("refund", "send_message", "create_booking")] == [True, False, False]
    assert rows["send_message"]["stale"]
    assert b"Run the replay set" not in page.content  # approvers do not run it


def test_the_button_records_a_run_and_hands_it_to_a_worker(client, jobs_to_test_redis, django_capture_on_commit_callbacks):
    person(client, "root", "admins")
    queue = Queue("default", connection=redis.Redis.from_url(REDIS_URL))
    queue.empty()
    with django_capture_on_commit_callbacks(execute=True):
        answer = client.post(reverse("replay-run-start", args=["refund"]))
    run = ReplayRun.objects.get()
    assert answer.status_code == 302 and answer["Location"] == reverse("replay-run", args=[run.pk])
    assert (run.ran_by, run.passed, run.connector) == ("user:root", None, "sandbox")
    assert [(job.func_name, job.args) for job in queue.jobs] == [("ledger.replay.replay_run_job", (run.pk,))]
    assert client.get(reverse("replay-run", args=[run.pk])).status_code == 200


def test_running_the_replay_set_needs_the_right_to_manage_agents(client):
    person(client, "ada", "approvers")
    assert client.post(reverse("replay-run-start", args=["refund"])).status_code == 403
    assert not ReplayRun.objects.exists()


def test_promoting_from_the_agents_page_is_refused_to_the_owner_and_done_by_another_admin(client):
    owner = person(client, "olga", "admins")
    agent = make_agent("scout", grants=("refund",), owner=owner, live=False)[0]
    ReplayRun.objects.create(action_type="refund", connector="sandbox", ran_by="user:root", passed=True,
                             connector_version=connector_version("refund"))
    review_by = f"{timezone.now() + timedelta(days=30):%Y-%m-%d}"
    form = {"action_type": "refund", "reason": "replay set passed", "review_by": review_by}
    url = reverse("agent-grant-promote", args=[agent.pk])

    refused = client.post(url, form, follow=True)
    assert "four eyes" in refused.content.decode()
    assert grant_state(Agent.objects.get(pk=agent.pk), Capability.Kind.ACTION_TYPE, "refund") == GrantState.SHADOW

    person(client, "root", "admins")
    done = client.post(url, form, follow=True)
    assert f"acts for real on refund until {review_by}" in done.content.decode()
    assert grant_state(Agent.objects.get(pk=agent.pk), Capability.Kind.ACTION_TYPE, "refund") == GrantState.LIVE
    assert audit_events(agent, "promoted").get().actor == "user:root"
    assert f"review by {review_by}" in done.content.decode()


def test_bad_input_is_said_on_the_page_and_changes_nothing(client):
    person(client, "root", "admins")
    agent = make_agent("scout", grants=("refund",), live=False)[0]
    no_type = client.post(reverse("replay-run-start", args=["teleport"]), follow=True)
    assert "&#x27;teleport&#x27; is not an action type" in no_type.content.decode()
    bad_date = client.post(reverse("agent-grant-promote", args=[agent.pk]),
                           {"action_type": "refund", "reason": "ok", "review_by": "next week"}, follow=True)
    assert "Choose an action type and a review date" in bad_date.content.decode()
    not_granted = client.post(reverse("agent-grant-promote", args=[agent.pk]),
                              {"action_type": "send_message", "reason": "ok"}, follow=True)
    assert "Not promoted" in not_granted.content.decode()
    assert not ReplayRun.objects.exists() and not audit_events(agent, "promoted").exists()


def test_a_runs_page_shows_every_case_with_its_outcome_and_evidence(client):
    person(client, "ada", "approvers")
    run = ReplayRun.objects.create(action_type="refund", connector="http", ran_by="user:root", passed=False, cases=[
        {"case": "clean_first_call", "outcome": "failed", "seconds": 0.1, "evidence": {"error": "connection refused"}},
        {"case": "webhook_twice", "outcome": "not_applicable", "evidence": {"reason": "sends no webhooks"}},
        {"case": "same_key_other_params", "outcome": "passed", "evidence": {"refused": "idempotency_key_reused"}},
    ])
    page = client.get(reverse("replay-run", args=[run.pk])).content.decode()
    assert "connection refused" in page and "not applicable" in page and "idempotency_key_reused" in page
