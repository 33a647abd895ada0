"""A refund task's `notify` is recorded as the mail is sent to it (ledger.recipients.email_recipient, decision 72):
its domain in ASCII (IDNA), a quoted part before the @ without quotes it does not need. A task recorded before
keeps its input as written; its print, taken over the address in the spelling of migration 0044, is taken again
over the address as sent, so that a retry spelled either way is replayed, as a new task's is."""

import importlib

from django.core.mail.message import sanitize_address
from django.db import migrations

BATCH = 1000
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


def _reprint(apps, forward):
    """Forwards, a task whose print is over its notify in 0044's spelling gets it over the address as sent;
    backwards, its print in 0044's spelling again."""
    Task = apps.get_model("ledger", "Task")
    tasks = Task.objects.filter(workflow="refund", input__has_key="notify").only(
        "id", "workflow", "task_id", "input", "fingerprint")
    batch = []
    for task in tasks.iterator(chunk_size=BATCH):
        notify = task.input.get("notify")
        sent = as_sent(notify) if isinstance(notify, str) else None
        if sent is None or sent == before.one_spelling(notify):
            continue  # no address the mail is sent to (the intake refuses it now), or one spelling already
        kind = f"workflow:{task.workflow}"
        in_one_spelling = before.hashed(kind, task.task_id, before.canonical({**task.input,
                                                                               "notify": before.one_spelling(notify)}))
        as_sent_print = before.hashed(kind, task.task_id, before.canonical({**task.input, "notify": sent}))
        old, new = (in_one_spelling, as_sent_print) if forward else (as_sent_print, in_one_spelling)
        if task.fingerprint != old:
            continue  # not a print this rule took: left as it is
        task.fingerprint = new
        batch.append(task)
        if len(batch) == BATCH:
            Task.objects.bulk_update(batch, ["fingerprint"])
            batch = []
    Task.objects.bulk_update(batch, ["fingerprint"])


def forwards(apps, schema_editor):
    _reprint(apps, True)


def backwards(apps, schema_editor):
    _reprint(apps, False)


class Migration(migrations.Migration):

    dependencies = [
        ("ledger", "0058_failure_stored"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
