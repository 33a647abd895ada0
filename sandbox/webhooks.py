"""Signed events from the sandbox provider, in the `Sandbox-Signature` format of CONTRACT.md."""

import json
import secrets

import httpx
from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder

from ledger.webhooks import sign_webhook

SIGNATURE_HEADER = "Sandbox-Signature"


def send_webhook(event_type, data, url):
    """POST one signed event to `url` and return the httpx response; the caller judges failures."""
    event = {"id": "evt_" + secrets.token_hex(12), "type": event_type, "data": data}
    body = json.dumps(event, cls=DjangoJSONEncoder).encode()
    headers = {
        "Content-Type": "application/json",
        SIGNATURE_HEADER: sign_webhook(body, settings.SANDBOX_WEBHOOK_SECRET),
    }
    return httpx.post(url, content=body, headers=headers, timeout=settings.CONNECTOR_TIMEOUT)
