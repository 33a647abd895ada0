"""The agents page shows every agent's grants with their live or shadow state in a fixed number
of statements, however many agents there are; a shadow grant wears the shadow badge."""

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from ledger.connectors.test_mode import connector_version
from ledger.grants import grant_state
from ledger.models import Grant, GrantState, ReplayRun
from tests.factories import make_agent, make_grants_live


@pytest.fixture
def admin_client(client, db):
    call_command("setup_roles", verbosity=0)
    user = get_user_model().objects.create(username="ada")
    user.groups.add(Group.objects.get(name="admins"))
    client.force_login(user)
    return client


def statements_of_the_page(client):
    with CaptureQueriesContext(connection) as page:
        answer = client.get(reverse("agent-list"))
    assert answer.status_code == 200
    return len(page.captured_queries), answer.content.decode()


def test_the_grant_states_cost_the_same_statements_for_two_agents_as_for_six(admin_client):
    make_agent("live-1"), make_agent("shadow-1", live=False)
    two, html_two = statements_of_the_page(admin_client)
    for n in range(2, 6):
        make_agent(f"more-{n}", live=n % 2 == 0)
    six, html = statements_of_the_page(admin_client)

    assert six == two, (two, six)
    shadow = 'badge badge--shadow" title="recorded, never executed">shadow<'
    # Each agent's grants as on the first page: three agents with shadow grants now, one then.
    assert html.count('class="grant-states"') == 3 * html_two.count('class="grant-states"') > 0
    assert html.count(shadow) == 3 * html_two.count(shadow) > 0


def test_the_page_shows_each_grant_in_the_state_the_checks_give_it(admin_client):
    """The page reads every grant in one go, the checks one by one (ledger.grants): both by one
    rule, so a grant the page shows live is one the executor acts on, and a shadow one is not."""
    mixed = make_agent("mixed", grants=("refund", "send_message", "create_booking", "noop"), live=False)[0]
    make_grants_live(mixed)
    Grant.objects.filter(agent=mixed, capability__name="send_message").update(connector_version="an older one")
    Grant.objects.filter(agent=mixed, capability__name="create_booking").update(
        live_until=timezone.now() - timedelta(days=1))
    rowless = make_agent("rowless", grants=("refund",))[0]
    Grant.objects.filter(agent=rowless).delete()

    shown = {agent.name: agent for agent in admin_client.get(reverse("agent-list")).context["agents"]}
    for agent in shown.values():
        assert [state for _, state, _ in agent.grants_shown] == [
            grant_state(agent, cap.kind, cap.name) for cap, _, _ in agent.grants_shown], agent.name
    # "refund" names an action type and a workflow: the agents hold both.
    assert {(cap.kind, cap.name): state for cap, state, _ in shown["mixed"].grants_shown} == {
        ("action_type", "refund"): "live", ("workflow", "refund"): "live", ("action_type", "send_message"): "shadow",
        ("action_type", "create_booking"): "shadow", ("workflow", "noop"): "live"}
    assert {(cap.kind, state) for cap, state, _ in shown["rowless"].grants_shown} == {
        ("action_type", "shadow"), ("workflow", "live")}


def test_the_shadow_badge_has_a_style_of_its_own():
    with open("static/css/app.css") as css:
        assert ".badge--shadow {" in css.read()



@pytest.fixture
def shadow_scout(db):
    """An agent with a shadow refund grant whose connector passed the replay set as it is now."""
    ReplayRun.objects.create(action_type="refund", connector="sandbox", ran_by="system:tests", passed=True,
                             connector_version=connector_version("refund"))
    return make_agent("scout", grants=("refund",), live=False)[0]


def promote(client, agent, review_by):
    return client.post(reverse("agent-grant-promote", args=[agent.pk]), follow=True,
                       data={"action_type": "refund", "review_by": review_by, "reason": "the replay set passed"})


def test_a_promotion_with_an_empty_review_date_says_the_default_date_rather_than_a_500(admin_client, shadow_scout):
    answer = promote(admin_client, shadow_scout, "")

    assert answer.status_code == 200
    grant = shadow_scout.grant_states.get(capability__kind="action_type", capability__name="refund")
    assert f"scout acts for real on refund until {grant.live_until:%Y-%m-%d}." in answer.content.decode()
    assert grant_state(shadow_scout, "action_type", "refund") == GrantState.LIVE


def test_a_review_date_in_the_past_is_a_form_error_and_nothing_is_promoted(admin_client, shadow_scout):
    answer = promote(admin_client, shadow_scout, "2001-01-01")

    assert answer.status_code == 200
    assert "Not promoted: the review date must be ahead" in answer.content.decode()
    assert grant_state(shadow_scout, "action_type", "refund") == GrantState.SHADOW


def test_a_workflow_grant_says_it_needs_no_review_date(admin_client):
    make_agent("flow-bot", grants=("noop",), live=False)
    _, html = statements_of_the_page(admin_client)
    grants = html[html.index('id="grants-'):]
    assert "noop" in grants and "live once given, no review date needed" in grants
