"""The overview's recent activity is people's and agents' work: the replay set's own actions
(its agent's requests, what the executor and the run made of them) are left out."""

import pytest
from django.contrib.auth import get_user_model

from ledger.actions import action_request
from ledger.replay import replay_agent
from tests.factories import make_agent

pytestmark = pytest.mark.django_db


def refund(agent, key, target="ORD-A1"):
    action_request(agent=agent, operation_key=key, action_type="refund", target=target, customer="",
                   params={"amount": "10.00", "currency": "EUR"})


def test_the_replay_sets_actions_do_not_fill_the_recent_activity(client):
    refund(make_agent("billing-bot")[0], "refund:ORD-A1:full:dec-1")
    for n in range(20):  # two per target, as the replay set's held cases are
        refund(replay_agent(), f"replay:1:case-{n}", target=f"REPLAY-1-{n // 2}")
    client.force_login(get_user_model().objects.create_superuser("root", password=None))

    page = client.get("/").content.decode()
    recent = page[page.index('id="recent-title"'):]
    assert "refund:ORD-A1:full:dec-1" in recent
    assert "replay:1:" not in recent and "agent:replay-set" not in recent
