"""Decision analytics: where people are the bottleneck, over the last 30 days.

Only decisions by people count as decisions (`decided_by` set: approved, rejected, released
or resolved by someone); an item the system ended (its action settled elsewhere, or its wait
ran out) is counted apart, as `ended_by_system`. Times are from an item's opening to its
decision. The figures:

- time to decision per queue (review kind) and per approver: median and p90;
- overdue rate per queue: of the items due in the window (deadline passed), the share no
  person decided by their deadline (decided late, or still open); the system's ends are
  left out of it;
- approval and rejection rates per action type and per agent, over the approval queue's
  decisions (approval and held items; a release counts as an approval);
- the trend: per UTC day, the decisions (approved, rejected, other) and their median time.

Percentiles are PostgreSQL's `percentile_cont` in the grouped query; on SQLite (the embedded
default, small tables) they are taken in Python from the same rows.
"""

import statistics
from datetime import UTC, timedelta

from django.db import connection
from django.db.models import Aggregate, Count, DurationField, F, Q
from django.db.models.functions import TruncDate
from django.utils import timezone

from .models import ReviewItem, ReviewKind, ReviewStatus

DAYS = 30
APPROVAL_QUEUE = [ReviewKind.APPROVAL, ReviewKind.HELD]
BY_PERSON = Q(decided_by__isnull=False)
# An approval queue's item let through: approved, or (held) released.
LET_THROUGH = Q(status=ReviewStatus.APPROVED) | Q(kind=ReviewKind.HELD, status=ReviewStatus.RESOLVED)
TIME_TO_DECISION = F("decided_at") - F("created_at")


class Percentile(Aggregate):
    """PostgreSQL's percentile_cont: the continuous percentile `fraction` of the expression."""

    function = "PERCENTILE_CONT"
    template = "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY %(expressions)s)"

    def __init__(self, expression, fraction, **extra):
        super().__init__(expression, fraction=float(fraction), output_field=DurationField(), **extra)


def window_start(now=None, days=DAYS):
    """Midnight (UTC) `days - 1` days ago: today and the whole days before it."""
    now = now or timezone.now()
    return now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=days - 1)


def decisions(since):
    """People's decisions taken since `since`."""
    return ReviewItem.objects.filter(BY_PERSON, decided_at__gte=since).order_by()


def times_to_decision(items, by):
    """{value of `by`: {"n", "median", "p90"}} (timedeltas) over `items`, largest group first."""
    if connection.vendor == "postgresql":
        rows = items.values(group=F(by)).annotate(n=Count("id"), median=Percentile(TIME_TO_DECISION, 0.5),
                                                  p90=Percentile(TIME_TO_DECISION, 0.9))
        found = {row["group"]: {"n": row["n"], "median": row["median"], "p90": row["p90"]} for row in rows}
    else:
        durations = {}
        for group, opened, decided in items.values_list(by, "created_at", "decided_at"):
            durations.setdefault(group, []).append((decided - opened).total_seconds())
        found = {group: {"n": len(seconds), "median": timedelta(seconds=_quantile(seconds, 0.5)),
                         "p90": timedelta(seconds=_quantile(seconds, 0.9))} for group, seconds in durations.items()}
    return dict(sorted(found.items(), key=lambda pair: (-pair[1]["n"], str(pair[0]))))


def _quantile(values, fraction):
    """percentile_cont's linear interpolation between the closest ranks."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    return statistics.quantiles(ordered, n=100, method="inclusive")[round(fraction * 100) - 1]


def overdue_rates(since, now):
    """{kind: {"due", "late", "rate", "ended_by_system"}} for every queue."""
    due = ReviewItem.objects.filter(deadline__gte=since, deadline__lt=now).order_by()
    rows = due.filter(BY_PERSON | Q(status=ReviewStatus.OPEN)).values("kind").annotate(
        due=Count("id"), late=Count("id", filter=Q(status=ReviewStatus.OPEN) | Q(decided_at__gt=F("deadline"))))
    by_kind = {row["kind"]: row for row in rows}
    ended = dict(ReviewItem.objects.filter(decided_by__isnull=True, updated_at__gte=since).exclude(
        status=ReviewStatus.OPEN).order_by().values_list("kind").annotate(n=Count("id")))
    rates = {}
    for kind in ReviewKind.values:
        row = by_kind.get(kind, {"due": 0, "late": 0})
        rates[kind] = {"due": row["due"], "late": row["late"], "rate": row["late"] / row["due"] if row["due"] else None,
                       "ended_by_system": ended.get(kind, 0)}
    return rates


def decision_rates(since, by):
    """{value of `by`: {"n", "approved", "rejected", "approval_rate", "rejection_rate"}} over the
    approval queue's decisions by people, largest first."""
    rows = decisions(since).filter(kind__in=APPROVAL_QUEUE).values(group=F(by)).annotate(
        n=Count("id"), approved=Count("id", filter=LET_THROUGH),
        rejected=Count("id", filter=Q(status=ReviewStatus.REJECTED))).order_by("-n", "group")
    return {row["group"]: {**{k: row[k] for k in ("n", "approved", "rejected")},
                           "approval_rate": row["approved"] / row["n"], "rejection_rate": row["rejected"] / row["n"]}
            for row in rows}


def trend(since, now):
    """One entry per UTC day from `since` to today: decisions by people (approved, rejected,
    other) and their median time to decision (None on a day without one)."""
    items = decisions(since).annotate(day=TruncDate("decided_at", tzinfo=UTC))
    counts = {row["day"]: row for row in items.values("day").annotate(
        n=Count("id"), approved=Count("id", filter=LET_THROUGH),
        rejected=Count("id", filter=Q(status=ReviewStatus.REJECTED)))}
    medians = times_to_decision(items, "day")
    days = []
    day = since.date()
    while day <= now.astimezone(UTC).date():
        row = counts.get(day, {"n": 0, "approved": 0, "rejected": 0})
        days.append({"day": day, "n": row["n"], "approved": row["approved"], "rejected": row["rejected"],
                     "other": row["n"] - row["approved"] - row["rejected"],
                     "median": medians.get(day, {}).get("median")})
        day += timedelta(days=1)
    return days


def decision_analytics(now=None):
    """Every figure of the page (and of /metrics), over the last DAYS days."""
    now = now or timezone.now()
    since = window_start(now)
    return {
        "since": since, "now": now, "days": DAYS,
        "per_queue": times_to_decision(decisions(since), "kind"),
        "per_approver": times_to_decision(decisions(since), "decided_by__username"),
        "overdue": overdue_rates(since, now),
        "per_action_type": decision_rates(since, "action__action_type"),
        "per_agent": decision_rates(since, "action__agent__name"),
        "trend": trend(since, now),
    }
