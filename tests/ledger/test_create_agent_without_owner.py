"""`create_agent NAME [--grant NAME]…` as the contract writes it: without `--owner` the agent
belongs to the placeholder the agents page flags, and the command warns that four eyes then
keep nobody from deciding its requests."""

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from ledger.models import UNASSIGNED_OWNER, Agent

pytestmark = pytest.mark.django_db


def test_without_an_owner_the_agent_belongs_to_the_placeholder_and_the_command_warns(capsys):
    call_command("create_agent", "my-bot", "--grant", "refund")
    agent = Agent.objects.select_related("owner").get(name="my-bot")
    placeholder = agent.owner
    assert placeholder.get_username() == UNASSIGNED_OWNER
    assert not placeholder.is_active and not placeholder.has_usable_password()  # nobody signs in as it
    # Four eyes keep only the owner and who was shown the token (nobody: a command) from deciding.
    person = get_user_model().objects.create_user("olga")
    assert agent.token_issued_by is None and not agent.answers_for(person)
    out, err = capsys.readouterr()
    assert len(out.strip().splitlines()[-1]) > 20  # the token, alone on the last line
    assert "No --owner" in err and "four eyes keep nobody from deciding its requests" in err

    call_command("create_agent", "other-bot")  # the same placeholder, not a second one
    assert Agent.objects.get(name="other-bot").owner == placeholder


def test_a_refused_name_without_an_owner_writes_nothing():
    with pytest.raises(CommandError, match="a name is"):
        call_command("create_agent", "not a slug")
    assert not Agent.objects.exists()
    assert not get_user_model().objects.filter(username=UNASSIGNED_OWNER).exists()


def test_with_an_owner_there_is_no_warning(capsys):
    get_user_model().objects.create_user("olga")
    call_command("create_agent", "my-bot", "--owner", "olga")
    assert Agent.objects.get(name="my-bot").owner.get_username() == "olga"
    assert capsys.readouterr().err == ""
