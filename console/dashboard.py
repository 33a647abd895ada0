"""Small helpers shared by the dashboard's function views."""

import base64
import functools

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.db.models import Q
from django.http import HttpResponseBadRequest
from django.shortcuts import render

from ledger.access import ROLES
from ledger.validation import parse_moment

from .pages import page_to_return_to
from .signin import redirect

PAGE_SIZE = 50


def staff_required(view):
    """Logged in and in one of the dashboard's groups (or a superuser). An htmx request whose
    session expired sends the page to the login page as a whole, not swapped into a fragment."""

    @functools.wraps(view)
    def wrapper(request, *args, **kwargs):
        user = request.user
        if not user.is_authenticated:
            return redirect(request, redirect_to_login(_page_to_return_to(request)).url)
        if not (user.is_superuser or user.groups.filter(name__in=ROLES).exists()):
            raise PermissionDenied("the dashboard is for operators, approvers, auditors and admins")
        # PostgreSQL text cannot hold NUL: any query or save carrying one would fail.
        # Refused here, once, for every page.
        if any("\x00" in value for params in (request.GET, request.POST) for value in _all_values(params)):
            return HttpResponseBadRequest("NUL characters are not allowed in parameters.")
        return view(request, *args, **kwargs)

    return wrapper


def _page_to_return_to(request):
    """Where signing in again leads, with a GET: the address asked for, where a GET asked for a
    whole page (itself, not the one that linked to it: the Referer); else the page the person was
    on, or the nearest one a GET opens (`page_to_return_to`): a fragment's own address may answer
    only a POST, as the what-if's does, and a form posted from a POST's answer names that answer's
    address as its page."""
    if request.method in ("GET", "HEAD") and not request.htmx:
        return request.get_full_path()
    return page_to_return_to(request)


def _all_values(params):
    for key, values in params.lists():
        yield key
        yield from values


# The largest id PostgreSQL's bigint holds: a cursor naming a larger one cannot be queried.
MAX_PK = 2**63 - 1


BIGINT_MAX = 2**63 - 1


def posted_pk(text):
    """A row's id as a form posted it, or None: digits within a bigint. (Python's int() refuses
    more than 4,300 digits, PostgreSQL a parameter past a bigint: a 500 either way.)"""
    if text.isascii() and text.isdigit() and len(text) <= len(str(BIGINT_MAX)) and int(text) <= BIGINT_MAX:
        return int(text)
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


def shown_estimate(estimate, exact_up_to):
    """How a count past `exact_up_to` is shown: the estimate to two significant digits (as
    precise as it is), "≈930,000"; or "1,000+" (the cap) if there is no usable estimate yet."""
    estimate = round(estimate or 0)
    if estimate <= exact_up_to:
        return past_cap(exact_up_to)
    return f"≈{round(estimate, 2 - len(str(estimate))):,}"


def count_up_to(queryset, cap):
    """The exact count of `queryset` if it is at most `cap` (a scan bounded by it), else
    "10,000+": true and current, where an estimate would lag until the next ANALYZE."""
    n = queryset.order_by().values("pk")[: cap + 1].count()
    return n if n <= cap else past_cap(cap)


def past_cap(cap):
    """A count known only to be past `cap`, as every page writes it: "1,000+"."""
    return f"{cap:,}+"


def render_partial(request, template, partial, context):
    """htmx asks for one named fragment of the page; a plain request gets the page."""
    return render(request, f"{template}#{partial}" if request.htmx and partial else template, context)


def recent_reasons(decided, n=3):
    """The reasons given for `decided` (one person's decisions of one kind: review items or
    dead-letter entries, which keep the reason as `note`), newest first, each once: offered as
    one-click choices, so that a decision with a reason given before is one interaction."""
    notes = decided.exclude(note="").order_by("-decided_at").values_list("note", flat=True)[:20]
    return list(dict.fromkeys(notes))[:n]
