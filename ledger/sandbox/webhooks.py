"""Signed events from the sandbox provider, in the `Sandbox-Signature` format of CONTRACT.md."""

import hashlib
import hmac
import json
import secrets
import time

import httpx
from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder

SIGNATURE_HEADER = "Sandbox-Signature"


def sign_webhook(body, secret, timestamp=None):
    """The signature header value for a raw body: `t=<unix>,v1=<hex HMAC-SHA256 of "<t>.<body>">`."""
    t = int(time.time() if timestamp is None else timestamp)
    digest = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={digest}"


def send_webhook(event_type, data, url):
    """POST one signed event to `url` and return the httpx response; the caller judges failures."""
    event = {"id": "evt_" + secrets.token_hex(12), "type": event_type, "data": data}
    body = json.dumps(event, cls=DjangoJSONEncoder).encode()
    headers = {
        "Content-Type": "application/json",
        SIGNATURE_HEADER: sign_webhook(body, settings.SANDBOX_WEBHOOK_SECRET),
    }
    return httpx.post(url, content=body, headers=headers, timeout=settings.CONNECTOR_TIMEOUT)
