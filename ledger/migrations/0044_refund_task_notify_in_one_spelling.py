"""A refund task's `notify` is recorded with its domain in one spelling (ledger.recipients.email_recipient),
as a message's recipient is: a retry of the task with the domain written in another case was refused as a
task id reused. Tasks recorded before keep their input as written; their print is taken again over the
address in that spelling, so that a retry with either spelling is replayed."""

import hashlib
import importlib
import json
import unicodedata

from django.db import migrations

BATCH = 1000
# How prints were taken over amounts when this was written (that migration's frozen rule).
canonical = importlib.import_module("ledger.migrations.0025_fingerprints_over_canonical_amounts").canonical


def hashed(kind, target, params):
    text = json.dumps([kind, target, params], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def one_spelling(address):
    local, at, domain = address.rpartition("@")
    return f"{local}{at}{unicodedata.normalize('NFC', domain).lower()}" if at else address


def _reprint(apps, forward):
    """Forwards, a task recorded with its notify in another spelling gets its print over the
    address in one; backwards, its print over the input as recorded again."""
    reprint(apps, forward, lambda notify: None if one_spelling(notify) == notify else (notify, one_spelling(notify)))


def reprint(apps, forward, spellings):
    """Each refund task's print taken over its notify in another spelling: `spellings(notify)` gives
    (the spelling its print is over now, the one it is taken over from now on), None to leave it.
    Backwards, the other way round. A print no rule took (not over the first) is left as it is."""
    Task = apps.get_model("ledger", "Task")
    tasks = Task.objects.filter(workflow="refund", input__has_key="notify").only(
        "id", "workflow", "task_id", "input", "fingerprint")
    batch = []
    for task in tasks.iterator(chunk_size=BATCH):
        notify = task.input.get("notify")
        pair = spellings(notify) if isinstance(notify, str) else None
        if pair is None:
            continue
        kind = f"workflow:{task.workflow}"
        old, new = (hashed(kind, task.task_id, canonical({**task.input, "notify": spelling})) for spelling in pair)
        old, new = (old, new) if forward else (new, old)
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
        ("ledger", "0043_chain_checks_keep_their_hash"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
