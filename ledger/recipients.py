"""A message's recipient and a customer as the ledger holds them, each in one spelling: read by
the API's intake, the workflows' steps and the ledger's replay alike, and by the shards' router (through
ledger.api.wire), so it imports no Django (only the check of a new recipient asks Django's
e-mail rule, and the spelling of one Django's mail, when it is called)."""

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
    """An e-mail address as one message per recipient is held: the address the mail is sent to
    (decision 72), so that two spellings of one mailbox are one recipient. An address the mail
    could not be sent to is held as written (the check below refuses it)."""
    sent = _as_sent(address)
    return address if sent is None else sent


def email_recipient_checked(address):
    """`address` as email_recipient holds it, or RecipientRefused: the API's rule for an e-mail
    recipient, which a workflow holds its messages' recipients to before any step runs. An address
    Django's rule takes but its mail cannot be sent to (a domain IDNA refuses) is none."""
    recipient = _as_sent(address)
    is_address = recipient is not None and _is_email_address(address)
    fits = len(recipient or address) <= TARGET_LENGTH  # in ASCII, a domain may be longer than as written
    if not (is_address and fits):
        raise RecipientRefused(address, is_address=is_address, fits=fits)
    return recipient


def _as_sent(address):
    """The address as Django's mail reads it (RFC 5322) and sends to it, for the SMTP envelope and
    the To header alike (`sanitize_address`): a quoted part before the @ without the quotes it
    does not need (`"ada"` is `ada`), the domain in ASCII (IDNA: `bücher.example` is
    `xn--bcher-kva.example`; its full-width and other compatibility forms folded), and in lower
    case (its case names no other domain); the part before the @ otherwise as written, which the
    address's own server may tell apart by case. None if it is sent to no mailbox: not one
    address (no @), a domain IDNA refuses, or a part before the @ not in ASCII (sent RFC
    2047-encoded, a name no server reads as the mailbox; Django's rule refuses it too)."""
    # Imported here: the shards' router imports this module and runs without Django.
    from django.core.mail.message import sanitize_address

    local, at, _ = address.rpartition("@")
    if not (at and local.isascii()):
        return None
    try:
        sent = sanitize_address(address, "utf-8")
    except Exception:  # noqa: BLE001 (what it fails with is no address, whatever its class)
        # IDNA's refusal is a ValueError (UnicodeError), and the standard library's header parser,
        # which reads the address first, fails on some malformed ones with errors of its own
        # (`a@[`: AttributeError; `(@)"`: IndexError): none is an address the mail is sent to.
        return None
    local, at, domain = sent.rpartition("@")
    return f"{local}{at}{domain.lower()}"


def _is_email_address(address):
    # Imported here: the shards' router imports this module and runs without Django.
    from django.core.exceptions import ValidationError
    from django.core.validators import validate_email

    try:
        validate_email(address)
    except ValidationError:
        return False
    return True


# What does not show in a customer: Unicode's Default_Ignorable_Code_Point (its
# DerivedCoreProperties.txt, the same from Unicode 14.0 to 16.0; Python's unicodedata has no
# property for it). Beside most format characters it holds those of other categories that a
# renderer shows nothing of: a combining grapheme joiner, variation selectors, Hangul fillers,
# Khmer inherent vowels, and the unassigned code points Unicode keeps for more of them. No white
# space is in it (a space inside a customer is kept).
DEFAULT_IGNORABLE = (
    (0x00AD, 0x00AD),    # soft hyphen
    (0x034F, 0x034F),    # combining grapheme joiner
    (0x061C, 0x061C),    # Arabic letter mark
    (0x115F, 0x1160),    # Hangul choseong and jungseong fillers
    (0x17B4, 0x17B5),    # Khmer inherent vowels
    (0x180B, 0x180F),    # Mongolian free variation selectors and vowel separator
    (0x200B, 0x200F),    # zero-width space, non-joiner and joiner, direction marks
    (0x202A, 0x202E),    # direction embeddings and overrides
    (0x2060, 0x206F),    # word joiner, invisible operators, direction isolates (2065 unassigned)
    (0x3164, 0x3164),    # Hangul filler
    (0xFE00, 0xFE0F),    # variation selectors 1-16
    (0xFEFF, 0xFEFF),    # byte-order mark
    (0xFFA0, 0xFFA0),    # half-width Hangul filler
    (0xFFF0, 0xFFF8),    # unassigned
    (0x1BCA0, 0x1BCA3),  # shorthand format controls
    (0x1D173, 0x1D17A),  # musical symbols' beams and phrases
    (0xE0000, 0xE0FFF),  # tags, variation selectors 17-256, unassigned
)
# As str.translate drops them (mapped to None).
_UNSEEN = dict.fromkeys(point for first, last in DEFAULT_IGNORABLE for point in range(first, last + 1))


def customer_spelling(text):
    """The customer as the ledger keeps it: without the characters that do not show (Unicode's
    default-ignorable code points: a zero-width space pasted with it, a byte-order mark, a
    variation selector, a Hangul filler; and its format characters), in Unicode's compatibility
    form (NFKC: full-width letters, a no-break space), trimmed. Written either way it is one
    customer for its daily total and its hold; its case is kept, as providers' ids tell case
    apart (decision 61)."""
    shown = "".join(ch for ch in text.translate(_UNSEEN) if unicodedata.category(ch) != "Cf")
    return unicodedata.normalize("NFKC", shown).strip()


def customer_spelled_before(recorded, customer):
    """Whether `recorded`, a customer the ledger holds, is `customer` (in the ledger's spelling) as
    a request recorded before customers were kept in one spelling wrote it: a retry of that request
    is compared with it in the spelling recorded then (docs/contract.md: still a replay)."""
    return isinstance(recorded, str) and recorded != customer and customer_spelling(recorded) == customer
