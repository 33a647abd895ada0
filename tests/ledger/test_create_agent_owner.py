"""`create_agent --owner USERNAME`: the person responsible for the agent, who must exist."""

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from ledger.agents import agent_create
from ledger.models import Agent, AuditEvent
from tests.factories import make_action, make_agent

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


def test_without_an_owner_there_is_no_agent():
    """Every agent has an owner: agent_create refuses none, and the database would too (the
    column is NOT NULL); the command without --owner names the placeholder
    (test_create_agent_without_owner.py)."""
    with pytest.raises(ValueError, match="owner"):
        agent_create("lone-bot", actor="system:tests", owner=None)


def test_the_dashboard_names_the_owner_the_form_chose(client):
    people = get_user_model().objects
    ada, olga = people.create_superuser("ada", password=None), people.create_user("olga")
    client.force_login(ada)
    page = client.post("/agents/", {"name": "desk-bot", "grant": ["refund"], "owner": "olga"})
    assert page.status_code == 200 and Agent.objects.get(name="desk-bot").owner == olga
    client.post("/agents/", {"name": "ada-bot"})  # no owner named: the one who creates it
    assert Agent.objects.get(name="ada-bot").owner == ada


def test_the_dashboard_refuses_an_owner_who_is_no_person(client):
    ada = get_user_model().objects.create_superuser("ada", password=None)
    client.force_login(ada)
    client.post("/agents/", {"name": "x-bot"})
    agent = Agent.objects.get(name="x-bot")
    client.post("/agents/", {"name": "y-bot", "owner": agent.user.get_username()})  # an agent's own user
    assert not Agent.objects.filter(name="y-bot").exists()


def test_the_agents_and_action_pages_name_the_connector_of_each_type(client, settings):
    settings.SURETY_CONNECTORS = {**settings.SURETY_CONNECTORS,
                                  "send_message": {"class": "ledger.connectors.email.EmailConnector", "options": {}}}
    ada = get_user_model().objects.create_superuser("ada", password=None)
    client.force_login(ada)
    agents = client.get("/agents/").content.decode()
    assert 'refund → <span class="mono">sandbox</span>' in agents
    assert 'send message → <span class="mono">email</span>' in agents
    agent, _ = make_agent("billing")
    action = make_action(agent, "queued")
    assert '<a class="mono" id="connector" href="/connectors/">sandbox</a>' in client.get(
        f"/actions/{action.pk}/").content.decode()


def test_the_page_that_shows_a_token_is_kept_by_no_cache(client):
    """A new token moves money at once under the agent's live grants: the page showing it, on
    creation and on rotation, must not be kept by the browser's cache or a proxy's."""
    client.force_login(get_user_model().objects.create_superuser("ada", password=None))
    created = client.post("/agents/", {"name": "desk-bot", "grant": ["refund"]})
    agent = Agent.objects.get(name="desk-bot")
    rotated = client.post(f"/agents/{agent.pk}/rotate", {"reason": "a new laptop"})
    for page in (created, rotated):
        assert page.status_code == 200 and "no-store" in page["Cache-Control"]
