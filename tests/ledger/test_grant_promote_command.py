"""`manage.py grant_promote AGENT ACTION_TYPE --by USER --reason ... [--review-days N]`: the
agents page's rules from the command line (a passing replay run of the connector as it is now,
four eyes, the change_agent permission, a reason), audited; a refusal changes nothing. "The
connector as it is now" is the one the workers run, whatever the settings of the shell the
command runs in: a worker is asked (without Redis, the process that runs the jobs is this one)."""

import time
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command
from django.utils import timezone

from ledger.connectors.test_mode import connector_version
from ledger.grants import grant_state
from ledger.models import Action, ActionStatus, Agent, Capability, Grant, GrantState, ReplayRun
from tests.conftest import wait_until
from tests.factories import (api_client, audit_events, host_clock_off_by, make_agent, post_action, refund_body,
                             sandbox_list)

REFUND = Capability.Kind.ACTION_TYPE, "refund"


@pytest.fixture(autouse=True)
def jobs_in_this_process(request, settings):
    """The jobs run here, as without Redis: the worker asked which connector it runs is this
    process. The tests that go through Redis say so: `stack`, with its worker, and
    `jobs_to_test_redis`, where none listens."""
    if not {"stack", "jobs_to_test_redis"} & set(request.fixturenames):
        settings.RQ_ASYNC = False


def person(name, *, may_manage=True):
    user = get_user_model().objects.create_user(name)
    if may_manage:
        user.user_permissions.add(Permission.objects.get(content_type__app_label="ledger", codename="change_agent"))
    return user


@pytest.fixture
def scout(db):
    return make_agent("scout", grants=("refund",), owner=person("olga"), live=False)[0]


@pytest.fixture
def passed_run(db):
    return ReplayRun.objects.create(action_type="refund", connector="sandbox", ran_by="system:tests", passed=True,
                                    connector_version=connector_version("refund"))


def promote(*args):
    call_command("grant_promote", "scout", "refund", *args)


def state(agent):
    return grant_state(Agent.objects.get(pk=agent.pk), *REFUND)


def test_it_promotes_with_a_reason_and_a_review_date_audited(scout, passed_run, capsys):
    person("ada")
    promote("--by", "ada", "--reason", "the replay set passed", "--review-days", "30")

    assert state(scout) == GrantState.LIVE
    grant = Grant.objects.get(agent=scout, capability__name="refund", capability__kind="action_type")
    assert abs(grant.live_until - (timezone.now() + timedelta(days=30))) < timedelta(minutes=1)
    event = audit_events(scout, "promoted").get()
    assert (event.actor, event.reason, event.after["replay_run"]) == ("user:ada", "the replay set passed", passed_run.pk)
    assert "scout acts for real on refund until" in capsys.readouterr().out


@pytest.mark.parametrize(("args", "refusal"), [
    (("--by", "olga", "--reason", "mine"), "four eyes"),
    (("--by", "bert", "--reason", "ok"), "change_agent permission"),
    (("--by", "nobody", "--reason", "ok"), "no active user"),
    (("--by", "ada", "--reason", "  "), "a reason is required"),
    (("--by", "ada", "--reason", "ok", "--review-days", "400"), "at most 365 days"),
    (("--by", "ada", "--reason", "ok", "--review-days", "0"), "must be ahead"),
    (("--by", "ada", "--reason", "ok", "--review-days", "999999999"), "not promoted"),
])
def test_a_refused_promotion_says_why_and_changes_nothing(scout, passed_run, args, refusal):
    person("ada"), person("bert", may_manage=False)
    with pytest.raises(CommandError, match=refusal):
        promote(*args)
    assert state(scout) == GrantState.SHADOW
    assert not audit_events(scout, "promoted").exists()


def test_the_review_date_is_counted_on_the_database_clock_not_the_shells(scout, passed_run, monkeypatch):
    """The grant's review date is compared with the database's clock (Grant.state): counted from a
    shell whose host clock runs a minute ahead, `--review-days 0` was a date ahead, and promoted."""
    person("ada")
    host_clock_off_by(monkeypatch, 60)
    with pytest.raises(CommandError, match="must be ahead"):
        promote("--by", "ada", "--reason", "ok", "--review-days", "0")
    assert state(scout) == GrantState.SHADOW


def test_without_a_passing_replay_run_for_the_connector_as_it_is_now_it_is_refused(scout):
    person("ada")
    ReplayRun.objects.create(action_type="refund", connector="sandbox", ran_by="system:tests", passed=True,
                             connector_version="0" * 64)  # passed before the connector changed
    with pytest.raises(CommandError, match="no replay run passed"):
        promote("--by", "ada", "--reason", "ready")
    assert state(scout) == GrantState.SHADOW


def test_an_unknown_agent_is_refused(db):
    person("ada")
    with pytest.raises(CommandError, match="no agent named 'ghost'"):
        call_command("grant_promote", "ghost", "refund", "--by", "ada", "--reason", "ok")


def test_it_binds_the_grant_to_the_connector_the_workers_run_not_to_the_shells(stack, settings, capsys):
    """A shell without the deployment's settings (here its sandbox key: any option, or the code)
    computes another version of the connector, and a replay run made from it passed too. Bound
    to the shell's version, the grant was shadow to the web and the workers: what the agent asked
    was recorded shadow, or cancelled at its claim, never sent."""
    stack.start_worker()
    workers = connector_version("refund")  # the worker's settings are the stack's, as this process's so far
    ReplayRun.objects.create(action_type="refund", connector="sandbox", ran_by="user:ada", passed=True,
                             connector_version=workers, started_at=timezone.now() - timedelta(hours=1))
    settings.SANDBOX_API_KEY = "this-shells-own-key"
    shells = connector_version("refund")
    assert shells != workers
    ReplayRun.objects.create(action_type="refund", connector="sandbox", ran_by="system:replay_check", passed=True,
                             connector_version=shells)  # newer: run from the same shell
    scout, token = make_agent("scout", grants=("refund",), owner=person("olga"), live=False)
    person("ada")

    call_command("grant_promote", "scout", "refund", "--by", "ada", "--reason", "replay set passed", "--wait", "30")

    grant = Grant.objects.get(agent=scout, capability__name="refund", capability__kind="action_type")
    assert grant.connector_version == workers
    assert audit_events(scout, "promoted").get().after["connector_version"] == workers
    assert "is not the one the workers run" in capsys.readouterr().out
    client = api_client(stack.url, token)
    answer = post_action(client, "refund:ORD-W1:dec-1", refund_body("ORD-W1", customer="CUST-W1"))
    assert answer.json()["status"] == "queued", answer.text
    action = wait_until(lambda: (a := Action.objects.get(operation_key="refund:ORD-W1:dec-1")).status not in (
        ActionStatus.QUEUED, ActionStatus.PENDING) and a, message="the worker to run the refund")
    assert action.status == ActionStatus.SUCCEEDED
    assert len(sandbox_list(client, "refunds", order_id="ORD-W1")) == 1


def test_without_a_worker_to_ask_nothing_is_promoted(scout, passed_run, jobs_to_test_redis):
    person("ada")
    with pytest.raises(CommandError, match="no worker said within 0.5 s which refund connector it runs"):
        promote("--by", "ada", "--reason", "ready", "--wait", "0.5")
    assert state(scout) == GrantState.SHADOW
    assert not audit_events(scout, "promoted").exists()


def test_with_no_replay_run_passed_it_is_refused_at_once_without_asking_a_worker(scout, jobs_to_test_redis):
    person("ada")
    started = time.monotonic()
    with pytest.raises(CommandError, match="no replay run passed against the refund connector yet"):
        promote("--by", "ada", "--reason", "ready")  # no worker listens: asking one would wait 150 s
    assert time.monotonic() - started < 10
    assert state(scout) == GrantState.SHADOW
