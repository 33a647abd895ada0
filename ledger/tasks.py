"""Tasks: intake, claiming, and what ties a task to its actions and to the sweeper.

The runner that executes a claimed task's steps is `ledger.runner`.
"""

from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction

from . import clock, hooks
from .actions import KeyReused, action_done_by_hand, action_give_up, fingerprint
from .compiled import update
from .jobs import ring_after_commit
from .models import PERSON_STATUSES, ActionStatus, AuditEvent, Task, TaskState, TaskStep
from .recipients import customer_spelled_before
from .retention import archived_task_expired, refused_as_archived
from .workflows import WORKFLOWS

T = TaskState
# A task in one of these runs no step until a person redrives it (dead-lettered), or ever again.
TASK_STOPPED = (T.DEAD_LETTERED, T.CANCELLED, T.FAILED, T.SUCCEEDED)


_UNREAD = object()


def task_request(*, agent, task_id, workflow, input, found=_UNREAD):
    """Return `(task, created)`; the same rules as actions: replay, KeyReused, or a new task.
    `found`: the task under `task_id` (anyone's) as the caller read it just now, None if none (the
    API reads it first, to answer a replay from the row): a new task is not looked for twice."""
    print_ = fingerprint(f"workflow:{workflow}", task_id, input)
    existing = Task.objects.filter(task_id=task_id).first() if found is _UNREAD else found
    if existing is None:
        try:
            with transaction.atomic():
                task = Task.objects.create(
                    task_id=task_id, fingerprint=print_, workflow=workflow, input=input, agent=agent,
                    max_attempts=settings.MAX_ATTEMPTS, next_attempt_at=clock.now(),
                )
                TaskStep.objects.bulk_create(
                    TaskStep(task=task, position=i, name=step.name, idempotency_key=step.key(task))
                    for i, step in enumerate(WORKFLOWS[workflow].steps)
                )
                AuditEvent.objects.record(actor=agent, verb="requested", obj=task, after={"state": task.state})
                ring_after_commit("tasks")
            return task, True
        except IntegrityError as exc:
            if refused_as_archived(exc):  # its task was archived past the id's lifetime
                raise archived_task_expired(task_id) from None
            existing = Task.objects.filter(task_id=task_id).first()
            if existing is None:
                raise
    # One recorded before customers were kept in one spelling holds its input's customer as it
    # was written then: its retry as sent then is compared in that spelling (decision 61).
    recorded = existing.input.get("customer")
    if customer_spelled_before(recorded, input.get("customer")):
        print_ = fingerprint(f"workflow:{workflow}", task_id, {**input, "customer": recorded})
    if existing.fingerprint != print_:
        raise KeyReused(existing)
    return existing, False


def task_claim_next(owner, *, only=None):
    """Claim the next due task (or the task `only`, if it is due), as a drain lane does."""
    with transaction.atomic():
        due = Task.objects.select_for_update(skip_locked=True).filter(state=T.QUEUED, next_attempt_at__lte=clock.now())
        task = (due if only is None else due.filter(pk=only)).order_by("next_attempt_at", "id").first()
        return task.claim(owner=owner, locked=True) if task else None


def task_ring_when_queued(task, previous, actor, reason):
    """After every move of a task: a task queued again gets a drain when it is due."""
    if task.state == T.QUEUED:
        ring_after_commit("tasks", at=task.next_attempt_at)


def task_follow_action(action, previous, actor, reason):
    """In the transaction of an action's move: a task waiting on it wakes when a person
    (or verification) has decided, so its runner can go on or fail."""
    if action.task_id is None or action.status in PERSON_STATUSES:
        return
    task = Task.objects.select_for_update().filter(pk=action.task_id, state=T.WAITING).first()
    if task is not None:
        task.wake(actor="system:runner", reason=f"{action.operation_key} is now {action.status}")


def task_actions_let_go(task, *, actor, reason, by_hand=False):
    """Cancel the actions `task` had not started, as a person gives the task up (discarded) or
    does its work by hand (`by_hand`: its dead letter resolved): it will not run again, and
    nothing else runs a task's action (ledger.executor). Left queued or held, each would count as
    in flight on its order and customer for good, holding every later action on them for a person.
    A failed one is failed for good, as one that fails after this does (`task_action_fail`: its
    call verified absent, or a person confirming absent one whose outcome was theirs to decide):
    left retryable, it would tell its agent it may still run, and keep what it held for a retry
    that never comes. Given up (`action_give_up`), it leaves its customer's daily total and a
    booking its slot; done by hand (`action_done_by_hand`), the person made its effect: it stays
    in the total, a booking keeps its slot, and no retry may make it again.

    Under the task's lock, which the runner records a step's action under and a failure of the
    task's action is settled under (`task_stopped`): either,
    committing meanwhile, would leave an action this does not see, queued, or failed retryable,
    holding what it held for good.

    The actions not started are listed under their own locks, as a person's decision or the
    sweeper moves one (approvals.decisions, approvals.reviews.approval_expire_due): listed without,
    one rejected or expired meanwhile refused its cancel, and the give-up with it. The list waits
    for a move under way rather than passing over its action (skip_locked): PostgreSQL looks at the
    action again once it is let go, and lists it only if it is still not started (an approval
    queues it), so nothing the task had not started is left to run."""
    Task.objects.select_for_update(no_key=True).filter(pk=task.pk).exists()
    not_started = (ActionStatus.QUEUED, ActionStatus.HELD, ActionStatus.AWAITING_APPROVAL)
    for action in task.actions.select_for_update().filter(status__in=not_started).order_by("pk"):
        action.cancel(actor=actor, reason=f"its task {task.task_id} will not run again: {reason}", locked=True)
    if by_hand:
        fail_for_good, why, mark = action_done_by_hand, "was done by hand", "done_by_hand"
    else:
        fail_for_good, why, mark = action_give_up, "will not run again", "given_up"
    for action in task.actions.filter(status=ActionStatus.FAILED).order_by("pk"):
        fail_for_good(action, actor=actor, reason=f"its task {task.task_id} {why}: {reason}")
    _task_marked(task, mark, actor=actor, reason=reason)


def _task_marked(task, mark, *, actor, reason):
    """The locked task's checkpoint says what a person made of it, as its actions' errors do (its
    last error: no retry, and `done_by_hand` or `given_up`): its agent, reading it, would otherwise
    wait for a redrive that never comes, and an action of it that fails later (its call verified
    absent, or marked failed by a person) is marked the same way (`task_action_fail`). Done by hand, its
    state stays where the work stopped (dead-lettered, failed)."""
    row = Task.objects.get(pk=task.pk)
    before = {"state": row.state, "last_error": row.last_error}
    row.last_error = {**(row.last_error or {}), "retryable": False, mark: True}
    row.updated_at = clock.now()
    update(row, ["last_error", "updated_at"])
    AuditEvent.objects.record(actor=actor, verb=mark, obj=row, before=before,
                              after={"state": row.state, "last_error": row.last_error}, reason=reason)


def task_stopped(action):
    """The task id, state and last error of the action's task if it has stopped, its row locked
    until the caller's transaction settles the action: a redrive, a discard or a resolve by hand
    (each under the task's lock, its entry with it) committing meanwhile would otherwise leave the
    failure retryable under a task that never runs again (holding what it held for good), or
    failed for good under one that was just redriven. None for a running task or none."""
    return action.task_id and Task.objects.select_for_update(no_key=True).filter(
        pk=action.task_id, state__in=TASK_STOPPED).values_list("task_id", "state", "last_error", named=True).first()


def task_action_fail(action, stopped, fail, *, actor):
    """Fail `action` by `fail(retryable=...)` (its `mark_failed`, as the executor makes it after a
    call or a look, or a person who confirms its effect absent: approvals.decisions), `stopped`
    what `task_stopped` read of its task. The one rule of whether such a failure may be retried:
    only if its task may run again, since nothing else retries a task's action (its runner does,
    looking first). Running, or dead-lettered with its entry open (a person may redrive it:
    hooks.redrivable), it may. Under any other stopped task it is failed for good, and what it held
    goes on, as after any failure for good: one a person finished by hand (its entry resolved) is
    done by hand too (a booking keeps its slot, a refund stays in the daily total), and one a
    person gave up (its entry discarded) is given up, as each is when it failed before the
    person's word (`task_actions_let_go`, which leaves a failure it cannot see yet, an outcome
    still unknown or a person's to decide, to this). Returns the action as it ends, or what `fail`
    returned if it wrote nothing."""
    if not stopped:
        return fail(retryable=True)
    said = stopped.last_error or {}
    by_hand = bool(said.get("done_by_hand"))
    # Done by hand, it fails as one that keeps what it held (a booking its slot), which the person's
    # work keeps from then on (action_done_by_hand).
    failed = fail(retryable=by_hand or hooks.redrivable(action.task_id))
    if failed is not None and by_hand:
        return action_done_by_hand(failed, actor=actor, reason=f"its task {stopped.task_id} was done by hand")
    if failed is not None and said.get("given_up"):
        return action_give_up(failed, actor=actor, reason=f"its task {stopped.task_id} was given up")
    return failed


def task_expire_leases():
    """Running tasks whose worker vanished go back to the queue — or, out of attempts
    (a task that keeps killing its workers), to the dead-letter queue."""
    taken = 0
    while True:
        with transaction.atomic():
            task = (
                Task.objects.select_for_update(skip_locked=True)
                .filter(state=T.RUNNING, lease_expires_at__lt=clock.now())
                .first()
            )
            if task is None:
                return taken
            reason = f"the worker {task.lease_owner} stopped renewing its lease"
            if task.attempts >= task.max_attempts:
                task.mark_dead_lettered(actor="system:sweeper", claim=task.fence,
                                        error={"code": "worker_lost", "message": reason, "retryable": True})
            else:
                task.take_back(reason=reason)
            taken += 1


def task_runnable_exists():
    return Task.objects.filter(state=T.QUEUED, next_attempt_at__lte=clock.now()).exists()


def task_run_now(task, *, actor, reason="run now"):
    """An operator skips the rest of a backoff."""
    with transaction.atomic():
        task = Task.objects.select_for_update().get(pk=task.pk)
        if task.state != T.QUEUED:
            return task
        before = {"next_attempt_at": task.next_attempt_at and task.next_attempt_at.isoformat()}
        task.next_attempt_at = clock.now()
        task.save(update_fields=["next_attempt_at"])
        AuditEvent.objects.record(actor=actor, verb="run_now", obj=task, before=before,
                                  after={"next_attempt_at": task.next_attempt_at.isoformat()}, reason=reason)
        ring_after_commit("tasks")
    return task


def defer_until(action):
    """When to look at an unsettled action again: when it is due (a retry's backoff, a
    verification's time); pending under another run's claim, after half the time it has been
    pending, a second at first, and no later than the sweeper may take it for verification (its
    lease's end and CONNECTOR_TIMEOUT). A call settles within seconds; one whose worker died is
    looked at a handful of times until then, not every second: each look is a claim and a
    deferral, two audit events."""
    now = clock.now()
    soon = now + timedelta(seconds=1)
    if action.status == ActionStatus.PENDING and action.lease_expires_at is not None:
        pending_for = now - (action.lease_expires_at - timedelta(seconds=settings.LEASE_SECONDS))
        verifiable = action.lease_expires_at + timedelta(seconds=settings.CONNECTOR_TIMEOUT)
        return max(soon, min(now + pending_for / 2, verifiable))
    return max(action.next_attempt_at or soon, soon)
