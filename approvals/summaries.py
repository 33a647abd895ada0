"""Daily summaries of the requests, so that the what-if over 90 days reads about a hundred rows a
day instead of every action (approvals.whatif, decision 39).

A closed UTC day is summarised by the sweeper step `actions_summarised` (`summarise_due`): per
action type and currency, its requests grouped by amount and by their customer's total that day
before them (approvals.models.ActionSummary), counted from the same SQL the what-if reads rows
with (`whatif.daily_total_before`), so both count alike. Nothing is added to a write: the intake
and the workers never touch a summary, and no day row is a counter every writer would queue on.

A day's summary stays true by the database (approvals.dbrules.SUMMARY_STALE): a change to an
action of a past day (its status, error, amount or customer; an approval item opened for it; a row
written or deleted there) marks that day stale, and the what-if reads its rows until the step
summarises it again. The step writes the day's mark first, then reads: a change that commits
after the read waits on the mark's row and marks it stale after it. A day is summarised only
once every transaction that began before its end has finished (one begun before midnight and
still open could change that day's row without the rule seeing the day as past).

PostgreSQL only: on SQLite (the embedded default, small tables) the what-if reads rows.
"""

from datetime import UTC, datetime, timedelta

from django.db import connection, transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from ledger.models import Action, ActionStatus

from .models import ActionSummary, ReviewItem, ReviewKind, SummaryDay
from .whatif import MAX_DAYS, daily_total_before, window_start

# Days summarised per pass at most: one day of 10M actions over 90 days is about 110,000 rows (decision 39).
DAYS_PER_PASS = 1


def summarise_due(now=None):
    """A sweeper step: the closed days of the what-if's longest window without a fresh summary,
    newest first, are summarised; the days before that window are forgotten. Returns how many."""
    if connection.vendor != "postgresql":
        return 0
    with connection.cursor() as cursor:
        # The day before the oldest transaction still open is the last one that is over. Today
        # is the database's: the rule that marks a past day stale reads its clock, and a day
        # summarised while a writer's clock still has it as today would miss that writer's change.
        cursor.execute("SELECT min(xact_start), statement_timestamp() FROM pg_stat_activity "
                       "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        oldest_open, database_now = cursor.fetchone()
    today = window_start(1, now or database_now)
    oldest = window_start(MAX_DAYS, now or database_now).date()
    SummaryDay.objects.filter(day__lt=oldest).delete()
    closed_before = min(today, oldest_open or today).astimezone(UTC).date()
    fresh = set(SummaryDay.objects.filter(day__gte=oldest, stale=False).values_list("day", flat=True))
    due = [day for day in (closed_before - timedelta(days=i + 1) for i in range((closed_before - oldest).days))
           if day not in fresh]
    for day in due[:DAYS_PER_PASS]:
        summarise(day)
    return len(due[:DAYS_PER_PASS])


@transaction.atomic
def summarise(day):
    """The summary of one day (a date, UTC), written over the one it had: the day's actions with
    their customer's total before them (the what-if's own query), grouped in SQL, with the
    running counts over the first requests of the day in amount order."""
    SummaryDay.objects.bulk_create([SummaryDay(day=day, stale=False, summarised_at=timezone.now())],
                                   update_conflicts=True, unique_fields=["day"],
                                   update_fields=["stale", "summarised_at"])
    ActionSummary.objects.filter(day=day).delete()
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    actions = (Action.objects.filter(created_at__gte=start, created_at__lt=start + timedelta(days=1))
               .exclude(currency="").exclude(status=ActionStatus.SHADOW).order_by()
               .annotate(total_before=daily_total_before("action_type", "currency"),
                         asked=Exists(ReviewItem.objects.filter(action=OuterRef("pk"), kind=ReviewKind.APPROVAL)))
               .values_list("action_type", "currency", "amount", "total_before", "asked", "supersedes_id"))
    rows, params = actions.query.sql_with_params()
    first = "amount IS NOT NULL AND total_before = 0"
    with connection.cursor() as cursor:
        # A version (supersedes set) is no request (whatif.REQUESTED), but in the totals of the
        # requests after it; without an amount, the verdict does not look at the total.
        cursor.execute(f"""
            INSERT INTO {ActionSummary._meta.db_table}
                   (day_id, action_type, currency, amount, total_before, n, asked, n_upto, asked_upto)
            SELECT %s, action_type, currency, amount, total_before, n, asked,
                   CASE WHEN {first} THEN sum(n) OVER upto ELSE 0 END,
                   CASE WHEN {first} THEN sum(asked) OVER upto ELSE 0 END
              FROM (SELECT action_type, currency, amount, CASE WHEN amount IS NULL THEN 0 ELSE total_before END
                           AS total_before, count(*) AS n, count(*) FILTER (WHERE asked) AS asked
                      FROM ({rows}) AS r (action_type, currency, amount, total_before, asked, version_of)
                     WHERE version_of IS NULL
                     GROUP BY 1, 2, 3, 4) AS g
            WINDOW upto AS (PARTITION BY action_type, currency, ({first}) ORDER BY amount)""", [day, *params])
