"""Small helpers shared by the dashboard's function views."""

import base64
import functools

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.db.models import Count, Q
from django.http import HttpResponse, HttpResponseBadRequest
from django.shortcuts import render, resolve_url
from django.template import TemplateDoesNotExist
from django.template.loader import get_template
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from .access import ROLES
from .models import IN_FLIGHT_STATUSES, Action, ActionStatus

PAGE_SIZE = 50


def staff_required(view):
    """Logged in and in one of the dashboard's groups (or a superuser). An htmx poll whose
    session expired is sent to the login page as a whole, not swapped into a fragment."""

    @functools.wraps(view)
    def wrapper(request, *args, **kwargs):
        user = request.user
        if not user.is_authenticated:
            if request.htmx:
                return HttpResponse(status=204, headers={"HX-Redirect": f"{resolve_url(settings.LOGIN_URL)}?next={request.path}"})
            return redirect_to_login(request.get_full_path())
        if not (user.is_superuser or user.groups.filter(name__in=ROLES).exists()):
            raise PermissionDenied("the dashboard is for operators, approvers, auditors and admins")
        # PostgreSQL text cannot hold NUL: any query or save carrying one would fail.
        # Refused here, once, for every page.
        if any("\x00" in value for params in (request.GET, request.POST) for value in _all_values(params)):
            return HttpResponseBadRequest("NUL characters are not allowed in parameters.")
        return view(request, *args, **kwargs)

    return wrapper


def _all_values(params):
    for key, values in params.lists():
        yield key
        yield from values


# The largest id PostgreSQL's bigint holds: a cursor naming a larger one cannot be queried.
MAX_PK = 2**63 - 1


def parse_moment(value):
    """A filter's date-time (ISO 8601, or a datetime-local input's naive one, taken in the
    current time zone) as an aware datetime; None for a missing or malformed one.

    `parse_datetime` raises ValueError for well-formed but impossible values
    ("2026-13-45T99:99"), and an offset at the edge of the calendar
    ("0001-01-01T00:00+01:00") overflows when converted."""
    try:
        moment = parse_datetime((value or "").strip())
        if moment is None:
            return None
        if timezone.is_naive(moment):
            moment = timezone.make_aware(moment)
        moment.astimezone(timezone.get_current_timezone())  # raises OverflowError out of range
        return moment
    except (ValueError, OverflowError):
        return None


def keyset_page(queryset, cursor, *, time_field="created_at", size=PAGE_SIZE, newest_first=True):
    """Ordered by (time, id), newest first unless told otherwise; `cursor` names the last
    row seen. Cost does not grow with the page number, unlike OFFSET.
    Returns (rows, next_cursor or None)."""
    beyond = "lt" if newest_first else "gt"
    if cursor:
        try:
            stamp, pk = base64.urlsafe_b64decode(cursor.encode()).decode().split("|")
            # A naive, out-of-range or non-ISO stamp and an id past bigint were
            # 500s (RuntimeWarning, OverflowError, DataError); they show the first page now.
            moment = parse_moment(stamp)
            if moment is None or not 0 <= int(pk) <= MAX_PK:
                raise ValueError("a mangled cursor")
            queryset = queryset.filter(
                Q(**{f"{time_field}__{beyond}": moment}) | Q(**{time_field: moment, f"pk__{beyond}": int(pk)})
            )
        except (ValueError, UnicodeDecodeError):
            pass  # a mangled cursor shows the first page
    sign = "-" if newest_first else ""
    rows = list(queryset.order_by(f"{sign}{time_field}", f"{sign}pk")[: size + 1])
    if len(rows) <= size:
        return rows, None
    last = rows[size - 1]
    token = f"{getattr(last, time_field).isoformat()}|{last.pk}"
    return rows[:size], base64.urlsafe_b64encode(token.encode()).decode()


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


def shown_estimate(estimate, exact_up_to):
    """How a count past `exact_up_to` is shown: the estimate to two significant digits (as
    precise as it is), "≈930,000"; or "1,000+" (the cap) if there is no usable estimate yet."""
    estimate = round(estimate or 0)
    if estimate <= exact_up_to:
        return f"{exact_up_to:,}+"
    return f"≈{round(estimate, 2 - len(str(estimate))):,}"


def count_up_to(queryset, cap):
    """The exact count of `queryset` if it is at most `cap` (a scan bounded by it), else
    "10,000+": true and current, where an estimate would lag until the next ANALYZE."""
    n = queryset.order_by().values("pk")[: cap + 1].count()
    return n if n <= cap else f"{cap:,}+"


def render_partial(request, template, partial, context):
    """htmx asks for one named fragment of the page; a plain request gets the page."""
    name = f"{template}#{partial}" if request.htmx and partial else template
    # The overview takes the fragment's name from ?partial=: an unknown one is a 400.
    if name != template:
        try:
            get_template(name)
        except TemplateDoesNotExist:
            return HttpResponseBadRequest("no such fragment")
    return render(request, name, context)


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
