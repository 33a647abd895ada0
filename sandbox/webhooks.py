"""Signed events from the sandbox provider, in the `Sandbox-Signature` format of docs/contract.md.

With an effect it commits (or when it declines one) the sandbox records an event to send, and
an RQ job sends it after commit: never inside the request's transaction, never holding up its
answer. As a real provider does, it retries a failed POST with backoff, and on purpose sends
some events twice (SANDBOX_WEBHOOK_DUPLICATE_RATE) or late (SANDBOX_WEBHOOK_DELAY_SECONDS).
A job lost with Redis is found again by the sweeper (`webhooks_redeliver_stale`). When an event is
due is told by the database's clock (ledger.clock), as its backoff (ledger.retry) is written.
"""

import json
import logging
import math
import random
from datetime import timedelta

import httpx
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.serializers.json import DjangoJSONEncoder
from django.core.validators import URLValidator
from django.db import transaction

from ledger import clock
from ledger.jobs import enqueue
from ledger.retry import backoff_until
from ledger.webhooks import sign_webhook

from .models import SandboxBooking, SandboxMessage, SandboxRefund, SandboxWebhook, new_event_id

logger = logging.getLogger("surety.sandbox.webhooks")
SIGNATURE_HEADER = "Sandbox-Signature"
# Failed POSTs of one event before the sandbox gives up on it.
MAX_FAILURES = 5
# What each kind of effect announces: (when it is committed, when it is declined).
EVENT_TYPES = {
    SandboxRefund: ("refund.succeeded", "refund.failed"),
    SandboxMessage: ("message.delivered", "message.failed"),
    SandboxBooking: ("booking.confirmed", "booking.failed"),
}
# The knobs PUT /sandbox/v1/settings takes, each overriding the setting named beside it.
SETTINGS = {
    "webhook_url": "SANDBOX_WEBHOOK_URL",
    "webhook_duplicate_rate": "SANDBOX_WEBHOOK_DUPLICATE_RATE",
    "webhook_delay_seconds": "SANDBOX_WEBHOOK_DELAY_SECONDS",
}
MAX_DELAY_SECONDS = 3600


def send_webhook(event_type, data, url, *, event_id=None):
    """POST one signed event to `url` and return the httpx response; the caller judges failures.

    Signed at sending time, as real providers do: a late or repeated delivery is not stale."""
    event = {"id": event_id or new_event_id(), "type": event_type, "data": data}
    body = json.dumps(event, cls=DjangoJSONEncoder).encode()
    headers = {
        "Content-Type": "application/json",
        SIGNATURE_HEADER: sign_webhook(body, settings.SANDBOX_WEBHOOK_SECRET),
    }
    return httpx.post(url, content=body, headers=headers, timeout=settings.CONNECTOR_TIMEOUT)


def webhook_settings(switches):
    """The knobs in force: the `switches` row's (SandboxSettings), else the settings'."""
    values = {name: getattr(switches, name) for name in SETTINGS}
    return {name: getattr(settings, SETTINGS[name]) if value is None else value for name, value in values.items()}


def webhook_settings_errors(given):
    """What is wrong with the knobs in `given` (a JSON object's items); null restores a setting."""
    errors = {}
    for name, value in given.items():
        if value is None:
            continue
        if name == "webhook_url":
            problem = _url_problem(value)
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            problem = "Must be a number or null."
        elif name == "webhook_duplicate_rate":
            problem = "" if 0 <= value <= 1 else "Must be from 0 to 1."
        else:
            problem = "" if 0 <= value <= MAX_DELAY_SECONDS else f"Must be from 0 to {MAX_DELAY_SECONDS}."
        if problem:
            errors[name] = [problem]
    return errors


def _url_problem(value):
    if not isinstance(value, str) or len(value) > SandboxWebhook._meta.get_field("url").max_length:
        return "Must be an http(s) URL of at most 500 characters, \"\" (off) or null."
    if value == "":
        return ""
    try:
        URLValidator(schemes=["http", "https"])(value)
    except ValidationError:
        return "Must be an http(s) URL, \"\" (off) or null."
    return ""


def webhook_emit(effect, data, *, committed, switches):
    """Record the event of an effect being committed (in its transaction), or declined or failed
    since (`committed` False), and send it once that commits; `switches`: the SandboxSettings row
    the write read.

    1. With no URL in force, do nothing: webhooks are off.
    2. Draw whether this event goes out twice, and when it is first due (late on purpose).
    3. Save the event; after commit an RQ job delivers it (the scheduler holds a late one).
    """
    knobs = webhook_settings(switches)
    if not knobs["webhook_url"]:
        return None
    event_type = EVENT_TYPES[type(effect)][0 if committed else 1]
    copies = 2 if random.random() < knobs["webhook_duplicate_rate"] else 1
    due = clock.now() + timedelta(seconds=knobs["webhook_delay_seconds"])
    event = SandboxWebhook.objects.create(
        event_type=event_type, data=data, url=knobs["webhook_url"], copies=copies, next_attempt_at=due)
    transaction.on_commit(lambda: _enqueue(event), robust=True)
    return event


def _enqueue(event):
    enqueue(webhook_deliver, event.pk, at=event.next_attempt_at if event.next_attempt_at > clock.now() else None)


def webhook_deliver(event_id):
    """The RQ job: send every copy of one event not yet sent, or record why not.

    1. Lock the event if it is due; another job for it (the sweeper's, for a job it thought
       lost) finds it locked, or no longer due, and leaves it.
    2. POST each copy still to send; a non-2xx answer or a transport error stops there.
    3. On a failure, schedule the next attempt with backoff, until MAX_FAILURES.
    """
    with transaction.atomic():
        event = (SandboxWebhook.objects.select_for_update(skip_locked=True)
                 .filter(pk=event_id, next_attempt_at__lte=clock.now()).first())
        if event is None:
            return None
        while event.sent < event.copies:
            event.attempts += 1
            try:
                send_webhook(event.event_type, event.data, event.url, event_id=event.event_id).raise_for_status()
            except httpx.HTTPError as exc:
                event.last_error = f"{type(exc).__name__}: {exc}"[:2000]
                break
            event.sent += 1
        failures = event.attempts - event.sent
        if event.sent == event.copies or failures >= MAX_FAILURES:
            event.next_attempt_at = None
        else:
            event.next_attempt_at = backoff_until(failures)
        event.save(update_fields=["attempts", "sent", "last_error", "next_attempt_at"])
    if event.next_attempt_at is not None:
        logger.warning("%s to %s failed (attempt %s): %s", event, event.url, event.attempts, event.last_error)
        _enqueue(event)
    elif event.sent < event.copies:
        logger.error("%s to %s: gave up after %s attempts: %s", event, event.url, event.attempts, event.last_error)
    return event.sent


def webhooks_redeliver_stale(older_than=timedelta(seconds=60)):
    """A sweeper step: events overdue by `older_than` lost their job (Redis flushed, a worker
    killed): enqueue them again. Marking them due now keeps the next pass from enqueuing
    them once more while a backed-up queue still holds this job."""
    now = clock.now()
    overdue = SandboxWebhook.objects.filter(next_attempt_at__lt=now - older_than)
    enqueued = 0
    for pk in overdue.values_list("pk", flat=True)[:100]:
        if overdue.filter(pk=pk).update(next_attempt_at=now) == 1:
            enqueue(webhook_deliver, pk)
            enqueued += 1
    return enqueued
