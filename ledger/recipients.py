"""A message's recipient as the ledger holds it, one message per recipient: read by the API's
intake, the workflows' steps and the ledger's replay alike, and by the shards' router (through
ledger.api.wire), so it needs no Django."""

import unicodedata


def email_recipient(address):
    """An e-mail address as one message per recipient is held: its domain in one spelling (its
    case and Unicode normal form name no other domain); the part before the @ as written, which
    the address's own server may tell apart by case."""
    local, at, domain = address.rpartition("@")
    return f"{local}{at}{unicodedata.normalize('NFC', domain).lower()}" if at else address
