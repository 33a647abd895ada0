"""`manage.py incident` (`make incident`) on the live test stack: gunicorn with its sandbox and a
real RQ worker, the command run as its own process as `make incident` runs it, and the agent's
runs as processes of their own, SIGKILLed after their call. The sandbox's own listing of the
order's refunds is the check, not the command's word."""

import re
import socket
import subprocess
import time

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.core.management.base import CommandError

from ledger.connectors.test_mode import connector_version
from ledger.models import Action, ActionStatus, Agent, Grant, ReplayRun
from tests.conftest import PYTHON, ROOT
from tests.factories import api_client, audit_events, make_agent, sandbox_list


def incident(stack, seconds=120, **env):
    """The command as `make incident` runs it, with the stack's own settings (`env` over them) and
    the test database, given at most `seconds`."""
    return subprocess.run([PYTHON, "manage.py", "incident", "--url", stack.url], cwd=ROOT,
                          env={**stack.env, **env}, capture_output=True, text=True, timeout=seconds)


@pytest.fixture
def demo_people(stack):
    """The demo's owner (olga) and a person who may promote grants (ada), as `make run` seeds them."""
    get_user_model().objects.create_user("olga")
    ada = get_user_model().objects.create_user("ada")
    ada.user_permissions.add(Permission.objects.get(content_type__app_label="ledger", codename="change_agent"))


def sandbox_refunds(stack, order):
    with api_client(stack.url, settings.SANDBOX_API_KEY) as sandbox:
        return sandbox_list(sandbox, "refunds", order_id=order)


def test_it_refunds_three_times_without_a_ledger_and_once_through_surety(stack, demo_people):
    stack.start_worker()
    ReplayRun.objects.create(action_type="refund", connector="sandbox", ran_by="system:tests", passed=True,
                             connector_version=connector_version("refund"))

    ran = incident(stack)

    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "One decision: 3 refunds without a ledger, 1 refund through Surety." in ran.stdout
    per_run = re.findall(r"after run \d\s+(\d)  re_\w+\s+(\d)  re_\w+ \((recorded now|already recorded)\)", ran.stdout)
    assert per_run == [("1", "1", "recorded now"), ("2", "1", "already recorded"), ("3", "1", "already recorded")]
    order = re.search(r"on (ORD-INC-\w+);", ran.stdout)[1]
    action = Action.objects.get(target=order)
    refunds = sandbox_refunds(stack, order)
    assert sorted(r["operation_key"] for r in refunds) == ["", "", "", action.operation_key]
    assert (action.status, action.attempts) == (ActionStatus.SUCCEEDED, 1)
    assert action.external_ref == next(r["id"] for r in refunds if r["operation_key"])
    assert f"status succeeded, attempts 1, external_ref {action.external_ref}" in ran.stdout
    assert re.search(r"UTC  requested +agent:incident-bot\n.*UTC  claimed .*\n.*UTC  succeeded ", ran.stdout)
    assert f"dashboard: {stack.url}/actions/{action.pk}/" in ran.stdout


def test_it_reuses_its_agent_with_a_new_token(stack, demo_people):
    stack.start_worker()
    agent, old_token = make_agent("incident-bot", grants=("refund",))  # live: no replay run is needed

    ran = incident(stack)

    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "One decision: 3 refunds without a ledger, 1 refund through Surety." in ran.stdout
    assert Action.objects.get().agent == agent
    assert audit_events(agent, "token_rotated").count() == 1
    with api_client(stack.url, old_token) as api:
        assert api.get("/api/v1/actions/any").status_code == 401


def test_it_promotes_on_the_connector_the_workers_run_not_on_its_shells(stack, demo_people, settings):
    """`make run` started with a setting the connector's version reads (here the sandbox key) that
    the shell of `make incident` lacks, and a replay run passed from that shell too: bound to the
    shell's version, the grant was shadow to the web app and the workers, and no refund went
    through Surety."""
    stack.start_worker()
    workers = connector_version("refund")
    ReplayRun.objects.create(action_type="refund", connector="sandbox", ran_by="system:tests", passed=True,
                             connector_version=workers)
    settings.SANDBOX_API_KEY = "this-shells-own-key"
    shells = connector_version("refund")
    assert shells != workers
    ReplayRun.objects.create(action_type="refund", connector="sandbox", ran_by="system:replay_check", passed=True,
                             connector_version=shells)  # newer: run from the same shell

    ran = incident(stack, SANDBOX_API_KEY="this-shells-own-key")

    grant = Grant.objects.get(agent__name="incident-bot", capability__name="refund")
    assert grant.connector_version == workers
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "One decision: 3 refunds without a ledger, 1 refund through Surety." in ran.stdout


def test_it_refuses_with_the_reason_when_the_refund_grant_cannot_go_live(stack, demo_people):
    stack.start_worker()  # asked which connector it runs
    ran = incident(stack)  # no replay run passed: the grant stays shadow, nothing is asked of the sandbox

    assert ran.returncode == 1
    assert "incident-bot's refund grant is shadow and cannot go live: no replay run passed" in ran.stderr
    assert not Agent.objects.filter(name="incident-bot").exists()  # refused whole, as the transaction was
    assert not Action.objects.exists()


def test_with_no_worker_running_it_says_so_at_once(stack, demo_people):
    """`make run`'s workers down, its web app up: it waited two and a half minutes for a worker to say
    which refund connector it runs, then said that none had."""
    ReplayRun.objects.create(action_type="refund", connector="sandbox", ran_by="system:tests", passed=True,
                             connector_version=connector_version("refund"))
    started = time.monotonic()

    ran = incident(stack, seconds=60)

    assert time.monotonic() - started < 30  # a worker starting with the stack is given 10 s to register
    assert ran.returncode == 1
    assert "no RQ worker is running on this Redis" in ran.stderr and "is `make run` running" in ran.stderr
    assert not Agent.objects.filter(name="incident-bot").exists()


@pytest.mark.django_db
def test_a_stack_that_does_not_answer_is_said_before_any_grant_is_looked_at():
    """`make run PORT=8001`, then `make incident` on the default port: said as such, not as a
    refund grant that no replay run lets go live (the sandbox at another URL is another connector)."""
    get_user_model().objects.create_user("olga")
    get_user_model().objects.create_user("ada")
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{free.getsockname()[1]}"  # nothing listens once it is closed

    with pytest.raises(CommandError) as refused:
        call_command("incident", "--url", url)

    assert f"this deployment's web app does not answer at {url}: is `make run` running?" in str(refused.value)
    assert "the PORT it was given" in str(refused.value) and "replay" not in str(refused.value)
    assert not Agent.objects.filter(name="incident-bot").exists()
