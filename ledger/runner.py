"""Running a claimed task: resume at the first step that is not done, checkpoint each step.

1. Read the steps; done ones only lend their results. Keep the lease alive (each checkpoint
   renews it; a heartbeat tops it up when half is gone); a lost lease means someone else
   runs the task now, so stop without writing.
2. Run the step: a read step calls out; an effect step records its action (key
   `{task_id}:{step}:v1`) and drives it through the guarded executor; a local step writes
   in the checkpoint's own transaction.
3. Checkpoint: step done, with its result, under the claim's fencing token.
4. An action waiting for a person -> the task waits; an action not settled yet -> the task
   is deferred without spending an attempt; a failure -> retry with backoff, or the
   dead-letter queue when attempts are spent, or `failed` at once if it is not retryable.
"""

import logging
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings

from django.db import transaction

from . import clock
from .actions import DecisionTaken, KeyReused, Refused, action_request, action_retry
from .compiled import update
from .connectors.http import cut_message
from .executor import action_claim_next, action_run_claimed
from .grants import grant_state
from .jobs import drain, worker_name
from .json_input import storable
from .models import (PERSON_STATUSES, Action, ActionStatus, AuditEvent, Capability, GrantState, StepStatus, Task,
                     TaskState)
from .outages import UNREACHABLE
from .retry import backoff_until
from .statemachine import StaleClaim
from .tasks import defer_until, task_claim_next
from .versions import latest_version
from .workflows import WORKFLOWS, StepFailed

logger = logging.getLogger("surety.runner")
A = ActionStatus


@dataclass
class StepContext:
    task: Task
    input: dict
    results: dict = field(default_factory=dict)


class Paused(Exception):
    """The run ends here without failing: the task waits or was deferred."""


def task_run(task):
    claim = task.fence
    ctx = StepContext(task=task, input=task.input)
    try:
        for row in task.steps.order_by("position"):
            if row.status == StepStatus.DONE:
                ctx.results[row.name] = row.result
                continue
            if task.lease_left() < renewed_below() and not task.heartbeat():
                return None
            try:
                _run_step(task, claim, _step(task, row), row, ctx)
            except StepFailed as exc:
                return _fail(task, claim, row, exc)
            except (Paused, StaleClaim):
                raise
            except UNREACHABLE:
                raise  # the database, not the step, failed: the drain lane gives the run back (task_give_back)
            except Exception as exc:  # a bug or an outage in a step: retry, then dead-letter
                logger.exception("step %s of %s crashed", row.name, task)
                return _fail(task, claim, row, StepFailed(f"{type(exc).__name__}: {exc}", retryable=True, code="crash"))
        return task.mark_succeeded(claim=claim)
    except Paused:
        return task
    except StaleClaim:
        logger.warning("%s: claim lost; another worker runs it now", task)
        return None


def renewed_below():
    """The lease left under which a run renews its task's lease at a step's start: half of it. A
    step must finish in what is left then, its look and its call included (ledger.checks warns of
    settings that do not hold them, surety.W008): the sweeper takes back a run whose lease lapsed."""
    return settings.LEASE_SECONDS / 2


def _step(task, row):
    """The step the checkpoint's row names, in its workflow as this code has it. One a deploy
    renamed or removed (or its workflow) while a task stood at it fails the run, retryably: a
    deploy may bring it back, and a person redrives the task then. Looked up outside the step's
    run, it stopped every run before anything was written, and the task sat `running` until its
    lease lapsed, to be dead-lettered as `worker_lost`."""
    workflow = WORKFLOWS.get(task.workflow)
    step = next((s for s in workflow.steps if s.name == row.name), None) if workflow else None
    if step is None:
        raise StepFailed(f"the {task.workflow} workflow has no step {row.name}", retryable=True, code="unknown_step")
    return step


def _run_step(task, claim, step, row, ctx):
    if step.kind == "read":
        result = storable(step.run(ctx))  # a provider's answer, as an effect's is kept (json_input)
        _checkpoint(task, claim, row, lambda: result)
    elif step.kind == "local":
        _checkpoint(task, claim, row, lambda: step.run(ctx, row.idempotency_key))
    else:
        action = _drive(task, claim, row, step.run(ctx))
        version = {"operation_key": action.operation_key} if action.operation_key != row.idempotency_key else {}
        _checkpoint(task, claim, row, lambda: {"external_ref": action.external_ref,
                                               "action_status": action.status, **version})
    ctx.results[row.name] = row.result


def _drive(task, claim, row, spec):
    """Take the step's action as far as this worker can; return it once succeeded.

    The step's action has the authority a direct request of the agent would have: the
    workflow's grant lets the agent start the task, its grant for the action type decides
    the action (none: the step fails `forbidden`; shadow: the action is recorded `shadow`,
    never executed, and the task fails `shadow` before any later step runs). Without a grant
    nothing new is recorded, but what the step recorded before a revoke stands: its action may
    have succeeded already, and the task goes on from it."""
    state = grant_state(task.agent, Capability.Kind.ACTION_TYPE, spec.action_type)
    if state is None:
        action = Action.objects.filter(operation_key=row.idempotency_key, agent=task.agent).first()
        if action is None:
            raise StepFailed(f"{task.agent} holds no grant for {spec.action_type}", retryable=False, code="forbidden")
    else:
        try:
            with transaction.atomic():
                _hold_claim(task, claim)
                action, _ = action_request(
                    agent=task.agent, operation_key=row.idempotency_key, action_type=spec.action_type,
                    target=spec.target, customer=spec.customer, params=spec.params,
                    task=task, decision_id=spec.decision_id or task.task_id, shadow=state == GrantState.SHADOW,
                )
        except KeyReused as exc:
            raise StepFailed(f"{row.idempotency_key}: the effect is recorded under {exc.existing.operation_key} as "
                             "another request (its params, customer or decision)", retryable=False,
                             code="idempotency_key_reused") from None
        except DecisionTaken as exc:
            raise StepFailed(f"{row.idempotency_key}: another agent's {spec.action_type} for this decision is "
                             "recorded; nothing was recorded", retryable=False, code="decision_taken") from None
        except Refused as exc:
            raise StepFailed(f"{row.idempotency_key} was refused: {exc}", retryable=False, code=exc.code) from None
        if action.task_id != task.pk:
            # Recorded outside this task: under the step's key (by another agent, who guessed the
            # task's id), or for the same decision (the agent's direct request, another task).
            # Not this step's effect to go on from: the task stops, and the effect is not made twice.
            raise StepFailed(f"{row.idempotency_key}: the effect is recorded outside this task, under "
                             f"{action.operation_key}", retryable=False, code="idempotency_key_reused")
    if action.status == A.SHADOW:
        raise StepFailed(f"{row.idempotency_key} was recorded shadow, never executed: {task.agent}'s grant for "
                         f"{spec.action_type} is not live", retryable=False, code="shadow")
    action = latest_version(action)  # a person edited it down: the task goes on with their version
    if action.is_retryable_failure:
        with transaction.atomic():
            _hold_claim(task, claim)
            action = action_retry(action, actor="system:runner", reason=f"task attempt {task.attempts}")
    if action.status in (A.QUEUED, A.UNKNOWN):
        claimed = action_claim_next(worker_name(), only=action.pk)
        if claimed is not None:
            action_run_claimed(claimed)
        action = Action.objects.get(pk=action.pk)
    if action.status == A.SUCCEEDED:
        return action
    if action.status in PERSON_STATUSES:
        # Action first, then task (the order of a person's decision): a decision taken just
        # now must not leave the task waiting for a wake-up that already happened.
        with transaction.atomic():
            if Action.objects.select_for_update().filter(pk=action.pk, status__in=PERSON_STATUSES).exists():
                task.wait_for_person(claim=claim, reason=f"{action.operation_key} is {action.status}")
            else:
                task.defer(claim=claim, until=clock.now(), reason=f"{action.operation_key} was just decided")
        raise Paused
    if action.status == A.FAILED:
        error = action.error or {}
        raise StepFailed(error.get("message", "the action failed"), retryable=bool(error.get("retryable")),
                         code=error.get("code", "action_failed"), retry_after=error.get("retry_after"))
    if action.status == A.EXPIRED:
        # Its error's code says so (approval_expired, held by the database): not a person's no.
        raise StepFailed(f"{action.operation_key} expired: {action.error['message']}", retryable=False,
                         code=action.error["code"])
    if action.status in (A.REJECTED, A.CANCELLED):
        raise StepFailed(f"{action.operation_key} was {action.status}", retryable=False,
                         code=f"action_{action.status}")
    task.defer(claim=claim, until=defer_until(action), reason=f"{action.operation_key} is {action.status}")
    raise Paused


def _hold_claim(task, claim):
    """Lock the task's row to the end of the transaction, if this run still holds its claim. A
    step's action is written under it: a run that stalled past its lease check, its task given
    up meanwhile (its actions not started cancelled, task_actions_let_go), would otherwise queue
    one under a task that never runs again, which nothing runs or cancels, holding its order
    and customer for good. No key: the action's insert still refers to the row."""
    held = Task.objects.select_for_update(no_key=True).filter(pk=task.pk, fence=claim, state=TaskState.RUNNING)
    if not held.exists():
        raise StaleClaim(f"{task}: claim {claim} superseded")


def _checkpoint(task, claim, row, produce):
    """Step done and its result, in one transaction with the step's own local writes."""
    with transaction.atomic():
        # Fenced and locking in one statement: the row stays locked to commit, and a run
        # whose claim was taken over writes nothing. It renews the lease too: a run that
        # makes progress keeps its claim.
        now = clock.now()
        task.updated_at, task.lease_expires_at = now, now + timedelta(seconds=settings.LEASE_SECONDS)
        if not update(task, ["updated_at", "lease_expires_at"], fence=claim, state=TaskState.RUNNING):
            raise StaleClaim(f"{task}: claim {claim} superseded")
        row.mark_done(produce())
        AuditEvent.objects.record(actor="system:runner", verb="step_done", obj=task,
                                  after={"step": row.name, "result": row.result})


def _fail(task, claim, row, exc):
    # Storable first, as the executor settles an answer: a step's message may carry a provider's
    # words (a NUL, a lone surrogate), and a failure PostgreSQL refuses to record would leave the
    # task running until its lease lapsed, and the sweeper dead-letter it as `worker_lost`. Bounded
    # as a provider's message is (docs/contract.md), its start kept: a step that put a whole answer
    # in its exception (a crash's message) had it stored whole in the task's last error, its step
    # row, its audit events and its dead letter, and carried by every read of the task.
    message = cut_message(str(exc))
    error = storable({"code": exc.code, "message": message, "retryable": exc.retryable, "step": row.name})
    with transaction.atomic():
        row.mark_failed(error)
        if not exc.retryable:
            return task.mark_failed(actor="system:runner", error=error, claim=claim)
        if task.attempts >= task.max_attempts:
            return task.mark_dead_lettered(actor="system:runner", error=error, claim=claim)
        return task.retry_later(claim=claim, error=error, until=backoff_until(task.attempts, wait=exc.retry_after))


def task_give_back(task):
    """A run the database interrupted, handed back once it answers again (ledger.jobs.drain):
    no attempt spent, as for a run that waits. Three short outages used to spend a task's three
    attempts, and the last one dead-lettered it as `worker_lost`.

    Only a run still under way is given back: the connection may have dropped at the COMMIT of
    the run's own last move (waiting for a person, say) after the database made it. Given back
    then, a waiting task would be queued behind the person's back, its attempt returned twice."""
    with transaction.atomic():
        if not Task.objects.select_for_update().filter(pk=task.pk, fence=task.fence, state=TaskState.RUNNING).exists():
            logger.info("%s moved on meanwhile (its run's last move, the sweeper, or settled): not given back", task)
            return
        task.defer(claim=task.fence, until=clock.now(), reason="the database was unreachable during the run")


def drain_tasks():
    """The RQ job a doorbell rings for (see jobs.py): run tasks until none is ready."""
    return drain("tasks", task_claim_next, task_run, give_back=task_give_back)
