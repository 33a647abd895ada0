"""The what-if read from daily summaries answers what it answers from the actions' rows, on random
data: amounts on and around every threshold, customers with many actions a day, ties in time,
every status, edited-down versions, approval items, today's partial day (always read from rows)
and days that change after they were summarised (the database marks them stale, and the
what-if reads their rows until they are summarised again)."""

import random
from datetime import UTC, timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.utils import timezone

from approvals.intake import rule_for
from approvals.models import Limit, ReviewItem, ReviewKind, ReviewStatus, SummaryDay
from approvals.summaries import summarise, summarise_due
from approvals.whatif import Proposal, _summarised, whatif, window_start
from ledger.models import Action, ActionStatus
from tests.factories import make_action, make_agent, new_action

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the summaries and their staleness are PostgreSQL's"),
]

DAYS = 5
AMOUNTS = ["0.01", "99.99", "100.00", "100.01", "249.999", "250.00", "250.001", "499.99", "500.00", "500.01",
           "999.99", "1000.00", "1000.01", "2500.00", "4999.00"]
PROPOSALS = [
    dict(max_amount=Decimal("250.00")),
    dict(max_amount=Decimal("250.00"), dual_approval_above=Decimal("1000.00"), daily_customer_total=Decimal("600.00")),
    dict(max_amount=Decimal("500.00"), dual_approval_above=Decimal("500.00"), daily_customer_total=Decimal("300.00")),
    dict(max_amount=Decimal("1000.00"), daily_customer_total=Decimal("0")),
]
# The current rule: no limit; one in EUR; the type's only limit in USD (each EUR request waits, or is refused).
CURRENT = [None, ("EUR", dict(max_amount=Decimal("500.00"), dual_approval_above=Decimal("2500.00"),
                              daily_customer_total=Decimal("1000.00")), "approve"),
           ("USD", dict(max_amount=Decimal("100.00")), "refuse")]


@pytest.fixture
def now():
    today = timezone.now().astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return min(timezone.now(), today + timedelta(hours=23, minutes=59))


@pytest.fixture
def actions(now):
    """700 actions over the window and the day before it, in time order with ties; a tenth of
    the requests asked for approval; some edited down (a version of their own)."""
    agent, _ = make_agent("billing")
    rng = random.Random(23)
    start, today = window_start(DAYS + 1, now), window_start(1, now)
    rows = []
    for i in range(700):
        since = today if i % 6 == 0 else start
        at = since + timedelta(microseconds=rng.randrange(int((now - since).total_seconds() * 1e6)))
        if rng.random() < 0.15 and rows:
            at = rows[-1].created_at
        action_type, currency = ("refund", "EUR") if rng.random() < 0.85 else ("refund", "USD")
        statuses = [s for s in ActionStatus.values if s != ActionStatus.SUPERSEDED]
        rows.append(new_action(agent, rng.choice(statuses), key=f"refund:ORD-{i}:dec", target=f"ORD-{i}",
                               amount=rng.choice(AMOUNTS), created_at=at, action_type=action_type, currency=currency,
                               customer=rng.choice(["CUST-1", "CUST-2", "CUST-3", "CUST-4", "CUST-5", ""])))
    Action.objects.bulk_create(sorted(rows, key=lambda row: row.created_at))
    saved = list(Action.objects.order_by("created_at", "id"))
    for original in rng.sample(saved, 15):  # edited down: the version is the request's amount now
        version = new_action(agent, ActionStatus.QUEUED, key=f"{original.operation_key}:v2", target=original.target,
                             amount="50.00", created_at=original.created_at, customer=original.customer,
                             currency=original.currency, supersedes=original)
        Action.objects.filter(pk=original.pk).update(status=ActionStatus.SUPERSEDED)
        version.save(force_insert=True)
    ReviewItem.objects.bulk_create(
        ReviewItem(kind=ReviewKind.APPROVAL, action=action, status=ReviewStatus.APPROVED, approvals_needed=1,
                   deadline=action.created_at + timedelta(hours=4), created_at=action.created_at)
        for action in rng.sample(saved, 70))
    return saved


def answer(proposal, now):
    preview = whatif(proposal, days=DAYS, now=now)
    return preview["counts"], [example["action"].pk for example in preview["examples"]], preview["left_uncovered"]


def from_rows(proposal, now):
    """The same preview with every summary left aside (as if each day were stale)."""
    fresh = list(SummaryDay.objects.filter(stale=False).values_list("day", flat=True))
    SummaryDay.objects.filter(day__in=fresh).update(stale=True)
    try:
        return answer(proposal, now)
    finally:
        SummaryDay.objects.filter(day__in=fresh).update(stale=False)


def closed_days(now):
    return [(window_start(DAYS, now) + timedelta(days=i)).date() for i in range(DAYS - 1)]


@pytest.mark.parametrize("proposed", PROPOSALS)
@pytest.mark.parametrize("current", CURRENT)
def test_the_summaries_answer_what_the_rows_answer(actions, now, proposed, current, settings):
    if current is not None:
        currency, values, settings.LIMITS_UNCOVERED_CURRENCY = current
        Limit.limit_set(actor="system:tests", reason="the current one", action_type="refund", currency=currency,
                        **values)
    proposal = Proposal("refund", "EUR", **{"dual_approval_above": None, "daily_customer_total": None, **proposed})
    rows_answer = answer(proposal, now)
    assert rows_answer[0]["actions"] > 400 and rows_answer[0]["changed"] and len(rows_answer[1]) == 10
    # Refund's first limit leaves USD uncovered: its requests are counted too.
    assert (rows_answer[2] is None) == (current is not None)
    assert current is not None or rows_answer[2]["currencies"]["USD"] > 50
    for day in closed_days(now):
        summarise(day)
    assert set(_summarised(proposal, rule_for("refund", "EUR"), closed_days(now))) == set(closed_days(now))
    assert answer(proposal, now) == rows_answer == from_rows(proposal, now)


def test_a_day_changed_after_its_summary_is_read_from_its_rows_until_summarised_again(actions, now):
    proposal = Proposal("refund", "EUR", Decimal("250.00"), Decimal("1000.00"), Decimal("600.00"))
    for day in closed_days(now):
        summarise(day)
    before = answer(proposal, now)
    yesterday = closed_days(now)[-1]
    of_yesterday = Action.objects.filter(created_at__date=yesterday, currency="EUR", supersedes__isnull=True)
    # A request of yesterday's now above two approvers' threshold, and another one's rejection
    # leaving its customer's total: both days' summaries would be wrong now.
    # The first is one at or under the threshold before the change, so the count must move.
    # A shadow run is no request (the what-if leaves it out), so the first is not one.
    current = of_yesterday.exclude(status__in=[ActionStatus.SUPERSEDED, ActionStatus.SHADOW]).order_by("id")
    first = current.filter(amount__lte=proposal.dual_approval_above).first()
    second = current.exclude(pk=first.pk).first()
    Action.objects.filter(pk=first.pk).update(amount=Decimal("9999.00"))
    Action.objects.filter(pk=second.pk).update(status=ActionStatus.REJECTED)
    assert SummaryDay.objects.get(day=yesterday).stale
    changed = answer(proposal, now)
    assert changed != before
    assert changed == from_rows(proposal, now)
    assert changed[0]["proposed_two_approvers"] == before[0]["proposed_two_approvers"] + 1
    # The sweeper's step summarises it again; the answer stays.
    assert summarise_due(now) >= 1
    assert not SummaryDay.objects.get(day=yesterday).stale
    assert answer(proposal, now) == changed


def test_an_approval_item_opened_for_a_past_day_marks_it_stale(actions, now):
    day = closed_days(now)[0]
    summarise(day)
    action = Action.objects.filter(created_at__date=day, review_items__isnull=True).first()
    ReviewItem.objects.create(kind=ReviewKind.APPROVAL, action=action, approvals_needed=1,
                              deadline=action.created_at + timedelta(hours=4))
    assert SummaryDay.objects.get(day=day).stale


def test_a_past_failure_given_up_marks_its_day_stale(actions, now):
    """A failure that may be retried counts in its customer's total; given up, it no longer does,
    with its status unchanged: the day's summary would count it still."""
    day = closed_days(now)[0]
    summarise(day)
    action = Action.objects.filter(created_at__date=day).first()
    Action.objects.filter(pk=action.pk).update(status=ActionStatus.FAILED,
                                               error={"code": "x", "message": "x", "retryable": True})
    summarise(day)
    Action.objects.filter(pk=action.pk).update(error={"code": "x", "message": "x", "retryable": False})
    assert SummaryDay.objects.get(day=day).stale


def test_todays_writes_mark_nothing(actions, now):
    """Today is always read from its rows: its actions' changes mark no day (the hot path pays
    the trigger's comparison only)."""
    SummaryDay.objects.all().delete()
    today = Action.objects.filter(created_at__gte=window_start(1, now)).first()
    Action.objects.filter(pk=today.pk).update(status=ActionStatus.CANCELLED)
    assert not SummaryDay.objects.exists()


def test_a_day_already_stale_is_not_written_again(actions, now):
    """Each change to a closed day's actions marks it stale; once it is, its row is left alone
    (an archive run deletes thousands of one day's actions: one new row version each). A row
    version of its own has a place of its own (ctid), in a transaction or not."""
    day = closed_days(now)[0]
    summarise(day)
    of_the_day = Action.objects.filter(created_at__date=day).order_by("id")

    def version():
        with connection.cursor() as cursor:
            cursor.execute("SELECT ctid::text FROM approvals_summaryday WHERE day = %s", [day])
            return cursor.fetchone()[0]

    Action.objects.filter(pk=of_the_day[0].pk).update(status=ActionStatus.CANCELLED)
    assert SummaryDay.objects.get(day=day).stale
    stale = version()
    Action.objects.filter(pk=of_the_day[1].pk).update(status=ActionStatus.CANCELLED)
    assert version() == stale


def test_a_sweeper_whose_clock_runs_ahead_does_not_summarise_the_databases_today(monkeypatch):
    """Its host's clock is this process's `timezone.now`, moved a day ahead (the host clock
    itself cannot be set from a test): today, by the database's clock that the rule marking a
    past day stale reads, is still open, and is not summarised."""
    agent = make_agent("summaries-clock")[0]
    make_action(agent, "succeeded", amount="5.00")
    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(days=1))
    summarise_due()
    database_today = real_now().astimezone(UTC).date()
    assert not SummaryDay.objects.filter(day=database_today).exists()
