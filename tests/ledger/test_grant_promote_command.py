"""`manage.py grant_promote AGENT ACTION_TYPE --by USER --reason ... [--review-days N]`: the
agents page's rules from the command line (a passing replay run of the connector as it is now,
four eyes, the change_agent permission, a reason), audited; a refusal changes nothing."""

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command
from django.utils import timezone

from ledger.connectors.test_mode import connector_version
from ledger.grants import grant_state
from ledger.models import Agent, Capability, Grant, GrantState, ReplayRun
from tests.factories import audit_events, make_agent

REFUND = Capability.Kind.ACTION_TYPE, "refund"


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


def test_unless_live_promotes_once_and_writes_nothing_while_the_grant_is_live(scout, passed_run, capsys):
    person("ada")
    for _ in range(3):  # make run, started three times
        promote("--by", "ada", "--reason", "the demo's grant, made live by make run", "--unless-live")
    assert state(scout) == GrantState.LIVE
    assert audit_events(scout, "promoted").count() == 1
    assert "scout's refund grant is live already: nothing promoted." in capsys.readouterr().out
