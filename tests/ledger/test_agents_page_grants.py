"""The agents page shows every agent's grants with their live or shadow state in a fixed number
of statements, however many agents there are; a shadow grant wears the shadow badge."""

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from tests.factories import make_agent


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


def test_the_shadow_badge_has_a_style_of_its_own():
    with open("static/css/app.css") as css:
        assert ".badge--shadow {" in css.read()
