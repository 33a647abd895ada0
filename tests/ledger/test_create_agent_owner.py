"""`create_agent --owner USERNAME`: the person responsible for the agent, who must exist."""

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from ledger.models import Agent, AuditEvent

pytestmark = pytest.mark.django_db


def test_the_owner_is_recorded_and_audited(capsys):
    olga = get_user_model().objects.create(username="olga")
    call_command("create_agent", "my-bot", "--grant", "refund", "--owner", "olga")
    agent = Agent.objects.get(name="my-bot")
    assert agent.owner == olga
    out = capsys.readouterr().out.strip().splitlines()
    assert "owner olga" in out[0] and len(out[-1]) > 20  # the token alone on the last line
    assert AuditEvent.objects.get(verb="agent_created", object_id=str(agent.pk)).after["owner"] == "olga"


def test_an_unknown_owner_is_refused_and_nothing_is_written():
    events = AuditEvent.objects.count()
    with pytest.raises(CommandError, match="no user named 'nobody'"):
        call_command("create_agent", "my-bot", "--grant", "refund", "--owner", "nobody")
    assert not Agent.objects.filter(name="my-bot").exists()
    assert not get_user_model().objects.filter(username="agent-my-bot").exists()
    assert AuditEvent.objects.count() == events


def test_without_an_owner_the_agent_has_none_and_says_so(capsys):
    call_command("create_agent", "lone-bot")
    assert Agent.objects.get(name="lone-bot").owner is None
    assert "no owner" in capsys.readouterr().out
