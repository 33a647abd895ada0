"""Inbound provider events: verified first, stored once by event id, then acted on.

A redelivered event finds its id taken and does nothing. An event that names an operation
key settles that action if its outcome is still open (`unknown` or `needs_review`).
"""

import hashlib
import hmac
import json
import logging
import time

from django.conf import settings
from django.db import IntegrityError, transaction
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from .models import Action, ActionStatus, WebhookEvent

logger = logging.getLogger("surety.webhooks")
SETTLING = {
    "refund.succeeded": True, "message.sent": True, "booking.confirmed": True,
    "refund.failed": False, "message.failed": False, "booking.failed": False,
}
OPEN = {ActionStatus.UNKNOWN, ActionStatus.NEEDS_REVIEW}


def _secrets():
    return {"sandbox": settings.SANDBOX_WEBHOOK_SECRET} if settings.SANDBOX_ENABLED else {}


def signature_valid(header, raw, secret, now=None):
    """`t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<raw body>">`, no older than the tolerance."""
    parts = dict(item.split("=", 1) for item in header.split(",") if "=" in item)
    try:
        stamp = int(parts["t"])
    except (KeyError, ValueError):
        return False
    if abs((now or time.time()) - stamp) > settings.WEBHOOK_TOLERANCE_SECONDS:
        return False
    expected = hmac.new(secret.encode(), f"{stamp}.".encode() + raw, hashlib.sha256).hexdigest()
    # As bytes: compare_digest raises TypeError on a str with non-ASCII characters, which a
    # header may carry, and a bad signature must be a 400, not a 500.
    return hmac.compare_digest(expected.encode(), parts.get("v1", "").encode("utf-8", "replace"))


def _problem(status, detail):
    return JsonResponse({"error": detail}, status=status)


@csrf_exempt
@require_POST
def webhook_receive(request, connector):
    secret = _secrets().get(connector)
    if secret is None:
        return _problem(404, "unknown connector")
    raw = request.body
    if not signature_valid(request.headers.get("Sandbox-Signature", ""), raw, secret):
        return _problem(400, "bad, missing or stale signature")
    try:
        event = json.loads(raw)
        event_id, event_type, data = str(event["id"]), str(event["type"]), event.get("data") or {}
    except (ValueError, KeyError, TypeError):
        return _problem(400, "the body is not an event")
    try:
        with transaction.atomic():
            stored = WebhookEvent.objects.create(
                connector=connector, event_id=event_id, event_type=event_type, payload=event
            )
            stored.outcome = _settle(connector, event_type, data)
            stored.save(update_fields=["outcome"])
    except IntegrityError:
        return JsonResponse({"duplicate": True})
    return JsonResponse({"received": True, "outcome": stored.outcome})


def _settle(connector, event_type, data):
    if event_type not in SETTLING or not isinstance(data, dict):
        return "ignored"
    metadata = data.get("metadata")
    key = metadata.get("operation_key") if isinstance(metadata, dict) else None
    action = Action.objects.select_for_update().filter(operation_key=key).first() if isinstance(key, str) and key else None
    if action is None or action.status not in OPEN:
        return "nothing to settle"
    actor = f"system:webhook:{connector}"
    if SETTLING[event_type]:
        action.mark_succeeded(actor=actor, external_ref=str(data.get("id", "")) or key, result=data,
                              reason=f"{event_type} received")
    else:
        action.mark_failed(actor=actor, code="provider_failed", message=f"{event_type} received", retryable=True)
    return f"settled {action.operation_key} as {action.status}"
