"""How many actions there are per status, cheaply enough for the overview's poll and
/metrics' scrape: exact where someone must act, PostgreSQL's estimate where only the order of
magnitude matters."""

from django.db import connection
from django.db.models import Count

from .models import IN_FLIGHT_STATUSES, Action, ActionStatus


def planner_estimates(model, column):
    """{value: rows} for the most common values of `column`, as PostgreSQL's planner estimates
    `column = value`: the row count of the table's last ANALYZE (pg_class.reltuples) scaled to
    the pages it has now, times the value's share in ANALYZE's sample (pg_stats). A catalog
    lookup instead of a scan (decision 38); empty until the table has been analysed
    (autovacuum does it as the table grows)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT v.value,"
            "       v.freq * c.reltuples / c.relpages * (pg_relation_size(c.oid) / current_setting('block_size')::int)"
            " FROM pg_class c JOIN pg_stats s ON s.schemaname = current_schema() AND s.tablename = c.relname"
            " CROSS JOIN unnest(s.most_common_vals::text::text[], s.most_common_freqs) AS v(value, freq)"
            " WHERE c.oid = %s::regclass AND s.attname = %s AND c.relpages > 0 AND c.reltuples >= 0",
            [model._meta.db_table, model._meta.get_field(column).column])
        return dict(cursor.fetchall())


# Above this many actions in one of the statuses that only grow with history, an estimate
# stands in for an exact count (see action_counts).
HISTORY_EXACT_UP_TO = 1000


def action_counts():
    """Actions per status, for the overview (polled every 3 s) and /metrics.

    An exact `GROUP BY status` reads the whole table, and grows with history (decision 38).
    What an operator needs from these figures differs by status:

    - work in flight or waiting for a person (IN_FLIGHT_STATUSES: queued, pending, unknown,
      awaiting approval, held, needs review) is counted exactly: it is what someone must act
      on, its size is bounded by the backlog rather than by history, and action_runnable_idx
      (status, next_attempt_at) counts it with an index-only scan;
    - the statuses that only accumulate (succeeded, failed, rejected, cancelled) are counted
      exactly up to HISTORY_EXACT_UP_TO rows each (a bounded index-only scan); beyond that the
      page shows PostgreSQL's own estimate, e.g. "≈930,000" (see planner_estimates). There the
      order of magnitude is what the overview is for; the ledger search lists the rows.

    Returns ({status: exact count, or HISTORY_EXACT_UP_TO + 1 where capped}, {capped status:
    the planner's estimate, 0 where it has none yet}).
    """
    statuses = list(ActionStatus.values)
    if connection.vendor != "postgresql":  # SQLite, in development: small tables, counted exactly
        counts = dict.fromkeys(statuses, 0)
        counts.update(Action.objects.order_by().values_list("status").annotate(n=Count("id")).values_list("status", "n"))
        return counts, {}
    caps = [None if status in IN_FLIGHT_STATUSES else HISTORY_EXACT_UP_TO + 1 for status in statuses]
    with connection.cursor() as cursor:
        # One statement for all statuses: per status, count its rows, stopping after `cap`
        # (LIMIT NULL counts them all).
        cursor.execute(
            f"SELECT s.status, (SELECT count(*) FROM (SELECT 1 FROM {Action._meta.db_table} a"
            "                            WHERE a.status = s.status LIMIT s.cap) AS n)"
            " FROM unnest(%s::text[], %s::int[]) AS s(status, cap)", [statuses, caps])
        counts = dict(cursor.fetchall())
    capped = [s for s in statuses if s not in IN_FLIGHT_STATUSES and counts[s] > HISTORY_EXACT_UP_TO]
    planner = planner_estimates(Action, "status") if capped else {}
    return counts, {status: round(planner.get(status) or 0) for status in capped}
