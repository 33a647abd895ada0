"""Signed HTTP bodies: `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<raw body>">`.

Inbound webhooks are checked with it (ledger.webhooks), and what this product posts is signed
with it: the sandbox's events, the dead-letter alerts, the signed-HTTP connector's requests.
"""

import hashlib
import hmac
import time

from django.conf import settings


def _digest(secret, stamp, raw):
    return hmac.new(secret.encode(), f"{stamp}.".encode() + raw, hashlib.sha256).hexdigest()


def sign_webhook(body, secret, timestamp=None):
    """The signature header value for a raw body, as `signature_valid` checks it: the
    sandbox signs its events and the dead-letter alerts their POSTs with it."""
    stamp = int(time.time() if timestamp is None else timestamp)
    return f"t={stamp},v1={_digest(secret, stamp, body)}"


def signature_valid(header, raw, secret, now=None):
    """`t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<raw body>">`, no older than the tolerance.
    Any one of several `v1` holds: in Stripe's scheme, which this header follows, a sender rolling its
    secret signs with the old and the new one, each its own `v1`, in no set order."""
    pairs = [item.split("=", 1) for item in header.split(",") if "=" in item]
    try:
        stamp = int(dict(pairs)["t"])
    except (KeyError, ValueError):
        return False
    # In whole numbers: a stamp of hundreds of digits, subtracted from a float, overflows.
    if abs(int(now or time.time()) - stamp) > settings.WEBHOOK_TOLERANCE_SECONDS:
        return False
    expected = _digest(secret, stamp, raw).encode()
    # As bytes: compare_digest raises TypeError on a str with non-ASCII characters, which a
    # header may carry, and a bad signature must be a 400, not a 500.
    return any(hmac.compare_digest(expected, given.encode("utf-8", "replace"))
               for name, given in pairs if name == "v1")
