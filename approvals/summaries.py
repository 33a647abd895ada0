"""Daily summaries of the requests, so that the what-if over 90 days reads about a hundred rows a
day instead of every action (approvals.whatif, decision 39).

A closed UTC day is summarised by the sweeper step `actions_summarised` (`summarise_due`): per
action type and currency, its requests grouped by amount and by their customer's total that day
before them (approvals.models.ActionSummary), counted from the same SQL the what-if reads rows
with (`whatif.daily_total_before`), so both count alike. Nothing is added to a write: the intake
and the workers never touch a summary, and no day row is a counter every writer would queue on.

A day's summary stays true by the database (approvals.dbrules.SUMMARY_STALE): a change to an
action of a past day (its status, amount or customer; an approval item opened for it; a row
written or deleted there) marks that day stale, and the what-if reads its rows until the step
summarises it again. The step writes the day's mark first, then reads: a change that commits
after the read waits on the mark's row and marks it stale after it. A day is summarised only
once every transaction that began before its end has finished (one begun before midnight and
still open could change that day's row without the rule seeing the day as past).

PostgreSQL only: on SQLite (the embedded default, small tables) the what-if reads rows.
"""

from collections import Counter
from datetime import UTC, datetime, timedelta

from django.db import connection, transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from ledger.models import Action, ActionStatus

from .models import ActionSummary, ReviewItem, ReviewKind, SummaryDay
from .whatif import MAX_DAYS, daily_total_before, window_start

# Days summarised per pass at most (about a second each at 10M actions).
DAYS_PER_PASS = 5


def summarise_due(now=None):
    """A sweeper step: the closed days of the what-if's longest window without a fresh summary,
    newest first, are summarised; the days before that window are forgotten. Returns how many."""
    if connection.vendor != "postgresql":
        return 0
    today = window_start(1, now)
    oldest = window_start(MAX_DAYS, now).date()
    SummaryDay.objects.filter(day__lt=oldest).delete()
    with connection.cursor() as cursor:
        # The day before the oldest transaction still open is the last one that is over.
        cursor.execute("SELECT min(xact_start) FROM pg_stat_activity "
                       "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        oldest_open = cursor.fetchone()[0]
    closed_before = min(today, oldest_open or today).astimezone(UTC).date()
    fresh = set(SummaryDay.objects.filter(day__gte=oldest, stale=False).values_list("day", flat=True))
    due = [day for day in (closed_before - timedelta(days=i + 1) for i in range((closed_before - oldest).days))
           if day not in fresh]
    for day in due[:DAYS_PER_PASS]:
        summarise(day)
    return len(due[:DAYS_PER_PASS])


@transaction.atomic
def summarise(day):
    """The summary of one day (a date, UTC), written over the one it had."""
    SummaryDay.objects.bulk_create([SummaryDay(day=day, stale=False, summarised_at=timezone.now())],
                                   update_conflicts=True, unique_fields=["day"],
                                   update_fields=["stale", "summarised_at"])
    ActionSummary.objects.filter(day=day).delete()
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    rows = (Action.objects.filter(created_at__gte=start, created_at__lt=start + timedelta(days=1))
            .exclude(currency="").exclude(status=ActionStatus.SHADOW).order_by()
            .annotate(total_before=daily_total_before("action_type", "currency"),
                      asked=Exists(ReviewItem.objects.filter(action=OuterRef("pk"), kind=ReviewKind.APPROVAL))))
    requests, asked = Counter(), Counter()
    for action_type, currency, amount, total_before, was_asked, version_of in rows.values_list(
            "action_type", "currency", "amount", "total_before", "asked", "supersedes_id"):
        if version_of is not None:
            continue  # not a request (whatif.REQUESTED), but in the totals of the requests after it
        # Without an amount, the verdict does not look at the total.
        key = (action_type, currency, amount, total_before if amount is not None else 0)
        requests[key] += 1
        asked[key] += was_asked
    ActionSummary.objects.bulk_create(_with_running_counts(day, requests, asked), batch_size=5000)


def _with_running_counts(day, requests, asked):
    """The rows, each first of the day's (total 0) with the counts up to its amount, per type and currency."""
    rows, upto = [], Counter()
    for key in sorted(requests, key=lambda k: (k[0], k[1], k[3], k[2] is None, k[2] or 0)):
        action_type, currency, amount, total_before = key
        row = ActionSummary(day_id=day, action_type=action_type, currency=currency, amount=amount,
                            total_before=total_before, n=requests[key], asked=asked[key])
        if total_before == 0 and amount is not None:
            upto[action_type, currency, "n"] += row.n
            upto[action_type, currency, "asked"] += row.asked
            row.n_upto, row.asked_upto = upto[action_type, currency, "n"], upto[action_type, currency, "asked"]
        rows.append(row)
    return rows
