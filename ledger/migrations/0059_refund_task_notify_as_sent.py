"""A refund task's `notify` is recorded as the mail is sent to it (ledger.recipients.email_recipient, decision 72):
its domain in ASCII (IDNA), a quoted part before the @ without quotes it does not need. A task recorded before
keeps its input as written; its print, taken over the address in the spelling of migration 0044, is taken again
over the address as sent, so that a retry spelled either way is replayed, as a new task's is."""

import importlib

from django.core.mail.message import sanitize_address
from django.db import migrations

# How tasks were printed, and their notify spelled for it, when this was written (0044's frozen rules).
before = importlib.import_module("ledger.migrations.0044_refund_task_notify_in_one_spelling")


def as_sent(address):
    """The address as the mail is sent to it, its domain in lower case; None if it cannot be sent to."""
    try:
        sent = sanitize_address(address, "utf-8")
    except ValueError:
        return None
    local, at, domain = sent.rpartition("@")
    return f"{local}{at}{domain.lower()}" if at else None


def _spellings(notify):
    """A task whose print is over its notify in 0044's spelling gets it over the address as sent; none
    for an address the mail is not sent to (the intake refuses it now), or already in one spelling."""
    sent = as_sent(notify)
    return None if sent is None or sent == before.one_spelling(notify) else (before.one_spelling(notify), sent)


def _reprint(apps, forward):
    before.reprint(apps, forward, _spellings)


def forwards(apps, schema_editor):
    _reprint(apps, True)


def backwards(apps, schema_editor):
    _reprint(apps, False)


class Migration(migrations.Migration):

    dependencies = [
        ("ledger", "0058_failure_stored"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
