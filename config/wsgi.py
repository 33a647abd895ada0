import json
import os
from io import BytesIO

from django.conf import settings
from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")


def chunked_bodies_read(app):
    """A body sent chunked (no Content-Length), as streaming clients send one, handed to Django as
    a body with its length.

    Django reads CONTENT_LENGTH bytes of the input and, without it, none: the API saw an empty
    body and a webhook failed its signature. gunicorn de-chunks the body and says the input ends
    where the body does (`wsgi.input_terminated`), so it is read here, up to one byte more than
    DATA_UPLOAD_MAX_MEMORY_SIZE, the most Django keeps of a body in memory. A longer one goes on as
    those bytes and that length, which each limit (the API's, a webhook's, Django's) refuses as it
    refuses a body with a Content-Length past it; its rest is never read. Without the flag (Django's
    runserver) the input is the raw connection: reading it could run past the body or wait for
    bytes that never come, so the body stays unread, as Django leaves it."""

    def application(environ, start_response):
        if environ.get("wsgi.input_terminated") and not environ.get("CONTENT_LENGTH"):
            # One read, as Django reads a body: gunicorn's returns the size asked for or all there is.
            try:
                body = environ["wsgi.input"].read(settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)
            except Exception:  # the server could not de-chunk it (a malformed chunk): the client's fault
                return _unreadable(start_response)
            if body:
                environ["wsgi.input"], environ["CONTENT_LENGTH"] = BytesIO(body), str(len(body))
        return app(environ, start_response)

    return application


def _unreadable(start_response):
    """A chunked body the server could not read: a problem, as every refusal of a body is."""
    from ledger.api.wire import problem_body  # the app is set up by now

    body = json.dumps(problem_body(400, "invalid", "Unreadable body",
                                   "The body's chunked transfer encoding could not be read.")).encode()
    start_response("400 Bad Request", [("Content-Type", "application/problem+json"),
                                       ("Content-Length", str(len(body))), ("Connection", "close")])
    return [body]


application = chunked_bodies_read(get_wsgi_application())
