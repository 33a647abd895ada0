"""The archive: what has outlived its retention moves out of the database into a file.

Here rather than in the ledger because it removes rows of every app (an action's review items
and approvals, its dead letters and their alerts): this is the highest of the apps built on
the ledger, the one that sees them all.

One run (`archive_expired`) is one JSON-lines file and one transaction:

1. It takes its turn (two runs at once would both take the webhook and audit events, which no
   row lock holds), then, locked: settled and shadow actions past their key's lifetime
   (OPERATION_KEY_LIFETIME_DAYS, ledger.retention) with nothing waiting for a person (no open
   review item or dead letter, no failure that may still be retried: one whose dead letter a
   person closed may not), each with the actions it superseded (an edit-down's
   originals) and what hangs off them; finished tasks past their id's lifetime whose every
   action may go so, with their steps, confirmations, actions and dead letters; closed dead
   letters, and ended bulk redrive runs with their items, older than DEAD_LETTER_RETENTION_DAYS
   (a dead letter a run names goes in a run after the run's); incidents resolved longer ago than
   that, once no action under their key is left; webhook events older than
   WEBHOOK_RETENTION_DAYS; the audit events before a checkpoint whose event is older than
   AUDIT_RETENTION_DAYS (`archive_checkpoint`); and the chain's checks and walks older than that
   that nothing reads (a check of the newest stretch sooner, once a whole-chain walk passed it).
   A review item goes with its approvals and its decision links, which the database would
   otherwise delete with it, unwritten.
2. It walks the audit events it takes, from the chain's start through the checkpoint's own
   event (`_unvouched`): once they are gone, every check starts at the checkpoint, and only the
   link from the last of them into its event ties them to anything signed. If the chain breaks,
   the run is refused (`ArchiveRefused`): nothing is taken, and an audit event `archive_refused`
   says why.
3. It writes them to the file, the checkpoint first (its seq, hash and signature, and its
   event's prev_hash and content_hash: the file's last event's hash is that prev_hash, and the
   two hash to the checkpoint's signed hash), and syncs it and its directory (which holds the
   file's name).
4. It removes them (a webhook event's claim goes with it), leaves an `ArchivedKey` per action,
   an `ArchivedTask` per task and an `Archive` naming the file, its SHA-256, the counts and the checkpoint, and an audit
   event `archived` saying the same. Last, it drops the partitions of the audit trail and of the
   webhook events that hold only archived rows (ledger.partitions) instead of deleting their
   rows: a drop holds the table's parent until the commit, which comes next (`_drop`).

Killed before the commit, nothing is removed and the file is an orphan that no `Archive` names;
run again, it writes a new file. Nothing that is unsettled or waits for a decision is taken.
"""

import hashlib
import json
import logging
import os
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import chain, groupby
from operator import attrgetter
from pathlib import Path

from django.conf import settings
from django.core import serializers
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, transaction
from django.db.models import Exists, OuterRef, Q, QuerySet

from approvals.models import Approval, DecisionLink, ReviewItem, ReviewStatus
from ledger import clock
from ledger.audit import ChainReport, chain_start, checks_read
from ledger.locks import ARCHIVE_RUN, take_turns
from ledger.models import (SETTLED, Action, ActionStatus, AuditEvent, Booking, ChainCheck, ChainCheckpoint, ChainWalk,
                           Confirmation, Task, TaskState, TaskStep, WebhookClaim, WebhookEvent)
from ledger.partitions import AUDIT, WEBHOOKS
from ledger.retention import Archive, ArchivedKey, ArchivedTask, key_lifetime

from .incidents import Incident, IncidentStatus
from .models import Alert, AlertDelivery, BulkRedrive, BulkRedriveItem, DeadLetter, EntryStatus
from .redrive_runs import RunStatus

ACTOR = "system:archive"
logger = logging.getLogger("surety.archive")
# Final: nothing moves them again. A dead-lettered task a person resolved by hand stays where its
# work stopped, as final as a failed one (the database holds it there: ledger.dbrules).
FINISHED = (Q(state__in=[TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED])
            | Q(state=TaskState.DEAD_LETTERED, last_error__done_by_hand=True))
# An action nothing moves again: settled, or recorded under a shadow grant (never executed; every
# new grant starts as shadow, so they pile up). Not the ledger's SETTLED alone: that names where
# an action in flight ends (a settle frees what it held), and a shadow action never was in flight.
FINAL = [*SETTLED, ActionStatus.SHADOW]
# Rows a statement names at most (ids in a list, or rows of a few columns inserted): PostgreSQL
# binds at most 65,535 values a statement (production binds them on the server, config.settings),
# and what a run takes grows with --limit and with what hangs off each task (a workflow's steps).
CHUNK = 5000


def _waiting(now):
    """An action that must stay: not final (a superseded one is its version's), in its key's
    lifetime, waiting for a person (an open review item or dead letter, or an open incident under
    its key: its resolver reads the action, and a webhook about its effect finds it), with a
    dead letter that must stay (`_entry_kept`), or holding a slot whose time has not passed (a
    venue booked further ahead than the key's lifetime: gone, its slot would be booked again)."""
    return (~Q(status__in=[*FINAL, ActionStatus.SUPERSEDED]) | Q(created_at__gt=now - key_lifetime())
            | Q(booking__status__in=[Booking.Status.PENDING, Booking.Status.CONFIRMED], booking__end__gt=now)
            | Q(review_items__status=ReviewStatus.OPEN) | Q(dead_letters__in=DeadLetter.objects.filter(_entry_kept(now)))
            | Exists(Incident.objects.filter(operation_key=OuterRef("operation_key"), status=IncidentStatus.OPEN)))


def _entry_kept(now):
    """A dead letter that must stay, and its task or action with it: open, within its own retention
    (DEAD_LETTER_RETENTION_DAYS, which may be longer than the key's lifetime), or named by a bulk
    redrive's history (`IN_A_BULK_REDRIVE`)."""
    return (Q(status=EntryStatus.OPEN) | Q(created_at__gt=now - _days("DEAD_LETTER_RETENTION_DAYS"))
            | IN_A_BULK_REDRIVE)


# A dead letter that a bulk redrive took stays with its run's items (they PROTECT it, and the run's
# counts are read from them), and so do its task or action, until the run goes (`expired_bulk_redrives`).
IN_A_BULK_REDRIVE = Q(bulk_items__isnull=False)


def expired_bulk_redrives(now):
    """Bulk redrive runs that ended (finished or stopped), or were planned and never started, longer
    ago than DEAD_LETTER_RETENTION_DAYS, oldest first: each goes with its items, which frees the
    dead letters they name for the next run."""
    before = now - _days("DEAD_LETTER_RETENTION_DAYS")
    return (BulkRedrive.objects.filter(Q(status__in=[RunStatus.FINISHED, RunStatus.STOPPED], finished_at__lte=before)
                                       | Q(status=RunStatus.PLANNED, planned_at__lte=before))
            .order_by("id"))


# A failure that may still be retried stays too, until nobody will retry it: a person closed its
# dead letter (resolved or discarded it), or its task is finished (a task's runner retries its
# actions, and a finished task runs no more).
RETRYABLE = (Q(status=ActionStatus.FAILED, error__retryable=True)
             & ~Q(dead_letters__status__in=[EntryStatus.RESOLVED, EntryStatus.DISCARDED]))


def expired_actions(now):
    """Final actions of no task that may go, oldest first. Each goes with the actions it
    superseded, if none of them must stay (`collect`)."""
    return (Action.objects.filter(status__in=FINAL, task__isnull=True).exclude(_waiting(now)).exclude(RETRYABLE)
            .order_by("id"))


def expired_tasks(now):
    """Finished tasks past their id's lifetime, none of whose dead letters or actions must stay,
    oldest first: each goes with its steps, confirmations, dead letters and actions."""
    return (Task.objects.filter(FINISHED, created_at__lte=now - key_lifetime())
            .exclude(Exists(Action.objects.filter(_waiting(now), task=OuterRef("pk"))))
            .exclude(Exists(DeadLetter.objects.filter(_entry_kept(now), task=OuterRef("pk"))))
            .order_by("id"))


def expired_incidents(now):
    """Resolved incidents resolved longer ago than DEAD_LETTER_RETENTION_DAYS (a person works them
    as a dead letter, and an action's evidence record cites them as it does its dead letters),
    oldest first, once no action under their key is left: while one is, its evidence record lists
    them and a redrive of its dead letter asks them (`DeadLetter.redrive_refusal`), so they go in a
    run after the action's. An open one never goes, and keeps its action (`_waiting`)."""
    return (Incident.objects.filter(status=IncidentStatus.RESOLVED,
                                    resolved_at__lte=now - _days("DEAD_LETTER_RETENTION_DAYS"))
            .exclude(Exists(Action.objects.filter(operation_key=OuterRef("operation_key"))))
            .order_by("id"))


def expired_chain_checks(now):
    """The audit chain's checks nothing reads (ledger.audit.checks_read), oldest first: those older
    than AUDIT_RETENTION_DAYS, and sooner an intact check of the newest stretch that a later intact
    whole-chain check passed: the sweeper writes one of those a pass that sealed events (up to one
    a second), and the walk, which starts a day after the last one, checked every link of theirs
    too."""
    old = Q(checked_at__lte=now - _days("AUDIT_RETENTION_DAYS"))
    walked = (ChainCheck.objects.filter(scope=ChainCheck.Scope.WHOLE, broken_at__isnull=True)
              .order_by("-id").first())
    if walked is not None:
        old |= Q(scope=ChainCheck.Scope.NEWEST, broken_at__isnull=True, through_seq__lte=walked.through_seq,
                 id__lt=walked.pk)
    return ChainCheck.objects.filter(old).exclude(pk__in=checks_read()).order_by("id")


def expired_chain_walks(now):
    """Whole-chain walks that finished longer ago than AUDIT_RETENTION_DAYS, oldest first, but the
    newest, which says when the next one starts (ledger.audit.audit_walk) and the audit page shows;
    each wrote its result as a check too."""
    newest = ChainWalk.objects.order_by("-id").values_list("pk", flat=True).first()
    return (ChainWalk.objects.filter(finished_at__lte=now - _days("AUDIT_RETENTION_DAYS")).exclude(pk=newest)
            .order_by("id"))


def _with_originals(actions, now):
    """The actions' ids with those of the actions they superseded (an edit-down's originals, in
    turn), leaving out any action one of whose originals must stay."""
    chains = {action.pk: [action.pk] for action in actions}
    step = {action.pk: action.supersedes_id for action in actions if action.supersedes_id}
    while step:
        may_go = Action.objects.exclude(_waiting(now)).values_list("pk", "supersedes_id")
        originals = dict(chain.from_iterable(may_go.filter(pk__in=chunk) for chunk in _chunks(step.values())))
        for start, original in list(step.items()):
            if original not in originals:  # it must stay, and so must what superseded it
                chains.pop(start)
                del step[start]
                continue
            chains[start].append(original)
            if originals[original]:
                step[start] = originals[original]
            else:
                del step[start]
    return [pk for chain in chains.values() for pk in chain]


def _days(name):
    return timedelta(days=getattr(settings, name))


def _chunks(values):
    """`values` in lists of at most CHUNK."""
    values = list(values)
    return [values[start:start + CHUNK] for start in range(0, len(values), CHUNK)]


def _among(queryset, lookup, values):
    """The queryset's rows whose `lookup` is among `values`, asked CHUNK values at a time, in order
    of id."""
    rows = chain.from_iterable(queryset.filter(**{f"{lookup}__in": chunk}) for chunk in _chunks(values))
    return sorted(rows, key=attrgetter("pk"))


def archive_checkpoint(now):
    """The checkpoint the run's audit events end before, past the chain's start, whose event is
    older than the audit retention. While the trail's lowest partition is whole and sealed and the
    chain holds at most PARTITION_EVENTS events up to its last, the first one past that event: the
    run takes the rest of the partition, a checkpoint's stretch more at most, and drops it; until
    that checkpoint is old enough it takes none, rather than delete the partition's events a
    stretch a run. Else (no whole partition yet, a larger one, or SQLite) the first one: one
    stretch (AUDIT_CHECKPOINT_EVERY events after the first run), so a larger partition, such as
    the first one after an upgrade with the history before it (migration 0032), goes a stretch a
    run until the rest fits. None: no audit event goes."""
    origin = chain_start()
    start = origin.seq if origin else 1
    old_enough = AuditEvent.objects.filter(occurred_at__lte=now - _days("AUDIT_RETENTION_DAYS")).values("seq")
    checkpoints = ChainCheckpoint.objects.filter(seq__in=old_enough, seq__gt=start).order_by("seq")
    through = _whole_partition_last_seq(start)
    return checkpoints.first() if through is None else checkpoints.filter(seq__gt=through).first()


def _whole_partition_last_seq(start):
    """The last seq of the audit trail's lowest passed partition that holds events (ledger.partitions),
    if every event in it is sealed and the chain from `start` to it holds at most PARTITION_EVENTS:
    a run holds them all in one transaction, and deletes them row by row if the drop misses its
    lock (`_drop`). Else None."""
    with connection.cursor() as cursor:
        for partition in AUDIT.passed():
            cursor.execute(f"SELECT max(seq), EXISTS (SELECT 1 FROM {partition.name} WHERE seq IS NULL) "
                           f"FROM {partition.name}")
            last, unsealed = cursor.fetchone()
            if last is not None or unsealed:
                return None if unsealed or last - start + 1 > settings.PARTITION_EVENTS else last
    return None


@dataclass
class Batch:
    """What one run takes, model by model, in the order they are removed, then the audit
    events before the checkpoint (a query: a whole partition of them is too many to hold)."""

    checkpoint: ChainCheckpoint | None = None
    origin: ChainCheckpoint | None = None  # the chain's start before the run (`chain_start`; None: seq 1)
    rows: dict = field(default_factory=dict)
    events: QuerySet = field(default_factory=AuditEvent.objects.none)
    webhooks_before: datetime | None = None  # the webhook events' retention: older ones go

    def counts(self):
        counts = {model._meta.label_lower: len(rows) for model, rows in self.rows.items() if rows}
        events = self.events.count()
        return {**counts, AuditEvent._meta.label_lower: events} if events else counts

    def event_chunks(self, size=2000):
        """The audit events in chain order, `size` at a time."""
        last = None
        while rows := list((self.events if last is None else self.events.filter(seq__gt=last))
                           .order_by("seq")[:size]):
            yield rows
            last = rows[-1].seq


def collect(now, limit):
    """The rows one run takes (at most `limit` actions of no task, and `limit` tasks with theirs;
    `limit` closed dead letters of tasks, bulk redrives, incidents, webhook events, chain checks and
    walks each), locked: the caller's transaction. Alerts too: a delivery recorded meanwhile would
    go with its alert (CASCADE), unwritten; it waits for the run instead (dlq.alerts skips a locked
    alert)."""
    # Chosen, locked, then chosen again among the locked rows: what committed while a lock was
    # waited for (an incident a webhook opened under the action's lock; a task given up) is read
    # by the second choice's statements, not by the first's older snapshot.
    tasks, ids = _chosen(now, limit)
    tasks = _among(Task.objects.select_for_update().order_by("id"), "pk", tasks)
    actions = _among(Action.objects.select_for_update().order_by("id"), "pk", ids)
    kept_tasks, kept_actions = map(set, _chosen(now, limit, among=([task.pk for task in tasks],
                                                                   [action.pk for action in actions])))
    tasks = [task for task in tasks if task.pk in kept_tasks]
    actions = [action for action in actions if action.pk in kept_actions]
    entries = (_among(DeadLetter.objects.select_for_update(), "action", actions)
               + _among(DeadLetter.objects.select_for_update(), "task", tasks)
               + _closed_task_entries(now, limit, tasks))
    items = _among(ReviewItem.objects.select_for_update().order_by("id"), "action", actions)
    incidents = list(expired_incidents(now).select_for_update()[:limit])
    alerts = sorted(_among(Alert.objects.select_for_update().order_by("id"), "dead_letter", entries)
                    + _among(Alert.objects.select_for_update().order_by("id"), "review_item", items)
                    + _among(Alert.objects.select_for_update().order_by("id"), "incident", incidents),
                    key=attrgetter("pk"))
    checkpoint = archive_checkpoint(now)
    origin = chain_start()
    events = AuditEvent.objects.filter(seq__lt=checkpoint.seq, seq__gte=origin.seq if origin else 1) \
        if checkpoint else AuditEvent.objects.none()
    runs = _among(BulkRedrive.objects.select_for_update().order_by("id"), "pk",
                  expired_bulk_redrives(now).values_list("id", flat=True)[:limit])
    return Batch(checkpoint, origin, events=events, webhooks_before=now - _days("WEBHOOK_RETENTION_DAYS"), rows={
        BulkRedriveItem: _among(BulkRedriveItem.objects, "run", runs),
        BulkRedrive: runs,
        AlertDelivery: _among(AlertDelivery.objects, "alert", alerts),
        Alert: alerts,
        DeadLetter: entries,
        Incident: incidents,
        Approval: _among(Approval.objects, "item", items),
        DecisionLink: _among(DecisionLink.objects, "item", items),  # else CASCADE, unwritten
        ReviewItem: items,
        Booking: _among(Booking.objects, "action", actions),
        Confirmation: _among(Confirmation.objects, "task", tasks),
        Action: actions,
        TaskStep: _among(TaskStep.objects, "task", tasks),
        Task: tasks,
        WebhookEvent: list(WebhookEvent.objects.filter(received_at__lte=now - _days("WEBHOOK_RETENTION_DAYS"))
                           .order_by("id")[:limit]),
        ChainCheck: list(expired_chain_checks(now)[:limit]),
        ChainWalk: list(expired_chain_walks(now)[:limit]),
    })


def _chosen(now, limit, among=None):
    """The ids of the tasks a run takes (at most `limit`, finished, with none of their actions
    waiting) and of the actions (at most `limit` of no task, the tasks' own, each with the
    originals it superseded), sorted; with `among`, (tasks, actions) chosen before, only of
    those."""
    if among is None:
        tasks = list(expired_tasks(now).values_list("id", flat=True)[:limit])
        alone = list(expired_actions(now).only("id", "supersedes_id")[:limit])
    else:
        tasks = [task.pk for task in _among(expired_tasks(now).only("id"), "pk", among[0])]
        alone = _among(expired_actions(now).only("id", "supersedes_id"), "pk", among[1])
    ids = _with_originals(alone + _among(Action.objects.only("id", "supersedes_id"), "task", tasks), now)
    # Once each: an edit-down's original comes as its version's and as its task's, and two chunks
    # would take it twice (one statement folded the two away).
    return sorted(tasks), sorted(set(ids))


def _closed_task_entries(now, limit, tasks):
    """Closed dead letters of tasks past their retention, oldest first, locked, but those of
    `tasks`, which go with theirs (left out here, not in the query: a list of every task a run
    takes would be too long a statement)."""
    taken = {task.pk for task in tasks}
    closed = (DeadLetter.objects.select_for_update()
              .filter(task__isnull=False, created_at__lte=now - _days("DEAD_LETTER_RETENTION_DAYS"))
              .exclude(status=EntryStatus.OPEN).exclude(IN_A_BULK_REDRIVE).order_by("id")[:limit])
    return [entry for entry in closed if entry.task_id not in taken]


class ArchiveRefused(Exception):
    """A run refused: the audit events it would take are not the chain its checkpoint vouches for."""

    def __init__(self, checkpoint, why):
        super().__init__(f"archive refused: the audit events before the {checkpoint} are not the chain it vouches "
                         f"for ({why}); nothing was archived")
        self.checkpoint = checkpoint
        self.why = why


def _unvouched(batch):
    """Why the run may not take its audit events (None if it may): the chain walked from its start
    (the checkpoint's event an earlier run left, checked first as `verify_chain` does; else seq 1)
    through the checkpoint's own event, each event's content hash recomputed, each link, and the
    checkpoint checked as its event goes by (`chain_report`). Once they are gone every check starts
    at the checkpoint, and only the link from the last of them into its event ties them to anything
    signed: a stretch rewritten behind the ledger's back after the walk passed it (each content hash
    recomputed, each event linked to the one before) breaks there alone, and nothing would look
    again. The stretch is read twice so, walked here and then written (decision 44 measures it)."""
    checkpoint, origin = batch.checkpoint, batch.origin
    if checkpoint is None:
        return None
    if origin is not None and (why := origin.problem()):
        return str(ChainReport(origin.seq, why, origin.seq - 1, 0))
    report = AuditEvent.objects.chain_report(origin.seq + 1 if origin else 1, through=checkpoint.seq, at_end=False)
    return None if report.broken_at is None else str(report)


class _WholeTimes(DjangoJSONEncoder):
    """Django's encoder, but a datetime keeps its microseconds and its offset as `isoformat`
    writes them: Django's cuts them to milliseconds, and an archived audit event's content hash is of
    its time as `isoformat` gives it (ledger.audit.AuditEvent.content_fields), so the file's
    events could not be checked from their fields, nor any row read back with its own times."""

    def default(self, o):
        if isinstance(o, datetime):
            return o.isoformat()
        return super().default(o)


def _line(record):
    return json.dumps(record, cls=_WholeTimes, sort_keys=True, separators=(",", ":")) + "\n"


def write_file(path, batch, now, counts):
    """The file: a header naming the checkpoint and the counts, then one line per row
    (`model`, `pk`, `fields`); synced before the rows are removed. Returns its SHA-256.

    The header names the checkpoint's event's prev_hash and content_hash too, which hash (with its
    seq) to the hash the checkpoint signs: the file's last event is checked against them, so the
    file is tied to its checkpoint alone, whether its event is still in the database or in a later
    file (ledger.evidence.archived_events)."""
    digest = hashlib.sha256()
    checkpoint = batch.checkpoint
    header = {"archive": 1, "written_at": now, "counts": counts, "checkpoint": checkpoint and {
        "seq": checkpoint.seq, "hash": checkpoint.hash, "signature": checkpoint.signature,
        **AuditEvent.objects.filter(seq=checkpoint.seq).values("prev_hash", "content_hash").get()}}
    with open(path, "x", encoding="utf-8") as out:
        rows = chain(batch.rows.values(), batch.event_chunks())  # the events read a chunk at a time
        for record in chain([header], chain.from_iterable(serializers.serialize("python", r) for r in rows)):
            line = _line(record)
            digest.update(line.encode())
            out.write(line)
        out.flush()
        os.fsync(out.fileno())
    _sync(path.parent)
    return digest.hexdigest()


def _sync(directory):
    """Sync a directory: a file's fsync makes its contents durable, not its name, which a power
    loss after the commit could lose, leaving an Archive that names no file."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(batch, archive):
    """The rows removed, dependents first (each model's PROTECT holds), but those of the
    partitions whose every row is in this file or an earlier one (ledger.partitions): the webhook
    events' that hold only events past their retention and none after the last one taken (a run
    takes at most `limit`, oldest first), the audit trail's that hold only events before the
    checkpoint. Rows are named CHUNK a statement. Returns those partitions, with the rows taken (a
    query a chunk), for `_drop`."""
    whole = []
    for model, rows in batch.rows.items():
        taken = [model.objects.filter(pk__in=chunk) for chunk in _chunks(row.pk for row in rows)]
        if model is WebhookEvent and rows:
            partitions = WEBHOOKS.droppable("received_at > %s OR id > %s", [batch.webhooks_before, rows[-1].pk])
            whole.append((WEBHOOKS, partitions, taken))
            taken = [chunk.exclude(_held_by(partitions)) for chunk in taken]
        if model is Action:
            _versions_first(rows)
        else:
            for chunk in taken:
                chunk.delete()
    if batch.checkpoint:
        partitions = AUDIT.droppable("seq IS NULL OR seq >= %s", [batch.checkpoint.seq])
        whole.append((AUDIT, partitions, [batch.events]))
        batch.events.exclude(_held_by(partitions)).delete()
    for connector, events in groupby(batch.rows[WebhookEvent], key=attrgetter("connector")):
        for chunk in _chunks(event.event_id for event in events):
            WebhookClaim.objects.filter(connector=connector, event_id__in=chunk).delete()
    ArchivedKey.objects.bulk_create([
        ArchivedKey(operation_key=a.operation_key, agent_id=a.agent_id, created_at=a.created_at,
                    archive_sha256=archive.sha256) for a in batch.rows[Action]], batch_size=CHUNK)
    ArchivedTask.objects.bulk_create([
        ArchivedTask(task_id=t.task_id, agent_id=t.agent_id, created_at=t.created_at, archive_sha256=archive.sha256)
        for t in batch.rows[Task]], batch_size=CHUNK)
    return whole


def _versions_first(actions):
    """Delete the actions, each before the one it superseded (which it PROTECTs)."""
    left = {action.pk: action.supersedes_id for action in actions}
    while left:
        superseded = set(left.values())
        last = [pk for pk in left if pk not in superseded]
        for chunk in _chunks(last):
            Action.objects.filter(pk__in=chunk).delete()
        for pk in last:
            del left[pk]


def _held_by(partitions):
    """The rows inside the partitions' ranges (none if there are none). Not every row below the
    last one: the default partition holds the ids it took while the sweeper was away, and the
    ranges made after start above them (decision 52)."""
    inside = Q()
    for partition in partitions:
        above = Q() if partition.low is None else Q(id__gte=partition.low)  # None: from MINVALUE
        inside |= above & Q(id__lt=partition.high)
    return inside


def _drop(whole):
    """The archived partitions dropped, the run's last statements: a drop holds its table's parent,
    and with it every insert, until the commit, which comes next. The rows of one whose parent
    stayed busy past the lock timeout (and of those above it) are deleted instead: at most a run's
    take (`limit` webhook events; PARTITION_EVENTS audit events and a checkpoint's stretch,
    `archive_checkpoint`), which takes long. So the drops go in one savepoint, and a busy one rolls
    them all back, which frees the parents already held (the webhook events' while the trail's was
    busy: every webhook waited for the trail's deletes); its rows are deleted, holding no parent,
    and the rest are dropped again. Each insert so waits for one lock timeout at the most."""
    left = list(whole)
    while left:
        savepoint = transaction.savepoint()
        for at, (table, partitions, taken) in enumerate(left):
            dropped = table.drop(partitions)
            if len(dropped) < len(partitions):
                break
        else:
            transaction.savepoint_commit(savepoint)
            return
        transaction.savepoint_rollback(savepoint)  # every drop undone, every parent freed
        for chunk in taken:  # the busy table's, from the partition it was busy for
            chunk.filter(_held_by(partitions[len(dropped):])).delete()
        left[at] = (table, dropped, taken)


def archive_expired(directory, *, dry_run=False, limit=10000, now=None):
    """One run, of at most `limit` of each kind (`collect`); returns the
    Archive (None if there was nothing to take, or `dry_run`) and the counts it took. Raises
    ArchiveRefused, having taken nothing, if its audit events are not the chain their checkpoint
    vouches for (`_unvouched`). `now` is the database's (ledger.clock): on a host whose clock ran
    ahead, a run would take keys still within their lifetime."""
    now = now or clock.now()
    try:
        with transaction.atomic():
            take_turns(ARCHIVE_RUN)  # first: a second run waits here, then finds what this one took gone
            batch = collect(now, limit)
            counts = batch.counts()
            if dry_run or not counts:
                transaction.set_rollback(True)  # nothing written; the locks go with the transaction
                return None, counts
            if why := _unvouched(batch):
                raise ArchiveRefused(batch.checkpoint, why)
            path = Path(directory) / f"surety-archive-{now:%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:8]}.jsonl"
            sha256 = write_file(path, batch, now, counts)
            # First: the audit trail lets its events go only before the checkpoint an Archive names.
            archive = Archive.objects.create(file=path.name, sha256=sha256, removed=counts,
                                             checkpoint=batch.checkpoint)
            whole = _remove(batch, archive)
            AuditEvent.objects.record(actor=ACTOR, verb="archived", obj=archive, after={
                "file": path.name, "sha256": sha256, "removed": counts,
                "checkpoint": batch.checkpoint and batch.checkpoint.seq})
            _drop(whole)
    except ArchiveRefused as refused:
        # After the run's rollback, on its own: the refusal stays though nothing else does.
        with transaction.atomic():
            AuditEvent.objects.record(actor=ACTOR, verb="archive_refused", obj=refused.checkpoint,
                                      after={"checkpoint": refused.checkpoint.seq, "why": refused.why})
        logger.error("%s", refused)
        raise
    return archive, counts
