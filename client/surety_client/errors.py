"""Typed errors: one class per stable problem `code` of the API (application/problem+json)."""

from __future__ import annotations

from typing import Any


class SuretyError(Exception):
    """Anything this client raises."""


class SuretyUnreachable(SuretyError):
    """The transport kept failing (refused, timed out, 5xx) after every retry. Whether the last
    request reached Surety is unknown: call again with the same operation key, which can never
    add a second action."""

    def __init__(self, message: str, *, operation_key: str | None = None, attempts: int = 0) -> None:
        super().__init__(message)
        self.operation_key = operation_key
        self.attempts = attempts


class Unsendable(SuretyError):
    """The request could not be sent as written (httpx's `LocalProtocolError`: a header value HTTP
    forbids, such as a key of your own ending in a space, or a token with a newline; a key or token
    that is not ASCII; a URL without `http://` or `https://`), or was redirected elsewhere (`http://`
    to `https://`) before the API saw it. Nothing was recorded, and sending it again unchanged would
    fail alike."""

    def __init__(self, message: str, *, operation_key: str | None = None) -> None:
        super().__init__(message)
        self.operation_key = operation_key


class Unreadable(SuretyError):
    """A 2xx answer that is not the API's: no JSON object of the resource's shape (a sign-in or
    maintenance page in front of Surety, a URL that is not where the API answers), or an answer
    whose body cannot be decoded (a proxy's broken Content-Encoding). Not retried: a page that
    stands in for the API, or a proxy that breaks it, answers alike. For a POST the request may have
    been recorded: call again with the same operation key, which can never add a second action."""

    def __init__(self, message: str, *, operation_key: str | None = None) -> None:
        super().__init__(message)
        self.operation_key = operation_key


class ActionNotDone(SuretyError):
    """An action ended without its effect by a decision, not by a failure (`Action.raise_for_outcome`);
    `action` is the action as the API answered it."""

    code = "action_not_done"

    def __init__(self, action: Any) -> None:
        self.action = action
        review = action.review
        said = f" by {review.by}: {review.reason}" if review and review.by else ""
        super().__init__(f"{action.operation_key} is {action.status}{said}")


class ApprovalExpired(ActionNotDone):
    """Nobody approved or rejected the action within its approval window (error code
    `approval_expired`). Not a person's no: the same intent may be asked again under a new
    decision, if it still stands."""

    code = "approval_expired"


class ActionRejected(ActionNotDone):
    """A person rejected or cancelled the action: do not ask again for the same decision."""

    code = "action_rejected"


class Problem(SuretyError):
    """A 4xx answer of the API. `code` is the contract's stable code; `errors` maps fields to
    messages for validation errors (whatever else a body's `errors` is, a proxy's list or string,
    its messages under NO_FIELD); `retry_after` the seconds its `Retry-After` asks to wait before
    sending it again (a 429), else None; `operation_key` the key the request was sent under (None
    for a read)."""

    code = "error"

    def __init__(self, body: dict[str, Any], status: int, retry_after: float | None = None, *,
                 operation_key: str | None = None) -> None:
        self.body = body
        self.status = status
        self.operation_key = operation_key
        # The answer's own code: a code this client has no class for yet is still told apart.
        self.code = body.get("code", self.code)
        self.retry_after = retry_after
        self.title: str = body.get("title", "")
        self.detail: str = body.get("detail", "")
        self.errors = _by_field(body.get("errors"))
        self.recorded_under: str | None = body.get("recorded_under")
        super().__init__(f"{status} {body.get('code', self.code)}: {self.detail or self.title}")


# Where the API puts messages that name no field (Django REST framework's name).
NO_FIELD = "non_field_errors"


def _by_field(errors: Any) -> dict[str, list[str]]:
    """A problem's `errors` as the contract writes them, `{field: [messages]}`, whatever the body held."""
    if not errors:
        return {}
    if not isinstance(errors, dict):
        return {NO_FIELD: _messages(errors)}
    return {str(field): _messages(messages) for field, messages in errors.items()}


def _messages(said: Any) -> list[str]:
    return [str(message) for message in said] if isinstance(said, list) else [str(said)]


class Unauthenticated(Problem):
    code = "unauthenticated"


class Forbidden(Problem):
    code = "forbidden"


class NotFound(Problem):
    code = "not_found"


class MethodNotAllowed(Problem):
    code = "method_not_allowed"


class NotAcceptable(Problem):
    code = "not_acceptable"


class UnsupportedMediaType(Problem):
    code = "unsupported_media_type"


class Throttled(Problem):
    code = "throttled"


class Invalid(Problem):
    code = "invalid"


class IdempotencyKeyMissing(Problem):
    code = "idempotency_key_missing"


class OperationKeyExpired(Problem):
    """The key is past its lifetime (410): nothing was executed or recorded under it now. What
    it named may well have been done back then: a new key for the same intent would do it again."""

    code = "operation_key_expired"


class CurrencyNotCovered(Problem):
    """No limit of the action type covers the currency and the deployment refuses such requests
    (422); nothing was recorded."""

    code = "currency_not_covered"


class IdempotencyKeyReused(Problem):
    """The key was already used for a different request, or the decision's effect is recorded
    with other params (another amount for the same refund); nothing was changed."""

    code = "idempotency_key_reused"

    @property
    def recorded_key(self) -> str | None:
        """The key of the request that stands: the one the answer names (`recorded_under`) when the
        decision's effect is recorded under another key, else the key this request was sent under
        (whose request may be another agent's, which this agent cannot read)."""
        return self.recorded_under or self.operation_key


class BookingConflict(Problem):
    code = "booking_conflict"


class MessageAlreadySent(Problem):
    """Another agent's message to this recipient, of this type, for this decision is recorded."""

    code = "message_already_sent"


class RefundAlreadyRecorded(Problem):
    """Another agent's refund of this order for this decision is recorded; nothing was recorded."""

    code = "refund_already_recorded"


PROBLEMS: dict[str, type[Problem]] = {
    cls.code: cls
    for cls in (
        Unauthenticated, Forbidden, NotFound, MethodNotAllowed, NotAcceptable, UnsupportedMediaType, Throttled,
        Invalid, IdempotencyKeyMissing, IdempotencyKeyReused, OperationKeyExpired, CurrencyNotCovered,
        BookingConflict, MessageAlreadySent, RefundAlreadyRecorded,
    )
}


def problem_from(status: int, body: Any, retry_after: float | None = None, *,
                 operation_key: str | None = None) -> Problem:
    """The typed error for a 4xx answer; a body that is not a problem (no `code` string) still gives
    a Problem. A 429 is a rate limit whoever answers it, and the API's says `throttled`: a gateway's
    in front of the API, with a page or a JSON of its own (`{"code": 429}`), is Throttled all the
    same, to wait for and send again, not a refusal."""
    ours = isinstance(body, dict) and isinstance(body.get("code"), str)
    if not ours or status == 429 and body["code"] != "throttled":
        body = {"code": "throttled" if status == 429 else "error", "status": status, "title": "Error",
                "detail": str(body)[:500]}
    return PROBLEMS.get(body["code"], Problem)(body, status, retry_after, operation_key=operation_key)
