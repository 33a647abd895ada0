"""Grants are shadow until the replay set passes: a shadow grant's actions are recorded and
answered `shadow`, never executed; a person other than the agent's owner promotes a grant
live, only with a passing replay run for the connector as it is now; past the review date
it is shadow again; a revoke is immediate."""

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from approvals.models import Limit
from console.sweeper import sweep_once
from ledger.actions import action_request
from ledger.agents import agent_rotate_token
from ledger import clock
from ledger.connectors.base import Connector
from ledger.connectors import test_mode
from ledger.connectors.test_mode import connector_version
from ledger.executor import action_claim_next
from ledger.grants import GrantRefused, agent_grant, agent_revoke, capability, grant_promote, grant_state
from ledger.models import (Action, ActionStatus, Agent, AuditEvent, Capability, Grant, GrantState, InvalidTransition,
                           ReplayRun)
from tests.factories import (
    another_transaction, api_client, audit_events, make_agent, make_agent_on, make_grants_live, post_action, post_action_in_process, refund_body, sandbox_list,
)

REFUND = Capability.Kind.ACTION_TYPE, "refund"


@pytest.fixture
def olga(db):
    return get_user_model().objects.create_user("olga")


@pytest.fixture
def ada(db):
    return get_user_model().objects.create_user("ada")


@pytest.fixture
def scout(olga):
    """An agent owned by olga, its grants shadow as every new agent's are."""
    return make_agent("scout", owner=olga, live=False)[0]


def passed_run(action_type="refund", version=None):
    return ReplayRun.objects.create(action_type=action_type, connector="sandbox", ran_by="system:tests", passed=True,
                                    connector_version=version or connector_version(action_type))


def fresh(agent):
    return Agent.objects.get(pk=agent.pk)


def test_a_new_agents_grant_is_shadow(scout):
    assert grant_state(scout, *REFUND) == GrantState.SHADOW


def test_a_shadow_grants_action_is_recorded_and_answered_shadow_and_never_reaches_the_provider(stack):
    agent, token = make_agent("scout", live=False)
    client = api_client(stack.url, token)
    stack.start_worker()

    posted = post_action(client, "refund:ORD-9:full:dec-9", refund_body("ORD-9"))
    assert posted.status_code == 201, posted.text
    assert posted.json()["status"] == "shadow"
    again = post_action(client, "refund:ORD-9:full:dec-9", refund_body("ORD-9"))
    assert (again.status_code, again.headers["Idempotent-Replayed"], again.json()["status"]) == (200, "true", "shadow")
    sweep_once()
    time.sleep(2)  # the worker had its chance

    action = Action.objects.get(operation_key="refund:ORD-9:full:dec-9")
    assert (action.status, action.attempts, action.fingerprint != "") == (ActionStatus.SHADOW, 0, True)
    assert client.get("/api/v1/actions/refund:ORD-9:full:dec-9").json()["status"] == "shadow"
    assert sandbox_list(client, "refunds", order_id="ORD-9") == []
    assert audit_events(action, "requested").get().reason == "requested under a shadow grant: recorded, never executed"


def test_a_shadow_action_can_never_be_claimed_or_made_pending(scout):
    action, _ = action_request(agent=scout, operation_key="k-1", action_type="refund", target="ORD-1",
                               params={"amount": "5.00", "currency": "EUR"}, shadow=True)
    assert action.status == ActionStatus.SHADOW and action.next_attempt_at is None
    assert action_claim_next("host:1", only=action.pk) is None
    with pytest.raises(InvalidTransition):
        action.claim(owner="host:1")
    assert Action.objects.get(pk=action.pk).status == ActionStatus.SHADOW


def test_promotion_by_the_agents_owner_is_refused(scout, olga):
    passed_run()
    with pytest.raises(GrantRefused, match="four eyes"):
        grant_promote(scout, capability(*REFUND), actor=olga, reason="looks fine")
    assert grant_state(fresh(scout), *REFUND) == GrantState.SHADOW
    assert not audit_events(scout, "promoted").exists()


def test_promotion_by_who_was_shown_the_agents_token_is_refused(scout, ada):
    """They can act as the agent: making its grant live would be letting themselves move money."""
    passed_run()
    agent_rotate_token(scout, actor=ada, reason="lost")
    with pytest.raises(GrantRefused, match="four eyes"):
        grant_promote(fresh(scout), capability(*REFUND), actor=ada, reason="ready")
    assert grant_state(fresh(scout), *REFUND) == GrantState.SHADOW


def test_promotion_without_a_passing_replay_run_for_the_connector_as_it_is_now_is_refused(scout, ada):
    ReplayRun.objects.create(action_type="refund", connector="sandbox", ran_by="system:tests", passed=False,
                             connector_version=connector_version("refund"))
    passed_run(version="0" * 64)  # passed, but against the connector as it was before a change
    with pytest.raises(GrantRefused, match="no replay run passed"):
        grant_promote(scout, capability(*REFUND), actor=ada, reason="ready")
    assert grant_state(fresh(scout), *REFUND) == GrantState.SHADOW


def test_promotion_needs_a_reason_and_a_review_date_ahead(scout, ada):
    passed_run()
    with pytest.raises(GrantRefused, match="reason"):
        grant_promote(scout, capability(*REFUND), actor=ada, reason=" ")
    with pytest.raises(GrantRefused, match="review date"):
        grant_promote(scout, capability(*REFUND), actor=ada, reason="ready", review_by=clock.now())
    assert not audit_events(scout, "promoted").exists()


def test_promotion_is_audited_and_makes_the_next_request_execute(client, scout, ada):
    run = passed_run()
    review_by = timezone.now() + timedelta(days=30)
    version_before = fresh(scout).grants_version
    grant_promote(scout, capability(*REFUND), actor=ada, reason="replay set passed", review_by=review_by)

    scout = fresh(scout)
    assert scout.grants_version == version_before + 1
    assert grant_state(scout, *REFUND) == GrantState.LIVE
    event = audit_events(scout, "promoted").get()
    assert (event.actor, event.reason) == ("user:ada", "replay set passed")
    assert event.before["state"] == "shadow"
    assert (event.after["state"], event.after["replay_run"]) == ("live", run.pk)
    grant = Grant.objects.get(agent=scout, capability=capability(*REFUND))
    assert (grant.promoted_by, grant.live_until) == (ada, review_by)


def test_a_grant_is_shadow_again_once_its_connector_changes_until_promoted_against_the_new_one(scout, ada,
                                                                                             settings):
    """Promoted against the connector as it was; its options changed since (here the sandbox's key),
    what was queued is never executed and the agents page says shadow, until the replay set passes
    against the connector as it is now and a person promotes the grant again."""
    passed_run()
    grant_promote(scout, capability(*REFUND), actor=ada, reason="replay set passed")
    queued, _ = action_request(agent=fresh(scout), operation_key="refund:ORD-V1", action_type="refund",
                               target="ORD-V1", params={"amount": "5.00", "currency": "EUR"})
    assert grant_state(fresh(scout), *REFUND) == GrantState.LIVE and queued.status == ActionStatus.QUEUED

    settings.SANDBOX_API_KEY = "sk_sandbox_rotated"
    assert grant_state(fresh(scout), *REFUND) == GrantState.SHADOW
    assert action_claim_next("tests:worker", only=queued.pk) is None
    assert Action.objects.get(pk=queued.pk).status == ActionStatus.CANCELLED
    grant = Grant.objects.get(agent=scout, capability=capability(*REFUND))
    assert grant.state(connector_version("refund")) == GrantState.SHADOW

    passed_run()  # against the connector as it is now
    grant_promote(fresh(scout), capability(*REFUND), actor=ada, reason="passed again after the key's rotation")
    assert grant_state(fresh(scout), *REFUND) == GrantState.LIVE


@pytest.mark.django_db(transaction=True)
def test_a_promotion_that_waited_on_a_revoke_is_refused_and_leaves_no_live_grant(scout, ada):
    """The revoke commits while the promotion waits for it: checked before, the promotion wrote its
    grant live after the revoke had deleted it, and the agent's next grant found that row live."""
    passed_run()

    def revoke():
        agent_revoke(fresh(scout), capability(*REFUND), actor="system:tests", reason="not this agent")

    with another_transaction(revoke, commit_when_waited_on=True) as other:
        with pytest.raises(GrantRefused, match="holds no grant"):
            grant_promote(fresh(scout), capability(*REFUND), actor=ada, reason="ready")
    assert other.waited
    assert not Grant.objects.filter(agent=scout, capability=capability(*REFUND)).exists()
    agent_grant(fresh(scout), capability(*REFUND), actor="system:tests", reason="again, in shadow")
    assert grant_state(fresh(scout), *REFUND) == GrantState.SHADOW


def test_past_its_review_date_a_grant_is_shadow_again(db, client):
    agent = make_agent_on(client, "scout", grants=("refund",))
    review_by = timezone.now() + timedelta(seconds=1)
    make_grants_live(agent, until=review_by)
    before = post_action_in_process(client, "refund:ORD-4", refund_body("ORD-4"))
    assert before.json()["status"] != "shadow"  # the grant check is cached from here on

    time.sleep(max(0, (review_by - timezone.now()).total_seconds()) + 0.1)
    after = post_action_in_process(client, "refund:ORD-5", refund_body("ORD-5", customer="CUST-18"))
    assert after.status_code == 201, after.content
    assert after.json()["status"] == "shadow"
    assert grant_state(fresh(agent), *REFUND) == GrantState.SHADOW


def test_a_revoke_is_immediate(db, client):
    agent = make_agent_on(client, "scout", grants=("refund",))
    first = post_action_in_process(client, "k-6", refund_body("ORD-6"))
    assert first.status_code == 201 and first.json()["status"] != "shadow"

    agent_revoke(agent, capability(*REFUND), actor="system:tests", reason="done")
    second = post_action_in_process(client, "k-7", refund_body("ORD-7"))
    assert second.status_code == 403
    assert not Grant.objects.filter(agent=agent, capability=capability(*REFUND)).exists()
    assert audit_events(agent, "revoked").get().before == {"capability": "action type refund", "state": "live"}


def test_a_shadow_action_counts_nothing_toward_a_customers_daily_total(scout):
    Limit.limit_set(actor="system:tests", reason="the tests' policy",
                    action_type="refund", currency="EUR", max_amount=Decimal("500.00"),
                    dual_approval_above=Decimal("5000.00"), daily_customer_total=Decimal("600.00"))
    live = make_agent("billing", grants=("refund",))[0]
    params = {"amount": "400.00", "currency": "EUR"}
    action_request(agent=scout, operation_key="k-1", action_type="refund", target="ORD-1", customer="CUST-1",
                   params=params, shadow=True)
    real, _ = action_request(agent=live, operation_key="k-2", action_type="refund", target="ORD-2", customer="CUST-1",
                             params=params)
    assert real.status == ActionStatus.QUEUED  # 400.00 today, not 800.00: the shadow refund never happened


@pytest.mark.parametrize(("change", "grants"), [(agent_grant, ()), (agent_revoke, ("refund",))])
def test_a_grant_or_a_revoke_without_a_reason_is_refused_changes_nothing_and_the_page_says_so(db, client, change,
                                                                                              grants):
    agent, _ = make_agent("scout", grants=grants)
    root = get_user_model().objects.create_superuser("root", password="x")

    def state():
        return (list(Grant.objects.filter(agent=agent).values_list("capability_id", "live_until")),
                fresh(agent).grants_version, AuditEvent.objects.count())

    client.force_login(root)  # before the look: the sign-in is an audit event of its own
    before = state()
    with pytest.raises(GrantRefused, match="a reason is required"):
        change(fresh(agent), capability(*REFUND), actor=root, reason="  ")
    op = change.__name__.removeprefix("agent_")
    page = client.post(f"/agents/{agent.pk}/{op}", {"capability": "refund", "reason": " "}, follow=True)
    assert page.status_code == 200 and f"Not done: a reason is required to {op}" in page.content.decode()
    assert state() == before


@pytest.mark.django_db(transaction=True)
def test_a_promotion_that_waited_on_its_promoter_being_shown_the_token_is_refused(scout, ada):
    """Four eyes were asked of the agent as the caller had read it, before its row was locked: a
    rotation that showed the promoter the token, committed meanwhile, was not seen."""
    passed_run()
    stale = fresh(scout)

    def rotate():
        agent_rotate_token(fresh(scout), actor=ada, reason="a new laptop")

    with another_transaction(rotate, commit_when_waited_on=True):
        with pytest.raises(GrantRefused, match="four eyes"):
            grant_promote(stale, capability(*REFUND), actor=ada, reason="ready")
    assert grant_state(fresh(scout), *REFUND) == GrantState.SHADOW


@pytest.mark.parametrize(("connector", "module"), [
    (None, "ledger.connectors.http"),  # the sandbox's, through the HTTP client every connector calls
    (None, "ledger.connectors.base"),
    ("ledger.connectors.signed_http.SignedHttpConnector", "ledger.signing"),
])
def test_a_change_in_code_a_connector_uses_is_a_change_of_the_connector(connector, module, settings, monkeypatch):
    """The version read the connector class's own module only: a change in the code it calls (the
    HTTP client, how it signs, Stripe's units) left live grants live without the replay set having
    passed against it."""
    import inspect

    if connector:
        settings.SURETY_CONNECTORS = {**settings.SURETY_CONNECTORS, "refund": {
            "class": connector, "options": {"url": "http://127.0.0.1:9/refunds", "secret": "s"}}}
    before = connector_version("refund")
    real = inspect.getsource
    monkeypatch.setattr(inspect, "getsource", lambda obj: real(obj) + ("\n# changed" if obj.__name__ == module else ""))
    assert connector_version("refund") != before


def test_an_upgrade_of_the_stripe_sdk_is_a_change_of_the_stripe_connector(monkeypatch):
    from importlib import metadata

    from ledger.connectors.stripe import StripeConnector
    from ledger.connectors.test_mode import _behaviour

    before = _behaviour(StripeConnector)
    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: "99.0.0" if name == "stripe" else real(name))
    assert _behaviour(StripeConnector)["libraries"]["stripe"] == ["stripe 99.0.0"] != before["libraries"]["stripe"]


class TeamsOwnConnector(Connector):
    """A connector a team writes in its own package, as docs/connectors.md shows."""

    name = "teams-own"


@pytest.mark.parametrize(("module", "changes"), [(__name__, True), ("django.utils.timezone", False)])
def test_a_teams_own_connector_is_its_code_and_django_is_left_out(module, changes, settings, monkeypatch):
    """Outside the ledger, a connector's own module was taken for a library (its package's
    distribution version), so a change to it left its grants live; and Django's modules were read
    as the ledger's, so its patch releases would have sent every grant back to shadow."""
    import inspect

    settings.SURETY_CONNECTORS = {**settings.SURETY_CONNECTORS, "refund": {
        "class": f"{__name__}.TeamsOwnConnector", "options": {}}}
    before = connector_version("refund")
    real = inspect.getsource
    monkeypatch.setattr(inspect, "getsource", lambda obj: real(obj) + ("\n# changed" if obj.__name__ == module else ""))
    assert (connector_version("refund") != before) is changes


def test_a_connector_in_a_packages_init_has_one_version_whatever_the_process_imported(tmp_path, monkeypatch):
    """A package's namespace holds every submodule any code imported: read from it, the version of a
    connector in a package's __init__ differed between processes (the web's admin imported one more)."""
    import importlib
    import sys

    from ledger.connectors.test_mode import _behaviour

    package = tmp_path / "teampay" / "connectors"
    package.mkdir(parents=True)
    (tmp_path / "teampay" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("from ledger.connectors.base import Connector\n\n\n"
                                         "class PayConnector(Connector):\n    name = 'teampay'\n")
    (package / "admin_helpers.py").write_text("X = 1  # the team's admin pages', never the connector's\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        connector = importlib.import_module("teampay.connectors").PayConnector
        web = _behaviour(connector)
        importlib.import_module("teampay.connectors.admin_helpers")
        assert _behaviour(connector) == web
        assert "teampay.connectors" in web["sources"] and "ledger.connectors.base" in web["sources"]
    finally:
        for name in [name for name in sys.modules if name.startswith("teampay")]:
            del sys.modules[name]


def test_a_connectors_version_is_computed_by_one_thread_however_many_lanes_claim_at_once(monkeypatch):
    """A worker's drain lanes claim at once when it starts, and each asked for the connector's
    version, computing it side by side: CPython 3.11's ast.parse (the connector's imports) raised
    SystemError ("AST constructor recursion depth mismatch") in one of them, and its task failed."""
    running, most, calls = [0], [0], []

    def slow_version(action_type):
        running[0] += 1
        most[0] = max(most[0], running[0])
        calls.append(action_type)
        time.sleep(0.05)
        running[0] -= 1
        return "v1"

    monkeypatch.setattr(test_mode, "connector_version", slow_version)
    test_mode._versions.clear()
    try:
        with ThreadPoolExecutor(8) as lanes:
            versions = list(lanes.map(lambda _: test_mode.version_now("refund"), range(8)))
    finally:
        test_mode._versions.clear()
    assert versions == ["v1"] * 8 and most[0] == 1 and calls == ["refund"]


def test_a_connectors_imports_are_parsed_by_one_thread_at_a_time(monkeypatch):
    """A replay run computes the version too, beside a worker's lanes: the parse itself takes turns."""
    running, most = [0], [0]
    parse = test_mode.ast.parse

    def slow_parse(source):
        running[0] += 1
        most[0] = max(most[0], running[0])
        time.sleep(0.02)
        running[0] -= 1
        return parse(source)

    monkeypatch.setattr(test_mode.ast, "parse", slow_parse)
    with ThreadPoolExecutor(4) as threads:
        versions = set(threads.map(lambda _: connector_version("refund"), range(4)))
    assert len(versions) == 1 and most[0] == 1
