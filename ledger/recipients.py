"""A message's recipient and a customer as the ledger holds them, each in one spelling: read by
the API's intake, the workflows' steps and the ledger's replay alike, and by the shards' router (through
ledger.api.wire), so it imports no Django (only the check of a new recipient asks Django's
e-mail rule, when it is called)."""

import unicodedata

TARGET_LENGTH = 255  # an action's target column, which holds a message's recipient


class RecipientRefused(ValueError):
    """An address no message may be recorded to: `is_address` is False unless it is an e-mail
    address, `fits` False if held it would not fit an action's target. Both are told, so that
    each caller says the one that matters to it."""

    def __init__(self, address, *, is_address, fits):
        super().__init__(address)
        self.address, self.is_address, self.fits = address, is_address, fits


def email_recipient(address):
    """An e-mail address as one message per recipient is held: its domain in one spelling (its
    case and Unicode normal form name no other domain); the part before the @ as written, which
    the address's own server may tell apart by case."""
    local, at, domain = address.rpartition("@")
    return f"{local}{at}{unicodedata.normalize('NFC', domain).lower()}" if at else address


def email_recipient_checked(address):
    """`address` as email_recipient holds it, or RecipientRefused: the API's rule for an e-mail
    recipient, which a workflow holds its messages' recipients to before any step runs."""
    recipient = email_recipient(address)
    is_address, fits = _is_email_address(address), len(recipient) <= TARGET_LENGTH  # "İ" in lower case is "i̇"
    if not (is_address and fits):
        raise RecipientRefused(address, is_address=is_address, fits=fits)
    return recipient


def _is_email_address(address):
    # Imported here: the shards' router imports this module and runs without Django.
    from django.core.exceptions import ValidationError
    from django.core.validators import validate_email

    try:
        validate_email(address)
    except ValidationError:
        return False
    return True


def customer_spelling(text):
    """The customer as the ledger keeps it: without the characters that do not show (Unicode's
    format characters: a zero-width space pasted with it, a byte-order mark), in Unicode's
    compatibility form (NFKC: full-width letters, a no-break space), trimmed. Written either way
    it is one customer for its daily total and its hold; its case is kept, as providers' ids tell
    case apart (decision 61)."""
    shown = "".join(ch for ch in text if unicodedata.category(ch) != "Cf")
    return unicodedata.normalize("NFKC", shown).strip()
