"""The typed client of Surety's agents' API (`/api/v1/`), built on httpx."""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from decimal import Decimal
from email.utils import parsedate_to_datetime
from functools import partial
from typing import Any, Protocol, TypeVar
from urllib.parse import quote

import httpx

from . import keys
from .errors import ActionRejected, ApprovalExpired, SuretyUnreachable, Unreadable, Unsendable, problem_from

# What the API answers for an action or a task the ledger is still working on; anything else
# is settled, or waits for a person.
WORKING_STATUSES = frozenset({"queued", "pending", "unknown"})
PERSON_STATUSES = frozenset({"awaiting_approval", "held", "needs_review"})
WORKING_STATES = frozenset({"queued", "running"})
MAX_WAIT = 30  # seconds the API holds a GET ?wait=N at most
# Seconds between reads while a person must decide: the API's wait answers at once then, and a
# person takes minutes, so a read every few seconds is soon enough and costs the API little.
PERSON_INTERVAL = 5.0
RETRY_STATUSES = frozenset({500, 502, 503, 504})


@dataclass(frozen=True)
class Review:
    """Where a person decides on an action (`url`, the dashboard page), and once they said no,
    who (`by`) and why (`reason`)."""

    url: str
    by: str | None
    reason: str | None


@dataclass(frozen=True)
class Version:
    """The version a person edited a superseded action into (a lower amount, say): it runs in
    the action's place. `by` edited it and says why (`reason`)."""

    operation_key: str
    url: str
    status: str
    params: dict[str, Any]
    by: str
    reason: str


@dataclass(frozen=True)
class Action:
    """The action resource. `replayed` is true when the API answered an earlier request's row."""

    operation_key: str
    action_type: str
    target: str
    customer: str
    decision_id: str
    task_id: str | None
    params: dict[str, Any]
    status: str
    attempts: int
    external_ref: str | None
    result: Any
    error: dict[str, Any] | None
    created_at: str
    updated_at: str
    url: str
    review: Review | None
    replayed: bool = False
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # The action a person edited down into this version, and the version that superseded this one.
    supersedes: str | None = None
    superseded_by: Version | None = None

    @classmethod
    def from_api(cls, body: dict[str, Any], *, replayed: bool = False) -> Action:
        review = body.get("review")
        version = body.get("superseded_by")
        return cls(
            operation_key=body["operation_key"], action_type=body["action_type"], target=body["target"],
            customer=body["customer"], decision_id=body["decision_id"], task_id=body["task_id"],
            params=body["params"], status=body["status"], attempts=body["attempts"],
            external_ref=body["external_ref"], result=body["result"], error=body["error"],
            created_at=body["created_at"], updated_at=body["updated_at"], url=body["url"],
            review=Review(review["url"], review.get("by"), review.get("reason")) if review else None,
            replayed=replayed, raw=body, supersedes=body.get("supersedes"),
            superseded_by=Version(**{f.name: version[f.name] for f in fields(Version)})
            if version else None,
        )

    @property
    def settled(self) -> bool:
        """The ledger is done with it: an outcome, or a person's decision is needed."""
        return self.status not in WORKING_STATUSES

    @property
    def needs_person(self) -> bool:
        """A person must decide (approve, release or resolve) before anything more happens."""
        return self.status in PERSON_STATUSES

    @property
    def done_by_hand(self) -> bool:
        """Failed, and a person then made its effect outside Surety (its dead letter, or its task's,
        resolved): it happened, and nothing retries it, a person's retry included."""
        return self.status == "failed" and bool((self.error or {}).get("done_by_hand"))

    @property
    def given_up(self) -> bool:
        """Failed, and a person then gave it up (its dead letter, or its task's, discarded): nothing
        was done, and nothing retries it."""
        return self.status == "failed" and bool((self.error or {}).get("given_up"))

    @property
    def redrivable(self) -> bool:
        """Failed, and a person may still retry it from the dead-letter queue under its own key,
        which never doubles it: a standalone action (a task's is its task's to retry), whether its
        failure is retryable or its cause must be fixed first, except a booking failed for good,
        which gave its slot up. Not one a person did by hand (`done_by_hand`), which a retry would
        do again, nor one a person gave up (`given_up`): its error says either once its dead-letter
        entry is closed, and nobody retries it."""
        return (self.status == "failed" and self.task_id is None and not (self.done_by_hand or self.given_up)
                and (self.action_type != "create_booking" or bool((self.error or {}).get("retryable"))))

    @property
    def expired(self) -> bool:
        """Nobody decided within the approval window: not a rejection (error code approval_expired)."""
        return self.status == "expired"

    def raise_for_outcome(self) -> Action:
        """This action, unless it ended without its effect by a decision: `ApprovalExpired`
        when nobody decided in time, `ActionRejected` when a person rejected or cancelled it.
        (A superseded action is not raised: its `superseded_by` version runs instead.)"""
        if self.status == "expired":
            raise ApprovalExpired(self)
        if self.status in ("rejected", "cancelled"):
            raise ActionRejected(self)
        return self


@dataclass(frozen=True)
class Step:
    status: str
    idempotency_key: str | None = None
    result: Any = None
    error: Any = None


@dataclass(frozen=True)
class Checkpoint:
    """A task's checkpoint: its state and its steps in execution order."""

    task_id: str
    workflow: str
    state: str
    attempts: int
    max_attempts: int
    steps: dict[str, Step]
    updated_at: str
    url: str
    last_error: Any = None
    next_attempt_at: str | None = None
    replayed: bool = False
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, body: dict[str, Any], *, replayed: bool = False) -> Checkpoint:
        return cls(
            task_id=body["task_id"], workflow=body["workflow"], state=body["state"], attempts=body["attempts"],
            max_attempts=body["max_attempts"], updated_at=body["updated_at"], url=body["url"],
            steps={name: Step(step["status"], step.get("idempotency_key"), step.get("result"), step.get("error"))
                   for name, step in body["steps"].items()},
            last_error=body.get("last_error"), next_attempt_at=body.get("next_attempt_at"),
            replayed=replayed, raw=body,
        )

    @property
    def settled(self) -> bool:
        return self.state not in WORKING_STATES

    @property
    def done_by_hand(self) -> bool:
        """A person finished it outside Surety (its dead letter resolved): its state stays where its
        work stopped (dead-lettered, failed), and nothing redrives it."""
        return bool((self.last_error or {}).get("done_by_hand"))

    @property
    def given_up(self) -> bool:
        """A person gave it up (its dead letter discarded): a dead-lettered task is cancelled, a failed
        one stays failed. Its done steps stand, and nothing runs the others."""
        return bool((self.last_error or {}).get("given_up"))

    @property
    def redrivable(self) -> bool:
        """Out of attempts: a person may redrive it from the dead-letter queue, and it resumes from
        its checkpoint (a failed task is final), unless a person finished it by hand
        (`done_by_hand`), which a redrive would do again."""
        return self.state == "dead_lettered" and not self.done_by_hand


class SuretyClient:
    """One agent's client: `SuretyClient("https://surety.example", token)`.

    Transport errors (refused or dropped connections, timeouts) and 5xx answers are retried
    up to `retries` more times with exponential backoff and full jitter, always with the same
    operation key, so a retry can only find the action already recorded, never add another.
    A 4xx answer raises the typed error of its problem code (`surety_client.errors`), and a 2xx
    answer that holds no resource of the API's (a sign-in page in front of it), or a body that cannot
    be decoded, `Unreadable`.
    """

    def __init__(self, base_url: str, token: str, *, timeout: float = 10.0, retries: int = 4,
                 backoff: float = 0.5, max_backoff: float = 8.0) -> None:
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        # Sent with each request rather than set on the httpx client: a token HTTP cannot carry (not
        # ASCII, a newline kept from a file) is then `Unsendable` at the call, as a key is, not an error
        # out of the constructor.
        self._authorization = f"Bearer {token}"
        self._token_fault = token_fault(token)
        self._http = httpx.Client(base_url=base_url.rstrip("/") + "/api/v1/")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> SuretyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- actions -------------------------------------------------------------------------
    def post_action(self, operation_key: str, *, action_type: str, target: str, params: dict[str, Any],
                    customer: str | None = None, decision_id: str | None = None) -> Action:
        """Record one guarded effect under `operation_key` (new: 201; the same again: replayed)."""
        body = {"action_type": action_type, "target": target, "customer": customer, "decision_id": decision_id,
                "params": _json_ready(params)}
        response = self._send("POST", "actions", key=operation_key, json=body)
        return _read(response, partial(Action.from_api, replayed=_replayed(response)), operation_key)

    def refund(self, *, order: str, amount: str | Decimal, currency: str, decision_id: str,
               customer: str | None = None, reason: str | None = None, scope: str | None = None) -> Action:
        """Refund `amount` of `order`, keyed `refund:{order}:{decision_id}` (with a `scope`,
        `refund:{order}:{scope}:{decision_id}`). The amount is never part of the key: the same
        decision with the amount spelt otherwise is the same refund, another amount is refused."""
        params: dict[str, Any] = {"amount": amount, "currency": currency}
        if reason is not None:
            params["reason"] = reason
        return self.post_action(keys.refund_key(order, decision_id, scope=scope), action_type="refund",
                                target=order, customer=customer, decision_id=decision_id, params=params)

    def send_message(self, *, recipient: str, channel: str, message_type: str, body: str, decision_id: str,
                     customer: str | None = None) -> Action:
        """Send one message, keyed per recipient, message type and decision."""
        return self.post_action(
            keys.message_key(recipient, message_type, decision_id), action_type="send_message", target=recipient,
            customer=customer, decision_id=decision_id,
            params={"channel": channel, "message_type": message_type, "body": body},
        )

    def create_booking(self, *, resource: str, customer: str, service: str, start: str, end: str,
                       decision_id: str) -> Action:
        """Book `resource` for `customer` from `start` to `end` (ISO 8601), keyed
        `create_booking:{resource}:{customer}:{decision_id}`: the service and times are what is
        asked, not the key, so the decision written again with other times is refused, not booked twice."""
        return self.post_action(
            keys.booking_key(resource, customer, decision_id), action_type="create_booking",
            target=resource, customer=customer, decision_id=decision_id,
            params={"service": service, "start": start, "end": end},
        )

    def get_action(self, operation_key: str, *, wait: float = 0) -> Action:
        """The action as it stands; with `wait` (at most 30 s) the API holds the answer until
        it settles or waits for a person."""
        response = self._send("GET", f"actions/{_segment(operation_key)}", wait=wait)
        return _read(response, Action.from_api)

    def wait_for(self, operation_key: str, timeout: float = 60.0, *, follow: bool = False,
                 stop: threading.Event | None = None) -> Action:
        """The action once it is settled (an outcome, or a person must decide), or as it stands
        when `timeout` seconds have passed, or when `stop` is set (from another thread: the wait ends
        after the read under way): check `Action.settled`. With `follow`, an action a person edited
        into a new version is followed to that version (within the same time)."""
        deadline = _deadline(timeout)
        action = _wait(lambda seconds: self.get_action(operation_key, wait=seconds), timeout, stop)
        while follow and action.superseded_by is not None and not _stopped(stop):
            key = action.superseded_by.operation_key
            action = _wait(lambda seconds: self.get_action(key, wait=seconds), max(0.0, deadline - time.monotonic()),
                           stop)
        return action

    def wait_for_outcome(self, operation_key: str, timeout: float = 60.0, *, interval: float = PERSON_INTERVAL,
                         redrive: bool = False, stop: threading.Event | None = None) -> Action:
        """The action once nobody needs to act on it any more, or as it stands when `timeout`
        seconds have passed or `stop` is set: as `wait_for`, and while a person must decide
        (`needs_person`) read again every `interval` seconds, as the API's wait does not hold for a
        person (`stop` cuts the pause short). With `redrive`, a failure a person may still retry
        (`Action.redrivable`) is waited through alike."""
        deadline = _deadline(timeout)
        while True:
            action = self.wait_for(operation_key, timeout=max(0.0, deadline - time.monotonic()), stop=stop)
            left = deadline - time.monotonic()
            if not (action.needs_person or redrive and action.redrivable) or left <= 0:
                return action
            if pause(min(interval, left), stop):
                return action

    # --- tasks ---------------------------------------------------------------------------
    def start_task(self, task_id: str, *, workflow: str, input: dict[str, Any]) -> Checkpoint:
        response = self._send("POST", "tasks", key=task_id, json={"workflow": workflow, "input": _json_ready(input)})
        return _read(response, partial(Checkpoint.from_api, replayed=_replayed(response)), task_id)

    def start_refund_task(self, *, order: str, amount: str | Decimal, currency: str, customer: str,
                          decision_id: str, reason: str | None = None, notify: str | None = None,
                          scope: str | None = None) -> Checkpoint:
        """The `refund` workflow (look up the order, refund, confirm, notify), with the task id
        `task:refund:{order}:{decision_id}` (with a `scope`, `task:refund:{order}:{scope}:{decision_id}`).
        The decision goes in the task's input too: the ledger holds one refund per order and decision,
        so this task and a `refund` for the same decision (or a task under another scope) are one."""
        given = {"reason": reason, "notify": notify}
        task_input = {"order_id": order, "amount": amount, "currency": currency, "customer": customer,
                      "decision_id": decision_id.strip(),
                      **{name: value for name, value in given.items() if value is not None}}
        return self.start_task(keys.refund_task_id(order, decision_id, scope=scope), workflow="refund",
                               input=task_input)

    def get_task(self, task_id: str, *, wait: float = 0) -> Checkpoint:
        """A task's checkpoint; with `wait` (at most 30 s) held until it leaves queued/running."""
        response = self._send("GET", f"tasks/{_segment(task_id)}", wait=wait)
        return _read(response, Checkpoint.from_api)

    def wait_for_task(self, task_id: str, timeout: float = 60.0, *, interval: float = PERSON_INTERVAL,
                      redrive: bool = False, stop: threading.Event | None = None) -> Checkpoint:
        """The checkpoint once the task leaves queued/running, or as it stands when `timeout` seconds
        have passed or `stop` is set (as `wait_for`'s). With `redrive`, a dead-lettered task
        (`Checkpoint.redrivable`) is read again every `interval` seconds until a person redrives it:
        the API's wait does not hold for one."""
        deadline = _deadline(timeout)
        while True:
            task = _wait(lambda seconds: self.get_task(task_id, wait=seconds), max(0.0, deadline - time.monotonic()),
                         stop)
            left = deadline - time.monotonic()
            if not (redrive and task.redrivable) or left <= 0:
                return task
            if pause(min(interval, left), stop):
                return task

    # --- transport -------------------------------------------------------------------------
    def _send(self, method: str, path: str, *, key: str | None = None, wait: float = 0,
              json: dict[str, Any] | None = None) -> httpx.Response:
        """One request, retried on transport errors and 5xx with the same key."""
        if self._token_fault:
            # Refused here rather than by httpx, whose error repeats the header it refuses: the token,
            # into a log or a model's context.
            raise Unsendable(f"{method} {path} cannot be sent: the token {self._token_fault}", operation_key=key)
        headers = {"Authorization": self._authorization, **({"Idempotency-Key": key} if key is not None else {})}
        params = {"wait": _seconds(wait)} if wait else None
        # A held GET answers after up to `wait` seconds: the read timeout must outlast it.
        timeout = httpx.Timeout(self.timeout, read=self.timeout + wait)
        failure = ""
        retry_after = 0.0
        for attempt in range(self.retries + 1):
            if attempt:
                jitter = random.uniform(0, min(self.max_backoff, self.backoff * 2 ** (attempt - 1)))
                time.sleep(max(jitter, min(self.max_backoff, retry_after)))
            try:
                response = self._http.request(method, path, headers=headers, params=params, json=json,
                                              timeout=timeout)
            except (httpx.LocalProtocolError, httpx.UnsupportedProtocol) as exc:
                # Refused as written before it went out (by h11, or a URL without http:// or https://):
                # a retry would be refused alike.
                raise Unsendable(f"{method} {path} cannot be sent as written: {exc}", operation_key=key) from exc
            except UnicodeEncodeError as exc:
                # HTTP headers are ASCII: a key of one's own with any other character.
                raise Unsendable(f"{method} {path} cannot be sent: its key is not ASCII ({exc})",
                                 operation_key=key) from exc
            except httpx.DecodingError as exc:
                # Read, and not decodable (a proxy's broken Content-Encoding): no answer of the API's,
                # and one that breaks it breaks it alike, so not retried; a POST may be recorded.
                raise _unreadable(f"{method} {path} answered a body that cannot be decoded ({exc})", key) from exc
            except httpx.TransportError as exc:
                failure, retry_after = f"{type(exc).__name__}: {exc}", 0.0
                continue
            if response.status_code in RETRY_STATUSES:
                # A 503's Retry-After (a failover, a deadlock broken) says when sooner is pointless.
                failure, retry_after = f"HTTP {response.status_code}", _retry_after(response) or 0.0
                continue
            if response.is_redirect:
                # Moved before the API saw it (SECURE_SSL_REDIRECT: http:// to https://): not its answer,
                # nothing was recorded, and the same URL is moved alike.
                raise Unsendable(f"{method} {path} was redirected to {response.headers.get('Location')}: the "
                                 "client's URL must be where the API answers", operation_key=key)
            if response.status_code >= 400:
                raise problem_from(response.status_code, _body(response), _retry_after(response), operation_key=key)
            return response
        raise SuretyUnreachable(f"{method} {path} failed {self.retries + 1} times, last: {failure}",
                                operation_key=key, attempts=self.retries + 1)


def token_fault(token: str) -> str | None:
    """Why HTTP cannot carry `token` as a Bearer token, in words that do not repeat it, or None. A
    header's value is printable ASCII with nothing blank at either end: a secret mounted from a file
    often keeps its newline."""
    if not token:
        return "is empty"
    if not token.isascii():
        return "is not ASCII"
    if not token.isprintable() or token != token.strip():
        return "has whitespace at either end or a control character (a newline kept from a file?)"
    return None


class _Settles(Protocol):
    @property
    def settled(self) -> bool: ...


Settles = TypeVar("Settles", bound=_Settles)
Answer = TypeVar("Answer", Action, Checkpoint)


def _deadline(timeout: float) -> float:
    """When a wait of `timeout` seconds ends (a NaN would never end it, nor be refused by a bound)."""
    if not math.isfinite(timeout):
        raise ValueError(f"a wait's timeout must be a finite number of seconds, not {timeout!r}")
    return time.monotonic() + timeout


def _wait(read: Callable[[float], Settles], timeout: float, stop: threading.Event | None = None) -> Settles:
    """Read with the API's held wait, in slices of at most 30 s, until settled, out of time or stopped."""
    deadline = _deadline(timeout)
    while True:
        left = max(0.0, deadline - time.monotonic())
        current = read(min(MAX_WAIT, left))
        if current.settled or left <= 0 or _stopped(stop):
            return current


def _stopped(stop: threading.Event | None) -> bool:
    return stop is not None and stop.is_set()


def clock() -> float:
    """The clock this client's waits are counted by (monotonic, in seconds)."""
    return time.monotonic()


def pause(seconds: float, stop: threading.Event | None) -> bool:
    """Sleep between reads (or, in the MCP server, before a throttled call's one more try), cut short
    when `stop` is set (or was): whether it is (the wait ends)."""
    if stop is None:
        time.sleep(seconds)
        return False
    return stop.wait(seconds)


def _seconds(wait: float) -> str:
    return f"{max(0.0, min(float(wait), MAX_WAIT)):g}"


def _replayed(response: httpx.Response) -> bool:
    header: str | None = response.headers.get("Idempotent-Replayed")
    return header == "true"


def _retry_after(response: httpx.Response) -> float | None:
    """The seconds of a `Retry-After` header, or None. The API writes whole seconds; a gateway in
    front of it may write the date to wait until, as HTTP allows."""
    value: str = response.headers.get("Retry-After", "")
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        until = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if until.tzinfo is None:  # "-0000": UTC, as HTTP dates are
        until = until.replace(tzinfo=timezone.utc)
    return float(max(0, math.ceil((until - datetime.now(timezone.utc)).total_seconds())))


def _read(response: httpx.Response, resource: Callable[[dict[str, Any]], Answer],
          operation_key: str | None = None) -> Answer:
    """The resource a 2xx answer holds, or `Unreadable` when it holds none: a sign-in or maintenance
    page in front of the API, or another service at the client's URL, answers 200 all the same.
    `operation_key`: a POST's, whose request may have been recorded all the same."""
    try:
        body = response.json()
        if isinstance(body, dict):
            return resource(body)
    except (ValueError, KeyError, TypeError, AttributeError):  # not JSON, or not the resource's shape
        pass
    request = response.request
    raise _unreadable(f"{request.method} {request.url.path} answered {response.status_code} "
                      f"({response.headers.get('Content-Type', 'no content type')}), not the API's resource",
                      operation_key)


def _unreadable(said: str, operation_key: str | None) -> Unreadable:
    """`Unreadable`, saying for a POST (`operation_key`) that its request may be recorded all the same."""
    if operation_key is not None:
        said += (f": the request may have been recorded under {operation_key!r}; send it again with the same key, "
                 "which can never add a second")
    return Unreadable(said + ". Is the client's URL where the API answers?", operation_key=operation_key)


def _body(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text


def _segment(key: str) -> str:
    """A key as one segment of a URL path: percent-encoded, "/" included, and "." and ".." too,
    which httpx would otherwise remove as dot segments ("actions/.." is the API's root)."""
    return "%2E" * len(key) if key in (".", "..") else quote(key, safe="")


def _json_ready(values: dict[str, Any]) -> dict[str, Any]:
    """Decimals go as plain decimal strings, as the API wants amounts ("100", never the "1E+2" that
    str() gives a normalized Decimal); everything else as given (a float amount is sent as a
    number, and the API answers why it refuses it)."""
    return {name: format(value, "f") if isinstance(value, Decimal) else value for name, value in values.items()}
