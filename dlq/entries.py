"""Working the dead-letter queue: redrive, resolve by hand, discard. Each one audited.

Permission checks belong to the callers (the pages); these functions only do the work.
"""

from django.db import transaction

from ledger.statemachine import InvalidTransition

from .models import DeadLetter, EntryStatus


def _open_entry(entry):
    entry = DeadLetter.objects.select_for_update().select_related("task").get(pk=entry.pk)
    if entry.status != EntryStatus.OPEN:
        raise InvalidTransition(f"{entry} was already {entry.status} by {entry.decided_by}")
    return entry


def deadletter_redrive(entry, *, actor, reason):
    """The task goes back to `queued` and resumes from its checkpoint: done steps stay done."""
    with transaction.atomic():
        entry = _open_entry(entry)
        entry.task.redrive(actor=actor, reason=reason)
        return entry.decide(EntryStatus.REDRIVEN, actor=actor, reason=reason)


def deadletter_resolve(entry, *, actor, note):
    """A person finished the job by hand; the note says what they did. The task stays as it is."""
    if not note.strip():
        raise ValueError("say what was done by hand")
    with transaction.atomic():
        return _open_entry(entry).decide(EntryStatus.RESOLVED, actor=actor, reason=note)


def deadletter_discard(entry, *, actor, reason):
    if not reason.strip():
        raise ValueError("a reason is required to discard")
    with transaction.atomic():
        entry = _open_entry(entry)
        entry.task.cancel(actor=actor, reason=reason)
        return entry.decide(EntryStatus.DISCARDED, actor=actor, reason=reason)
