"""A decision link's expiry is a deadline that guards a decision: it is written and read on the
database's clock (decision 57), as the approval window it lives in is. On the hosts' own clocks, a
link mailed by a worker ahead lasted longer by its lead, and a web host behind let a link decide
past its end for as long as it lagged, while one ahead refused a link still live.

A host whose clock is off is this process with Django's `timezone.now` moved (as in
tests/ledger/test_database_clock.py); each test shows that the host's clock alone would have
decided otherwise."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test import Client
from django.utils import timezone

from approvals.links import link_issue, link_use
from approvals.models import DecisionLink, Limit, ReviewItem, ReviewStatus
from ledger import clock
from ledger.actions import action_request
from tests.factories import host_clock_off_by, make_agent, person

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis"),
              pytest.mark.skipif(connection.vendor != "postgresql",
                                 reason="on SQLite the host's clock is the database's")]

HOUR = 3600


@pytest.fixture
def item():
    Limit.limit_set(actor="system:tests", reason="the tests' policy", action_type="refund", currency="EUR",
                    max_amount=Decimal("500.00"))
    action, _ = action_request(agent=make_agent("billing-bot")[0], operation_key="refund:ORD-1:dec-1",
                               action_type="refund", target="ORD-1", customer="CUST-1",
                               params={"amount": "750.00", "currency": "EUR"})
    return ReviewItem.objects.get(action=action)


@pytest.fixture
def alice():
    return person("alice", "approvers")


def ending_in(item, user, seconds):
    """A link for `user`, mailed two hours ago, that ends `seconds` from now by the database's clock
    (before now if negative)."""
    token = link_issue(user, item)
    now = clock.now()
    DecisionLink.objects.update(created_at=now - timedelta(hours=2), expires_at=now + timedelta(seconds=seconds))
    return token, DecisionLink.objects.get()


def approved_through(user, token, item):
    client = Client()
    client.force_login(user)
    page = client.get(f"/decide/{token}")
    posted = client.post(f"/decide/{token}", {"decision": "approve", "reason": "from the mail",
                                              "fingerprint": item.action.params_fingerprint()})
    return page, posted


def test_a_link_mailed_from_a_host_ahead_lasts_its_seconds_by_the_database_clock(item, alice, monkeypatch):
    host_clock_off_by(monkeypatch, HOUR)  # the worker that delivers the alert
    link_issue(alice, item)
    lasts = (DecisionLink.objects.get().expires_at - clock.now()).total_seconds()
    assert settings.DECISION_LINK_SECONDS - 5 < lasts <= settings.DECISION_LINK_SECONDS


def test_a_host_behind_refuses_a_link_past_its_end_and_nothing_is_decided(item, alice, monkeypatch):
    token, link = ending_in(item, alice, -60)
    host_clock_off_by(monkeypatch, -HOUR)  # the web host the person reaches
    assert timezone.now() < link.expires_at  # live, on its own clock

    page, posted = approved_through(alice, token, item)

    assert page.status_code == 410 and b"expired" in page.content
    assert posted.status_code == 410 and b"expired" in posted.content
    with transaction.atomic():
        assert not link_use(link, alice)  # the decision's own use of it, without the page's look first
    assert ReviewItem.objects.get(pk=item.pk).status == ReviewStatus.OPEN
    assert DecisionLink.objects.get().used_at is None


def test_a_host_ahead_still_decides_through_a_link_before_its_end(item, alice, monkeypatch):
    token, link = ending_in(item, alice, 30 * 60)
    host_clock_off_by(monkeypatch, HOUR)
    assert timezone.now() > link.expires_at  # ended, on its own clock

    page, posted = approved_through(alice, token, item)

    assert page.status_code == 200 and b'id="approve-button"' in page.content
    assert posted.status_code == 302
    assert ReviewItem.objects.get(pk=item.pk).status == ReviewStatus.APPROVED
    assert DecisionLink.objects.get().used_at is not None
