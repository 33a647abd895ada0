"""The tasks a person dealt with in the dead-letter queue before their checkpoints said so are marked
now, as 0054 marked their actions.

A task whose dead letter a person resolves says `"done_by_hand": true` in its checkpoint's
`last_error`, and one whose dead letter a person discards `"given_up": true`, `retryable` false beside
either (ledger.tasks._task_marked): its agent, reading the checkpoint, waits for no redrive, and an
action of it that fails afterwards (its call verified absent) is marked the same way
(ledger.executor._failed_under_stopped_task). A task closed before either mark was written reads as
one a person may still redrive, and such an action of it fails without the person's word. A task
without either mark whose newest dead-letter entry is resolved is marked done by hand; discarded,
given up; `retryable` false beside either, as _task_marked writes them. Its state stays as the entry's
close left it (done by hand: where its work stopped; given up: cancelled, or failed).

The database's rule on tasks (0052, 0054) refuses a change to a task marked done by hand: the rows
written here have no mark yet, so the rule lets the mark in, and holds the task from then on.

Kept simple, as 0054: the repair writes the marks only, with no audit event (the entry's own events
say who closed it, when and why); a task whose closed entry an archive run has taken since is not
found, and is left as it is; the rows are found in SQL and marked BATCH at a time, a statement per
mark for each batch. Reversed, nothing is undone: the marks written stay, as 0054's do.
"""

import importlib
from collections import Counter

from django.db import migrations
from django.db.models import OuterRef

MARKED_BEFORE = importlib.import_module("ledger.migrations.0054_given_up_is_final_and_older_rows_marked")


def mark_tasks_closed_before(apps, schema_editor):
    Task = apps.get_model("ledger", "Task")
    DeadLetter = apps.get_model("dlq", "DeadLetter")

    closed = (Task.objects.alias(marked=MARKED_BEFORE.either_mark("last_error")).filter(marked=False)
              .annotate(entry=MARKED_BEFORE.newest_entry(DeadLetter, task=OuterRef("pk")))
              .filter(entry__in=list(MARKED_BEFORE.MARK)))
    marked = Counter()
    for batch in MARKED_BEFORE.in_batches(closed.only("id")):
        MARKED_BEFORE.mark_batch(Task, "last_error", batch, marked)
    MARKED_BEFORE.report(marked, "task(s)")


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0054_given_up_is_final_and_older_rows_marked'),
    ]

    operations = [
        migrations.RunPython(mark_tasks_closed_before, migrations.RunPython.noop),
    ]
