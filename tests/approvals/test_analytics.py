"""Decision analytics on a planted data set: every figure, on the page and on /metrics."""

from datetime import timedelta
from itertools import count

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.utils import timezone

from approvals.analytics import _quantile, decision_analytics
from approvals.models import ReviewItem, ReviewKind, ReviewStatus
from tests.factories import make_action, make_agent
from tests.ledger.test_metrics import scrape

pytestmark = pytest.mark.django_db

H, MIN = timedelta(hours=1), timedelta(minutes=1)
K = ReviewKind
S = ReviewStatus


@pytest.fixture
def people():
    call_command("setup_roles", verbosity=0)
    users = {}
    for name, group in (("alice", "approvers"), ("bob", "approvers"), ("aldo", "auditors")):
        users[name] = get_user_model().objects.create_user(name, password="x")
        users[name].groups.add(Group.objects.get(name=group))
    return users


@pytest.fixture
def planted(people):
    return plant(people["alice"], people["bob"])


def plant(alice, bob):
    """Yesterday and the day before (and one decision too old to count):

    | queue    | who   | agent   | took          | outcome  | deadline after opening |
    | approval | alice | billing | 1, 2, 3, 4 h  | 3 approved, 1 rejected (the 4 h one) | 4 h, the 4 h one 3 h: late |
    | held     | bob   | support | 30 min        | released | 4 h |
    | unknown  | bob   | support | 10, 20 min    | resolved | 4 h |
    | approval | —     | billing | (the system closed it)   | — |
    | approval | (open, its deadline passed an hour ago: late)  | — |
    | approval | alice | billing | 1 h, 40 days ago: outside the window |
    """
    now = timezone.now()
    billing, _ = make_agent("billing")
    support, _ = make_agent("support", grants=("send_message", "refund"))
    keys = count()

    def item(kind, agent, opened, *, took=None, by=None, status=S.OPEN, deadline=4 * H, action_type="refund"):
        n = next(keys)
        action = make_action(agent, "succeeded", key=f"k{n}", target=f"ORD-{n}",
                             **({"action_type": action_type} if action_type != "refund" else {}))
        return ReviewItem.objects.create(
            kind=kind, action=action, status=status, created_at=opened, deadline=opened + deadline,
            decided_by=by, decided_by_label=by.username if by else "", decided_at=opened + took if took else None,
            updated_at=opened + (took or H))

    day1, day2 = now - timedelta(days=2), now - timedelta(days=1)
    for hours, status in ((1, S.APPROVED), (2, S.APPROVED), (3, S.APPROVED)):
        item(K.APPROVAL, billing, day1, took=hours * H, by=alice, status=status)
    item(K.APPROVAL, billing, day2, took=4 * H, by=alice, status=S.REJECTED, deadline=3 * H)
    item(K.HELD, support, day2, took=30 * MIN, by=bob, status=S.RESOLVED, action_type="send_message")
    for minutes in (10, 20):
        item(K.UNKNOWN_OUTCOME, support, day2, took=minutes * MIN, by=bob, status=S.RESOLVED)
    item(K.APPROVAL, billing, day1, took=2 * H, status=S.CLOSED)
    item(K.APPROVAL, billing, now - 5 * H)
    item(K.APPROVAL, billing, now - timedelta(days=40), took=H, by=alice, status=S.APPROVED)
    return now


def test_time_to_decision_per_queue_and_per_approver_counts_people_only(planted):
    figures = decision_analytics(planted)
    per_queue = {kind: (row["n"], row["median"], row["p90"]) for kind, row in figures["per_queue"].items()}
    assert per_queue == {
        K.APPROVAL: (4, 2.5 * H, 3.7 * H),  # 1, 2, 3, 4 h: percentile_cont's interpolation
        K.HELD: (1, 30 * MIN, 30 * MIN),
        K.UNKNOWN_OUTCOME: (2, 15 * MIN, 19 * MIN),
    }
    per_approver = {name: (row["n"], row["median"], row["p90"]) for name, row in figures["per_approver"].items()}
    assert per_approver == {"alice": (4, 2.5 * H, 3.7 * H), "bob": (3, 20 * MIN, 28 * MIN)}


def test_overdue_rate_counts_late_decisions_and_open_items_past_their_deadline(planted):
    overdue = decision_analytics(planted)["overdue"]
    # approval: 4 decided (the 4 h one after its 3 h deadline) and 1 open past its deadline;
    # the one the system closed is apart.
    assert overdue[K.APPROVAL] == {"due": 5, "late": 2, "rate": 0.4, "ended_by_system": 1}
    assert overdue[K.HELD] == {"due": 1, "late": 0, "rate": 0.0, "ended_by_system": 0}
    assert overdue[K.UNKNOWN_OUTCOME]["rate"] == 0.0


def test_approval_and_rejection_rates_per_action_type_and_per_agent(planted):
    figures = decision_analytics(planted)
    assert figures["per_action_type"] == {
        "refund": {"n": 4, "approved": 3, "rejected": 1, "approval_rate": 0.75, "rejection_rate": 0.25},
        "send_message": {"n": 1, "approved": 1, "rejected": 0, "approval_rate": 1.0, "rejection_rate": 0.0},
    }
    assert {name: row["n"] for name, row in figures["per_agent"].items()} == {"billing": 4, "support": 1}
    assert figures["per_agent"]["billing"]["rejection_rate"] == 0.25


def test_the_trend_has_every_day_of_the_window_and_each_days_decisions(planted):
    trend = decision_analytics(planted)["trend"]
    assert len(trend) == 30 and trend[-1]["day"] == planted.date()
    by_day = {day["day"]: day for day in trend if day["n"]}
    day1, day2 = (planted - timedelta(days=2)).date(), (planted - timedelta(days=1)).date()
    # Decided the day they opened, unless a decision ran past midnight (UTC).
    assert sum(day["n"] for day in trend) == 7
    assert sum(day["approved"] for day in trend) == 4 and sum(day["rejected"] for day in trend) == 1
    assert set(by_day) <= {day1, day2, day1 + timedelta(days=1), day2 + timedelta(days=1)}


def test_the_page_draws_the_figures_for_staff_and_auditors(planted, people, client):
    client.force_login(people["aldo"])  # an auditor reads it
    response = client.get("/analytics/")
    assert response.status_code == 200
    page = response.content.decode()
    assert 'id="chart-decisions"' in page and page.count("<rect class=\"chart__bar chart__bar--") >= 7
    assert ">2.5 h<" in page and ">3.7 h<" in page  # the approval queue's median and p90
    assert ">40 %<" in page.replace("\n", "")  # its overdue rate
    assert 'id="times-per-approver"' in page and ">alice<" in page
    assert "<script" not in page.split("</header>")[1]  # drawn on the server: no script in the content


def test_the_page_is_for_staff_only(client, db):
    client.force_login(get_user_model().objects.create_user("nobody", password="x"))
    assert client.get("/analytics/").status_code == 403


def test_an_empty_window_says_so(people, client):
    client.force_login(people["alice"])
    page = client.get("/analytics/").content.decode()
    assert "No decisions by people in these days" in page


def test_metrics_carry_the_figures_per_queue_and_per_action_type_only(planted, client, settings):
    settings.PRODUCTION, settings.METRICS_TOKEN, settings.METRICS_ALLOWED_IPS = False, None, []
    got = scrape(client, REMOTE_ADDR="127.0.0.1")
    assert got[("surety_review_decision_seconds", (("kind", "approval"), ("quantile", "0.5")))] == 2.5 * 3600
    assert got[("surety_review_decision_seconds", (("kind", "approval"), ("quantile", "0.9")))] == pytest.approx(
        3.7 * 3600)
    assert got[("surety_review_decisions_by_people", (("kind", "unknown_outcome"),))] == 2
    assert got[("surety_review_overdue_ratio", (("kind", "approval"),))] == 0.4
    assert got[("surety_review_ended_by_system", (("kind", "approval"),))] == 1
    assert got[("surety_review_approval_outcome_ratio", (("action_type", "refund"), ("outcome", "rejected")))] == 0.25
    # Bounded labels: kinds, quantiles, action types and outcomes; never a person or an agent.
    labels = {value for (name, pairs), _ in got.items() if name.startswith("surety_review_") for _, value in pairs}
    assert labels <= {*ReviewKind.values, "0.5", "0.9", "refund", "send_message", "create_booking", "approved",
                      "rejected"}


def test_the_embedded_databases_percentiles_interpolate_as_postgresqls():
    """SQLite has no percentile_cont: the Python fallback takes the same continuous percentile."""
    assert _quantile([3600, 7200, 10800, 14400], 0.5) == 9000
    assert _quantile([3600, 7200, 10800, 14400], 0.9) == pytest.approx(13320)
    assert _quantile([600, 1200], 0.9) == pytest.approx(1140)
    assert _quantile([42], 0.9) == 42
