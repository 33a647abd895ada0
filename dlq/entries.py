"""Working the dead-letter queue: redrive, resolve by hand, discard. Each one audited.

Permission checks belong to the callers (the pages); these functions only do the work.
An entry is about a task or a standalone action; each function says what it does to either.
"""

from django.db import transaction

from ledger.actions import action_done_by_hand, action_give_up, action_retry, action_retry_by_person
from ledger.models import Task, TaskState
from ledger.statemachine import InvalidTransition
from ledger.tasks import task_actions_let_go

from .models import DeadLetter, EntryStatus


def _open_entry(entry):
    shown = entry
    entry = (DeadLetter.objects.select_for_update(of=("self",)).select_related("task", "action")
             .filter(pk=entry.pk).first())
    if entry is None:  # closed, and past its retention: an archive run took it since the page was read
        raise InvalidTransition(f"dead letter #{shown.pk} was {shown.status} and has been archived since")
    if entry.status != EntryStatus.OPEN:
        raise InvalidTransition(f"{entry} was already {entry.status} by {entry.decided_by}")
    return entry


def _lock_actions_asked(entry):
    """Lock the actions whose keys the locked `entry`'s `redrive_refusal` asks about, oldest first,
    before it asks: reconciliation opens its incident under the action's lock (dlq.incidents), and
    a redrive that asked first, then waited for that lock, requeued what the provider holds an
    effect of once the incident committed. A task's row first: entries, tasks, then actions, the
    order a discard or a resolve (ledger.tasks.task_actions_let_go) and the executor
    (ledger.executor._again) take them in. FOR UPDATE, as the moves that follow lock the task and
    the action: no lock is made stronger halfway through."""
    if entry.task_id:
        Task.objects.select_for_update().filter(pk=entry.task_id).exists()
    list(entry.actions_asked().select_for_update().order_by("pk").values_list("pk", flat=True))


def deadletter_redrive(entry, *, actor, reason):
    """A task goes back to `queued` and resumes from its checkpoint: done steps stay done.

    An action goes back to `queued` under the ledger's retry rule (held instead while another
    action on its target or customer is in flight), for one more attempt by the guarded
    executor, which verifies at the provider first wherever an outcome was unknown. A failure
    marked permanent is retried only by a person who gives a reason (`action_retry_by_person`).
    """
    reason = reason.strip()
    if not reason:
        raise ValueError("a reason is required to redrive")
    with transaction.atomic():
        entry = _open_entry(entry)
        _lock_actions_asked(entry)
        if entry.redrive_refusal:  # a failed task is final; an effect the provider holds is done
            raise InvalidTransition(f"{entry} cannot be redriven: {entry.redrive_refusal}")
        if entry.task_id:
            entry.task.redrive(actor=actor, reason=reason)
        elif entry.action.is_retryable_failure:
            action_retry(entry.action, actor=actor, reason=reason)
        else:
            action_retry_by_person(entry.action, actor=actor, reason=reason)
        return entry.redrive(actor=actor, reason=reason, locked=True)


def deadletter_resolve(entry, *, actor, note):
    """A person finished the job by hand; the note says what they did. The task stays as it is,
    its actions not yet started cancelled (nobody runs them now); a failed action, the entry's or
    the task's, is failed for good as done by hand (`action_done_by_hand`): no retry may do it
    again, and what it did stands (a booking's slot and decision, a refund in the customer's daily
    total). A booking that had failed for good takes its slot and decision again: if another
    booking took either since, the resolve is refused (InvalidTransition, saying what holds it)
    and the entry stays open, to be discarded instead."""
    if not note.strip():
        raise ValueError("say what was done by hand")
    with transaction.atomic():
        entry = _open_entry(entry)
        if entry.task_id:
            task_actions_let_go(entry.task, actor=actor, reason=note, by_hand=True)
        elif entry.action_id:
            action_done_by_hand(entry.action, actor=actor, reason=note)
        return entry.resolve(actor=actor, note=note, locked=True)


def deadletter_discard(entry, *, actor, reason):
    """Give up: a dead-lettered task is cancelled, with its actions not yet started; a failed task
    stays `failed` (final), its actions not yet started cancelled too; an action stays `failed`,
    for good now (its entry was the way to retry it), and its error says a person gave it up
    (`given_up`): a booking lets go of its slot, and its decision may be asked again."""
    if not reason.strip():
        raise ValueError("a reason is required to discard")
    with transaction.atomic():
        entry = _open_entry(entry)
        if entry.task_id:
            if entry.task.state == TaskState.DEAD_LETTERED:
                entry.task.cancel(actor=actor, reason=reason)
            task_actions_let_go(entry.task, actor=actor, reason=reason)
        elif entry.action_id:
            # Failed for good now: a booking whose failure may be retried kept its slot for the
            # retry (ledger.actions.booking_follow_action); given up, none comes, and a slot kept
            # for nobody would refuse every other booking of that time, its decision every other
            # request for it.
            action_give_up(entry.action, actor=actor, reason=reason)
        return entry.discard(actor=actor, reason=reason, locked=True)
