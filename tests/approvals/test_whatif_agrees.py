"""The what-if's SQL gives every action the verdict `verdict_for` gives it, on a varied data set:
amounts on and around every threshold, customers with many actions a day (and none), ties in
time, every status, days on both sides of midnight and of the window's start, other types and
currencies around them; and where the type's only limit is in another currency, the current
rule is the intake's (`rule_for`): each request waits for a person, or is refused."""

import random
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from approvals.intake import customer_total_today, rule_for
from approvals.models import Limit
from approvals.policies import verdict_for
from approvals.whatif import ABOVE_MAX, DAILY_TOTAL, REFUSED, RUNS, TWO_APPROVERS, UNCOVERED, WAITS, Proposal, \
    replayed, window_start, whatif
from ledger.models import Action, ActionStatus
from tests.factories import make_agent, new_action

pytestmark = pytest.mark.django_db

KIND = {0: RUNS, 2: TWO_APPROVERS}  # verdict_for's approvals_needed -> the SQL's kind (1 is either of two)
AMOUNTS = ["0.01", "99.99", "100.00", "100.01", "150.00", "249.999", "250.00", "250.001", "300.00", "499.99",
           "500.00", "500.01", "999.99", "1000.00", "1000.01", "2500.00"]
R, M, T, D = RUNS, ABOVE_MAX, TWO_APPROVERS, DAILY_TOTAL
LIMITS = [  # (a limit, the kinds of verdict it gives on the data set: each rule has something to decide)
    (dict(max_amount=Decimal("250.00")), {R, M}),
    (dict(max_amount=Decimal("250.00"), dual_approval_above=Decimal("1000.00")), {R, M, T}),
    (dict(max_amount=Decimal("500.00"), daily_customer_total=Decimal("600.00")), {R, M, D}),
    # Two approvers from the maximum on: nothing is only above the maximum.
    (dict(max_amount=Decimal("500.00"), dual_approval_above=Decimal("500.00"),
          daily_customer_total=Decimal("300.00")), {R, T, D}),
    # No daily total at all: nothing runs.
    (dict(max_amount=Decimal("1000.00"), dual_approval_above=Decimal("2000.00"), daily_customer_total=Decimal("0")),
     {M, T, D}),
    (dict(max_amount=Decimal("0"), daily_customer_total=Decimal("100000")), {M}),
]


def kind_of(verdict):
    """The SQL's kind for a verdict of verdict_for's, told apart by its reason when one approver."""
    if verdict.refused:
        return REFUSED
    if verdict.reason.startswith("no refund limit covers"):
        return UNCOVERED
    if verdict.approvals_needed == 1:
        return DAILY_TOTAL if " total today " in verdict.reason else ABOVE_MAX
    return KIND[verdict.approvals_needed]


@pytest.fixture
def now():
    # Late in the day: the data set's times on "today" stay in the past.
    today = timezone.now().astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return min(timezone.now(), today + timedelta(hours=23, minutes=59))


@pytest.fixture
def data_set(now):
    """600 actions over 5 days (the window: the last 3), in time order with ties."""
    agent, _ = make_agent("billing")
    rng = random.Random(12)
    customers = ["CUST-1", "CUST-2", "CUST-3", "CUST-4", ""]
    start, today = window_start(5, now), window_start(1, now)
    rows = []
    for i in range(600):
        # Every fifth one today, however early in the day the test runs.
        since = today if i % 5 == 0 else start
        at = since + timedelta(microseconds=rng.randrange(int((now - since).total_seconds() * 1e6)))
        if rng.random() < 0.2 and rows:
            at = rows[-1].created_at  # a tie in time: the id orders them
        status = rng.choice(ActionStatus.values)
        action_type, currency = "refund", "EUR"
        if rng.random() < 0.1:
            action_type, currency = rng.choice([("refund", "USD"), ("create_booking", "")])
        amount = rng.choice(AMOUNTS)
        row = new_action(agent, status, key=f"refund:ORD-{i}:dec", target=f"ORD-{i}", amount=amount,
                         created_at=at, customer=rng.choice(customers), action_type=action_type, currency=currency,
                         retryable=rng.random() < 0.5)  # a failure that may be retried counts, one for good not
        if not currency:
            row.amount = None  # a booking has no amount
        rows.append(row)
    return sorted(rows, key=lambda row: row.created_at)


def save(rows):
    """Saved in time order (ids grow with time, ties keep their order); read back as the
    database holds them (its rules may hold an action another one waits beside)."""
    Action.objects.bulk_create(rows)
    return list(Action.objects.order_by("created_at", "id"))


def counted(action):
    """Whether the action counts in its customer's daily total: it may still move money."""
    if action.status == ActionStatus.FAILED:
        return action.error.get("retryable") is True
    return action.status not in (ActionStatus.REJECTED, ActionStatus.CANCELLED, ActionStatus.SHADOW,
                                 ActionStatus.EXPIRED, ActionStatus.SUPERSEDED)


def totals_before(rows):
    """{pk: the customer's total that day before it}: customer_total_today's rule, in Python
    (those without a customer share one total)."""
    totals = {}
    for row in rows:
        same_day = [o for o in rows if o.customer == row.customer and o.action_type == row.action_type
                    and o.currency == row.currency and o.created_at.date() == row.created_at.date()
                    and (o.created_at, o.pk) < (row.created_at, row.pk) and counted(o)]
        totals[row.pk] = sum((o.amount for o in same_day if o.amount is not None), Decimal(0))
    return totals


# The current rule: no limit; a limit in EUR; the type's only limit in USD (the intake lets a
# person approve each EUR one, or refuses it).
CURRENT = [None, ("EUR", LIMITS[3][0], "approve"), ("USD", LIMITS[0][0], "approve"), ("USD", LIMITS[0][0], "refuse")]


@pytest.mark.parametrize(("proposed", "kinds"), LIMITS)
@pytest.mark.parametrize("current", CURRENT)
def test_each_actions_verdict_is_verdict_fors(data_set, now, proposed, kinds, current, settings):
    rows = save(data_set)
    if current is not None:
        currency, values, settings.LIMITS_UNCOVERED_CURRENCY = current
        Limit.limit_set(actor="system:tests", reason="the current one", action_type="refund", currency=currency,
                        **values)
    current_limit = rule_for("refund", "EUR")
    proposal = Proposal("refund", "EUR", **{"dual_approval_above": None, "daily_customer_total": None, **proposed})
    since = window_start(3, now)
    totals = totals_before(rows)
    expected = {row.pk: tuple(kind_of(verdict_for(limit, row.amount, totals[row.pk], no_customer=not row.customer))
                              for limit in (current_limit, proposal))
                for row in rows if row.action_type == "refund" and row.currency == "EUR" and row.created_at >= since
                and row.status != ActionStatus.SHADOW}
    got = {a.pk: (a.current, a.proposed) for a in replayed(proposal, current_limit, since)}
    assert got == expected
    assert {p for _, p in expected.values()} == kinds
    if current is not None and current[0] == "USD":  # no EUR limit: each request waits, or is refused
        assert {c for c, _ in expected.values()} == {UNCOVERED if current[2] == "approve" else REFUSED}
    preview = whatif(proposal, days=3, now=now)
    counts = preview["counts"]
    assert counts["actions"] == len(expected)
    assert counts["proposed_waiting"] == sum(p != RUNS for _, p in expected.values())
    assert counts["current_waiting"] == sum(c in WAITS for c, _ in expected.values())
    assert counts["current_uncovered"] == sum(c == UNCOVERED for c, _ in expected.values())
    assert counts["current_refused"] == sum(c == REFUSED for c, _ in expected.values())
    assert counts["proposed_daily_total"] == sum(p == DAILY_TOTAL for _, p in expected.values())
    assert counts["newly_waiting"] == sum(c not in WAITS and p != RUNS for c, p in expected.values())


def test_the_daily_total_is_the_one_the_intake_asks_for(data_set, now):
    """For the last action of each customer today, the total before it is what the intake's
    customer_total_today counts now without it (the product's own function), and what the
    what-if's SQL sums; those without a customer too, whose total is theirs together."""
    rows = save(data_set)
    totals = totals_before(rows)
    today = now.astimezone(UTC).date()
    last = {}
    for row in rows:
        # The last but for shadow actions, which no total counts and no what-if replays.
        if row.created_at.date() == today and row.action_type == "refund" and row.currency == "EUR" \
                and row.status != ActionStatus.SHADOW:
            last[row.customer] = row
    assert len(last) >= 3 and "" in last and totals[last[""].pk]
    proposal = Proposal("refund", "EUR", Decimal("100000"), daily_customer_total=Decimal("0.01"))
    summed = {a.pk: a.total_before for a in replayed(proposal, None, window_start(1, now))}
    for row in last.values():
        assert totals[row.pk] == customer_total_today("refund", "EUR", row.customer, excluding=row)
        assert summed[row.pk] == totals[row.pk]


def test_a_window_starts_at_midnight_utc_and_holds_whole_days():
    at = datetime(2026, 3, 10, 15, 30, tzinfo=UTC)
    assert window_start(1, at) == datetime(2026, 3, 10, tzinfo=UTC)
    assert window_start(30, at) == datetime(2026, 2, 9, tzinfo=UTC)

