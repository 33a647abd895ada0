"""A grant's review date is told by the database's clock (decision 57), as leases and due times are:
on its host's own, a worker whose clock ran behind kept acting on a grant past its review date, and
one ahead held it shadow early.

As in tests/ledger/test_database_clock.py, a host whose clock is off is this process with Django's
`timezone.now` moved (the host clock itself cannot be set from a test); each test shows that the
host's clock alone would have decided otherwise. PostgreSQL only: on SQLite the host's clock is the
database's.
"""

import time
from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from console.readiness_views import with_grant_states
from ledger.connectors.test_mode import connector_version
from ledger.executor import action_claim_next
from ledger.grants import GrantRefused, capability, grant_lapsed_now, grant_promote, grant_state
from ledger.models import Action, ActionStatus, Capability, Grant, GrantState, ReplayRun
from tests.factories import (audit_events, host_clock_off_by, make_agent, make_agent_on, make_grants_live,
                             post_action_in_process, refund_body)
from tests.ledger.test_database_clock import database_now, refund

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("jobs_to_test_redis"),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="on SQLite the host's clock is the database's"),
]
REFUND = Capability.Kind.ACTION_TYPE, "refund"
HOUR = 3600


def reviewed(agent, **from_now):
    """The agent's grants live until the database's time now, moved by `from_now` (timedelta's
    arguments); returns that review date."""
    make_grants_live(agent, until=database_now() + timedelta(**from_now))
    return Grant.objects.get(agent=agent, capability__kind=REFUND[0], capability__name=REFUND[1]).live_until


def test_a_worker_whose_clock_runs_behind_sends_nothing_past_the_review_date(agent, monkeypatch):
    action = refund(agent)  # queued while the grant was live
    review_date = reviewed(agent, minutes=-1)
    host_clock_off_by(monkeypatch, -HOUR)  # the worker's host
    assert review_date > timezone.now()  # live still, on its own clock

    assert action_claim_next("worker-behind", only=action.pk) is None
    row = Action.objects.get(pk=action.pk)
    assert row.status == ActionStatus.CANCELLED
    assert audit_events(row, "cancelled").get().reason.startswith("grant not live: the agent's grant for refund is shadow")


def test_a_worker_whose_clock_runs_ahead_acts_on_the_grant_until_its_review_date(agent, monkeypatch):
    action = refund(agent)
    review_date = reviewed(agent, minutes=10)
    host_clock_off_by(monkeypatch, HOUR)  # the worker's host
    assert review_date < timezone.now()  # past, on its own clock

    claimed = action_claim_next("worker-ahead", only=action.pk)
    assert claimed is not None and claimed.status == ActionStatus.PENDING
    assert grant_lapsed_now(claimed) == ""  # its last look before the call


@pytest.mark.parametrize(("off", "review_in", "recorded"), [
    (-HOUR, -1, ActionStatus.SHADOW), (HOUR, 10, ActionStatus.QUEUED)], ids=["behind", "ahead"])
def test_an_intake_on_a_host_off_records_by_the_review_date_on_the_database_clock(client, monkeypatch, off, review_in,
                                                                                  recorded):
    agent = make_agent_on(client)
    reviewed(agent, minutes=review_in)
    host_clock_off_by(monkeypatch, off)  # the web process's host

    answer = post_action_in_process(client, "refund:ORD-1:dec-1", refund_body("ORD-1"))
    assert answer.status_code == 201, answer.content
    assert answer.json()["status"] == recorded


def test_a_live_answer_the_process_keeps_ends_at_the_review_date(agent, monkeypatch):
    """The process keeps an agent's grant by its grants_version (decision 41) and compares the review
    date at each check: the answer kept while it was live is shadow once the date passes on the
    database's clock, with no statement, on a host an hour behind too."""
    review_date = reviewed(agent, seconds=1)
    host_clock_off_by(monkeypatch, -HOUR)
    assert grant_state(agent, *REFUND) == GrantState.LIVE
    time.sleep(max(0.0, (review_date - database_now()).total_seconds()) + 0.2)

    with CaptureQueriesContext(connection) as statements:
        assert grant_state(agent, *REFUND) == GrantState.SHADOW
    assert len(statements) == 0  # the kept grant, compared afresh


@pytest.mark.parametrize("past", ["the review date", "the replay pass"])
def test_a_promotion_on_a_host_behind_is_checked_on_the_database_clock(monkeypatch, past):
    """A promotion writes the review date the checks compare with the database's clock: it is
    checked on that clock, and so is the age of the replay pass it rests on."""
    agent = make_agent("scout", live=False)[0]
    ada = get_user_model().objects.create_user("ada")
    max_age = timedelta(days=settings.REPLAY_PASS_MAX_AGE_DAYS)
    aged = past == "the replay pass"
    ReplayRun.objects.create(action_type="refund", connector="sandbox", ran_by="system:tests", passed=True,
                             connector_version=connector_version("refund"),
                             started_at=database_now() - (max_age + timedelta(minutes=10) if aged else timedelta(0)))
    review_by = database_now() + (timedelta(days=30) if aged else -timedelta(minutes=10))
    host_clock_off_by(monkeypatch, -HOUR)  # the console's host; on its clock, both are within bounds

    with pytest.raises(GrantRefused, match="no replay run passed" if aged else "review date must be ahead"):
        grant_promote(agent, capability(*REFUND), actor=ada, reason="the replay set passed", review_by=review_by)
    assert not audit_events(agent, "promoted").exists()


def test_the_agents_page_shows_the_state_the_checks_act_on(agent, monkeypatch):
    """The agents page showed a grant past its review date live, on a host an hour behind, while
    every check had it shadow."""
    reviewed(agent, minutes=-1)
    host_clock_off_by(monkeypatch, -HOUR)  # the console's host

    shown = {(cap.kind, cap.name): state for cap, state, _ in with_grant_states([agent])[0].grants_shown}
    assert shown[REFUND] == GrantState.SHADOW
