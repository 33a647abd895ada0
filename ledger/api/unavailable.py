"""503, never 500, while the database is unreachable: for the API and the dashboard alike.

A view that found the database unreachable (at connect, or its connection died midway)
answers 503 with Retry-After: problem+json (code `database_unavailable`) for the API and any
client that does not ask for HTML, a short page for the dashboard. Whatever the request was
writing was rolled back with its transaction, so the same request may be sent again (an
intake, with the same key, records its one action). Logged once per outage (ledger.outages),
not a traceback per request. `server_error` (config.urls' handler500) answers the same for a
middleware that hit the database after the view, and Django's 500 page for anything else.

A transaction the database rolled back to break a deadlock is no outage: `503 busy` with
Retry-After 1, not logged as the database being away.
"""

import logging
import sys

from django.http import HttpResponse
from django.template.loader import render_to_string
from django.views.defaults import server_error as django_server_error

from ledger import outages

from .problems import problem_response

_REQUESTS_OUTAGE = outages.Outage("requests", logging.getLogger("surety.requests"))


class DatabaseUnavailableMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if response.status_code < 500:
            _REQUESTS_OUTAGE.answered()  # an attribute read, unless an outage was logged
        return response

    def process_exception(self, request, exception):
        return outage_response(request, exception)


def outage_response(request, exception):
    """The answer to a request that met the database out of reach (503, the outage logged) or a
    deadlock it broke (503 busy); None for any other error."""
    if outages.rolled_back(exception):  # the database is there: no outage to log
        return database_busy(request)
    if not outages.database_unreachable(exception):
        return None
    _REQUESTS_OUTAGE.failed(exception)
    return database_unavailable(request)


def database_busy(request):
    """503 with Retry-After 1 for a request whose transaction the database rolled back to break a
    deadlock: nothing of it was written, and sent again it may well go through."""
    if request.path.startswith("/api/") or "text/html" not in request.headers.get("Accept", ""):
        response = problem_response(
            503, "busy", "Busy", "Another request was changing the same rows at the same moment, and the database "
            "rolled this one's transaction back. Send the same request again.")
    else:
        response = HttpResponse(render_to_string("busy.html"), status=503)
    response["Retry-After"] = "1"
    return response


def database_unavailable(request):
    if request.path.startswith("/api/") or "text/html" not in request.headers.get("Accept", ""):
        response = problem_response(
            503, "database_unavailable", "Database unavailable",
            "The ledger's database could not be reached; nothing was half-written. Send the same request again, "
            "with the same Idempotency-Key, after Retry-After seconds: it is recorded once.")
    else:
        response = HttpResponse(render_to_string("503.html"), status=503)
    response["Retry-After"] = str(outages.RETRY_AFTER_SECONDS)
    return response


def server_error(request):
    """The answer to an error no view answered (one raised by a middleware: the session's read,
    say): the outage's or the deadlock's as the middleware's own, else Django's 500."""
    return outage_response(request, sys.exc_info()[1]) or django_server_error(request)
