"""The web servers' WSGI application: Django's, behind `chunked_bodies_read`.

`read_chunked`, the one rule by which a chunked body is read, needs no Django set up: the shards'
router (sharding/router.py), which runs without settings, reads its bodies by it too. So importing this module
sets nothing up; `application` is made when it is first asked for (gunicorn's `config.wsgi`,
Django's WSGI_APPLICATION)."""

import json
import os
import tempfile
from http import HTTPStatus

from django.conf import settings
from django.utils.http import parse_header_parameters

from ledger.api.wire import problem_body

# How much of a chunked body is read at a time into its file.
_PIECE = 64 * 1024


class UnreadableBody(Exception):
    """The server could not de-chunk the body (a malformed chunk): the client's fault, a 400."""

    title, detail = "Unreadable body", "The body's chunked transfer encoding could not be read."


def read_chunked(environ, limit, in_memory=None):
    """A body sent chunked (no Content-Length), as streaming clients send one, handed on as a body
    with its length (`wsgi.input` and CONTENT_LENGTH replaced); its length, or None for any other
    request.

    Django reads CONTENT_LENGTH bytes of the input and, without it, none: the API saw an empty
    body and a webhook failed its signature; the router read the same way. gunicorn de-chunks the
    body and says the input ends where the body does (`wsgi.input_terminated`), so it is read here,
    up to one byte more than `limit`, the most the application takes: a longer one goes on as those
    bytes and that length, which the application refuses as it refuses a body with a Content-Length
    past it; its rest is never read. It is kept in memory up to `in_memory` bytes (all of it by
    default), past them in a temporary file, as Django keeps an uploaded file. Without the flag
    (Django's runserver) the input is the raw connection: reading it could run past the body or
    wait for bytes that never come, so the body stays unread, as Django leaves it. UnreadableBody
    if the server could not de-chunk it."""
    if not environ.get("wsgi.input_terminated") or environ.get("CONTENT_LENGTH"):
        return None
    body = tempfile.SpooledTemporaryFile(max_size=limit + 1 if in_memory is None else in_memory)
    try:
        # gunicorn's input returns the size asked for, or all there is left.
        while (left := limit + 1 - body.tell()) and (piece := environ["wsgi.input"].read(min(left, _PIECE))):
            body.write(piece)
    except Exception as exc:  # a malformed chunk: gunicorn raises its own parse errors
        body.close()
        raise UnreadableBody(str(exc)) from exc
    length = body.tell()
    if length:
        body.seek(0)
        environ["wsgi.input"], environ["CONTENT_LENGTH"] = body, str(length)
    return length


def uploads_max_bytes():
    """The longest form with a file the dashboard takes sent chunked: the largest file it reads
    (an evidence record to check) and the form's other fields, which Django bounds by
    DATA_UPLOAD_MAX_MEMORY_SIZE (it never counts a file there)."""
    from console.evidence_views import EVIDENCE_FILE_MAX_BYTES  # the app is set up by now

    return EVIDENCE_FILE_MAX_BYTES + settings.DATA_UPLOAD_MAX_MEMORY_SIZE


def chunked_bodies_read(app):
    """Django's `app` with a chunked body read (`read_chunked`). A body is read up to
    DATA_UPLOAD_MAX_MEMORY_SIZE, the most Django keeps of a body in memory, and refused past it by
    each limit (the API's, a webhook's, Django's) as one with a Content-Length is. A form with a file
    (multipart/form-data) is another matter: Django streams a file to disk whatever its length, so
    cut at that size its file would be lost unsaid. It is read whole, into a temporary file past
    that size, up to `uploads_max_bytes`, and so reaches the view as it would with its length;
    past that bound it is refused here, 413, its rest unread."""

    def application(environ, start_response):
        upload = _content_type(environ) == "multipart/form-data"
        limit = uploads_max_bytes() if upload else settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        try:
            length = read_chunked(environ, limit, in_memory=settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)
        except UnreadableBody:
            return _refused(start_response, 400, UnreadableBody.title, UnreadableBody.detail)
        if upload and length is not None and length > limit:
            environ["wsgi.input"].close()
            return _refused(start_response, 413, "Body too large",
                            f"A form sent chunked is read up to {limit} bytes; send a smaller file.")
        if not length:
            return app(environ, start_response)
        return _closing(app(environ, start_response), environ["wsgi.input"])

    return application


def _closing(response, body):
    """`response`, and with it the body read here (a temporary file past the memory's bound),
    closed when the server closes the response: nothing else closes an input the server did not
    open, and the file, unlinked, would hold its descriptor and its disk until collected."""
    try:
        yield from response
    finally:
        try:
            if hasattr(response, "close"):
                response.close()
        finally:
            body.close()


def _content_type(environ):
    return parse_header_parameters(environ.get("CONTENT_TYPE", ""))[0]


def _refused(start_response, status, title, detail):
    """A chunked body refused: a problem, as every refusal of a body is. The connection is closed:
    the rest of the body may not have been read."""
    body = json.dumps(problem_body(status, "invalid", title, detail)).encode()
    start_response(f"{status} {HTTPStatus(status).phrase}", [
        ("Content-Type", "application/problem+json"), ("Content-Length", str(len(body))), ("Connection", "close")])
    return [body]


def __getattr__(name):
    """`application`, made when first asked for (PEP 562), then an attribute as any other."""
    if name != "application":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from django.core.wsgi import get_wsgi_application

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    global application
    application = chunked_bodies_read(get_wsgi_application())
    return application
