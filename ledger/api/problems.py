"""RFC 9457 problem details for every 4xx the API gives, DRF's own included."""

import json
import math
from decimal import Decimal

from django.conf import settings
from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.http import Http404, JsonResponse
from rest_framework import exceptions, status
from rest_framework.parsers import JSONParser
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response

from ledger.json_input import lone_surrogate

from .wire import problem_body

# DRF's exception classes -> the stable `code` of the contract.
_CODES = {
    exceptions.NotAuthenticated: "unauthenticated",
    exceptions.AuthenticationFailed: "unauthenticated",
    exceptions.PermissionDenied: "forbidden",
    exceptions.NotFound: "not_found",
    exceptions.MethodNotAllowed: "method_not_allowed",
    exceptions.NotAcceptable: "not_acceptable",
    exceptions.UnsupportedMediaType: "unsupported_media_type",
    exceptions.Throttled: "throttled",
    exceptions.ParseError: "invalid",
    exceptions.ValidationError: "invalid",
}


class Problem(exceptions.APIException):
    """An API error with a contract code; `errors` maps fields to messages; `members`, more of the
    problem's own members (RFC 9457 extensions), such as `recorded_under`."""

    def __init__(self, status_code, code, title, detail="", errors=None, **members):
        super().__init__(detail or title)
        self.status_code = status_code
        self.problem_code = code
        self.title = title
        self.errors = errors
        self.members = members


def _messages(detail):
    """DRF's nested error details, flattened to {field: [messages]} (dotted for nesting)."""
    if isinstance(detail, dict):
        flat = {}
        for field, value in detail.items():
            nested = _messages(value)
            if isinstance(nested, dict):
                flat.update({f"{field}.{k}" if k != "non_field_errors" else field: v for k, v in nested.items()})
            else:
                flat[field] = nested
        return flat
    if isinstance(detail, list):
        if any(isinstance(item, dict) for item in detail):
            return _messages({str(i): item for i, item in enumerate(detail)})
        return [str(item) for item in detail]
    return [str(detail)]


def problem_exception_handler(exc, context):
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
    elif isinstance(exc, RequestDataTooBig):
        exc = body_too_large()
    if not isinstance(exc, exceptions.APIException):
        return None
    # Imported here: rest_framework.views reads the parser setting, which names this module.
    from rest_framework.views import set_rollback

    set_rollback()
    if isinstance(exc, Problem):
        body = {**problem_body(exc.status_code, exc.problem_code, exc.title, str(exc.detail), exc.errors),
                **exc.members}
    elif isinstance(exc, exceptions.ValidationError):
        errors = _messages(exc.detail)
        if isinstance(errors, list):
            errors = {"body": errors}
        body = problem_body(400, "invalid", "Invalid request", "The request did not pass validation.", errors)
    elif isinstance(exc, exceptions.ParseError):
        # An unreadable body is a validation error of the body as a whole (docs/contract.md: code
        # `invalid` comes with `errors`).
        body = problem_body(400, "invalid", "Invalid request", str(exc.detail), {"body": [str(exc.detail)]})
    else:
        code = next((c for cls, c in _CODES.items() if isinstance(exc, cls)), "error")
        body = problem_body(exc.status_code, code, _title(exc), str(exc.detail))
    # A problem is JSON whatever renderer the view negotiated or `?format=` named (the schema's is
    # YAML): DRF renders the answer with the request's.
    request = context.get("request")
    if request is not None:
        request.accepted_renderer, request.accepted_media_type = JSONRenderer(), JSONRenderer.media_type
    response = Response(body, status=exc.status_code, content_type="application/problem+json")
    if isinstance(exc, (exceptions.NotAuthenticated, exceptions.AuthenticationFailed)):
        response["WWW-Authenticate"] = 'Bearer realm="api"'
    if getattr(exc, "wait", None):
        response["Retry-After"] = str(math.ceil(exc.wait))
    return response


def _title(exc):
    return {400: "Bad request", 401: "Unauthenticated", 403: "Forbidden", 404: "Not found",
            405: "Method not allowed", 406: "Not acceptable", 415: "Unsupported media type",
            429: "Too many requests"}.get(exc.status_code, "Error")


def body_too_large():
    limit = settings.API_MAX_BODY_BYTES
    return Problem(400, "invalid", "Invalid request", f"The body is larger than {limit // 1024} KiB.",
                   {"body": [f"at most {limit} bytes"]})


def _no_constants(name):
    raise ValueError(f"{name} is not JSON")


# How deeply a body may nest (the body itself is level 1). The contract's bodies are two levels
# (an action's params, a task's input, each of plain values); one parsed just short of the
# interpreter's recursion limit exhausts the stack again in the view, which recurses over it (a
# field's str() of a value): a 500. Refused well before that.
MAX_NESTING = 32
TOO_DEEP = "The body is nested too deeply."


def _nested_deeper_than(data, levels):
    """Whether parsed JSON `data` nests objects or arrays more than `levels` deep: a loop, not
    recursion, for the reason above."""
    pending = [(data, 1)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, dict | list):
            if depth > levels:
                return True
            pending.extend((item, depth + 1) for item in (value.values() if isinstance(value, dict) else value))
    return False


class BoundedJSONParser(JSONParser):
    """JSON bodies of at most API_MAX_BODY_BYTES; numbers with a fraction become Decimal,
    never float, so an amount sent as a number is seen (and refused) as what it is."""

    def parse(self, stream, media_type=None, parser_context=None):
        limit = settings.API_MAX_BODY_BYTES
        raw = stream.read(limit + 1) if stream is not None else b""
        if len(raw) > limit:
            raise body_too_large()
        if not raw:
            raise exceptions.ParseError("The body is empty; a JSON object is expected.")
        try:
            data = json.loads(raw.decode("utf-8"), parse_float=Decimal, parse_constant=_no_constants)
        except (ValueError, UnicodeDecodeError) as exc:
            raise exceptions.ParseError(f"The body is not valid JSON: {exc}") from exc
        except RecursionError:
            raise exceptions.ParseError(TOO_DEEP) from None
        # Nesting needs a bracket a level, so a body with fewer is not walked.
        if raw.count(b"[") + raw.count(b"{") > MAX_NESTING and _nested_deeper_than(data, MAX_NESTING):
            raise exceptions.ParseError(TOO_DEEP)
        # Only a \u escape makes one (the UTF-8 decoding refuses an encoded surrogate), so a body
        # without any is not walked.
        if b"\\u" in raw and lone_surrogate(data):
            raise exceptions.ParseError("The body is not valid JSON: a \\u escape names a lone surrogate, which is "
                                        "no character.")
        return data


def api_not_found(request, exception=None):
    """Unknown URLs under /api/ answer as problems too (config/urls.py's handler404)."""
    return problem_response(status.HTTP_404_NOT_FOUND, "not_found", "Not found", "No such resource.")


def problem_response(status_code, code, title, detail):
    """A problem answered outside DRF's views (unknown API URLs, the site probe, webhooks)."""
    return JsonResponse(problem_body(status_code, code, title, detail), status=status_code,
                        content_type="application/problem+json")
