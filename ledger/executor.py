"""The guarded executor: the only code that makes a connector write.

For each action it reads the ledger row under a lock and takes one of four branches:

1. `queued`: claim it (-> `pending`, under a lease, committed), look at its grant once more and
   call the provider (ledger.grants.grant_lapsed_now: a revoke waits for the call, or the call
   sees the revoke), record the outcome under the claim's fencing token;
   one whose grant lapsed since its claim is cancelled, never sent. One a person approved
   is claimed only while its params are the ones they approved; else it goes back to
   `awaiting_approval`, never to the provider. A failure tried again (it carries its error)
   asks the provider first, as in 3, and is called only if the effect is provably absent.
2. `succeeded`: return the stored result, never call.
3. `pending` (lease expired) / `unknown`: never call; ask the provider by operation key. Found
   -> `succeeded` (or a person reviews it if it is over its limit); provably absent -> `queued`
   for a new attempt under the same key; cannot tell -> `needs_review` with the evidence; the
   look rate-limited (a 429) -> asked again after the provider's wait, MAX_ATTEMPTS such looks in
   a row at most.
4. `failed` and not retryable: stop; the owner of the workflow is told (the task fails).

Rows are claimed with `SKIP LOCKED`, so any number of workers can drain the same table.
"""

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import DatabaseError, transaction
from django.db.models import OuterRef, Q, Subquery
from django.utils import timezone

from . import hooks
from . import clock
from .compiled import Compiled
from .connectors import http
from .connectors.base import Lookup, write_permit
from .connectors.test_mode import connector_for_action, is_replay_action
from .grants import grant_lapsed, grant_lapsed_now
from .jobs import drain
from .json_input import storable
from .models import Action, ActionStatus, Agent, InvalidTransition, StaleClaim, TaskState
from .retry import backoff_until
from .tasks import task_action_fail, task_stopped

logger = logging.getLogger("surety.executor")
S = ActionStatus
EXECUTOR = "system:executor"


def _due(now):
    # An unknown action keeps its status while a worker verifies it; only its lease says it is
    # taken. Without this, a second worker would claim it again at once, bump the fence and
    # turn the first verifier's outcome into a stale write, and the two could take turns so
    # until the drain ends. After the lease lapses (the verifier died) it is due again.
    free = Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now)
    # A task's action is attempted only while its task runs: a task that was dead-lettered,
    # discarded or resolved by hand must not have its effect carried out behind the
    # operator's back. (Verification, a read, may go on.)
    attemptable = Q(task__isnull=True) | Q(task__state=TaskState.RUNNING)
    return (Q(status=S.QUEUED, next_attempt_at__lte=now) & attemptable) | (
        Q(status=S.UNKNOWN, next_attempt_at__lte=now) & free
    )


def _claimable(now):
    # of=self: the join to the task must not lock its row as well. The agent's grants_version
    # comes along, so that the claim re-checks the grant without a statement of its own
    # (ledger.grants.grant_lapsed). As scalar subqueries, PostgreSQL evaluates them for the row
    # the LIMIT keeps; a join grew each claim with the queue (decision 38).
    agent = Agent.objects.filter(pk=OuterRef("agent_id")).order_by()
    return Action.objects.select_for_update(skip_locked=True, of=("self",)).filter(_due(now)).annotate(
        agent_user_id=Subquery(agent.values("user_id")),
        agent_grants_version=Subquery(agent.values("grants_version")),
    ).order_by("next_attempt_at", "id")


# Every claim asks this (compiled once: see compiled.py):
# SELECT ledger_action.* FROM ledger_action LEFT JOIN ledger_task ON ... WHERE <due> AND <free>
#  ORDER BY next_attempt_at, id LIMIT 1 FOR UPDATE OF ledger_action SKIP LOCKED
_next_due = Compiled(lambda now: _claimable(now)[:1], datetime, name="ledger.executor: the next due action")
_this_if_due = Compiled(lambda now, pk: _claimable(now).filter(pk=pk)[:1], datetime, int,
                        name="ledger.executor: this action if due")


def action_claim_next(owner, *, only=None):
    """Claim the next runnable action (a queued attempt or a verification that is due).

    A queued action whose agent's grant was revoked, or is shadow again, since it was
    recorded is cancelled instead, with the reason, and the next one is looked at: a revoke
    stops what is queued, not only what is asked after it. (A verification, a read, goes on.)
    A failure tried again (it carries its error) is claimed all the same: its effect may exist,
    so the run asks the provider first and cancels it only if the look finds none (decision 59).
    Cancelled here, a booking's slot was freed while the provider may hold it."""
    while True:
        with transaction.atomic():
            now = clock.now()
            action = _next_due.first(now) if only is None else _this_if_due.first(now, only)
            if action is None:
                return None
            if action.status == S.UNKNOWN:
                return action.claim_for_verification(owner=owner)
            if not _as_approved(action):
                continue  # sent back to a person (its params are not the approved ones)
            lapsed = "" if is_replay_action(action) else grant_lapsed(
                action, agent_user_id=action.agent_user_id, agent_grants_version=action.agent_grants_version)
            if not lapsed or action.error:
                return action.claim(owner=owner, locked=True)
            action.cancel(actor=EXECUTOR, reason=lapsed)


def _as_approved(action):
    """Whether the locked, queued `action` may be claimed: it needed no person, or its params
    are still the ones a person approved. The provider is called with the very params read
    here under the lock, so this is the last look before the call. Changed behind the
    ledger's back (a raw UPDATE, a bug), it goes back to a person instead, with both prints
    in its evidence."""
    if not action.approved_fingerprint:
        return True
    seen = action.params_fingerprint()
    if seen == action.approved_fingerprint:
        return True
    action.approval_lapse(locked=True, evidence={
        "at": timezone.now().isoformat(), "approved_fingerprint": action.approved_fingerprint,
        "params_fingerprint": seen, "params": action.params,
    })
    logger.warning("%s: params differ from the approved ones; sent back for approval", action)
    return False


def action_run_claimed(action):
    """Branch 1 or 3 for an action this worker has just claimed."""
    if action.status == S.UNKNOWN:
        return action_verify(action)
    claim = action.fence
    connector = connector_for_action(action)  # one that cannot be built sent nothing: not settled as unknown
    looked = {}  # what a look before the call saw, kept in the evidence of the call's outcome
    if action.error and connector.verifiable:
        # A failure tried again (a task's retry, a person's redrive; its error stays until it
        # settles): the effect may have come about since its outcome was last known (a person's
        # "confirmed absent" was wrong, the provider made it late, reconciliation saw it while the
        # action was in flight and so named nothing), and the provider may have forgotten the key
        # by now. Never a blind call: ask first, within this claim.
        lookup, evidence, why = _ask(action, connector)
        if lookup.found is not False:
            return _settle_looked(action, lookup, evidence, why)
        looked = {"looked_first": evidence}
    # The last look before the call, at the grant: a revoke committed since the claim is seen
    # here, one committed later waits for the call (ledger.grants.grant_lapsed_now). A replay
    # run's action answers to no agent's grant.
    lapsed = "" if is_replay_action(action) else grant_lapsed_now(action)
    # A worker that stalled between claim and call (or looked for long) must not start a call it
    # may not finish inside its lease: someone else may already have taken the action over.
    left = action.lease_left()
    effect = None
    try:
        if not lapsed and left >= settings.CONNECTOR_TIMEOUT + settings.LEASE_MARGIN_SECONDS:
            with write_permit(action):
                effect = connector.perform(action)
    except http.Rejected as exc:
        return _settle(action.mark_failed, actor=EXECUTOR, claim=claim, code=exc.code, message=str(exc), retryable=False,
                       evidence=looked and _evidence(action, looked))
    except http.NotSent as exc:
        if action.attempts < settings.MAX_ATTEMPTS:
            return _again(action, claim, reason="the request never reached the provider",
                          evidence=_evidence(action, {**exc.evidence(), **looked}), wait=exc.retry_after)
        return _out_of_attempts(action, claim, code=exc.code, message=str(exc),
                                evidence=looked and _evidence(action, looked), retry_after=exc.retry_after)
    except http.OutcomeUnknown as exc:
        # The provider may still be finishing the request we gave up on: look only after
        # it could have answered.
        return _settle(
            action.mark_unknown, actor=EXECUTOR, claim=claim, evidence=_evidence(action, {**exc.evidence(), **looked}),
            verify_at=clock.now() + timedelta(seconds=settings.CONNECTOR_TIMEOUT),
        )
    except DatabaseError:
        raise  # the database's, not the provider's: the drain hands the run back (ledger.jobs)
    except Exception as exc:
        # An answer of a shape the connector did not expect, or a bug in it: the provider may
        # have acted all the same, so the outcome is unknown and verified, as a timeout's is.
        logger.exception("%s: the call failed unexpectedly; its outcome will be verified", action)
        return _settle(
            action.mark_unknown, actor=EXECUTOR, claim=claim, evidence=_evidence(action, {**_unexpected(exc), **looked}),
            verify_at=clock.now() + timedelta(seconds=settings.CONNECTOR_TIMEOUT),
            reason=f"the call failed unexpectedly ({type(exc).__name__})",
        )
    if lapsed:
        return _lapsed_before_call(action, claim, lapsed, evidence=looked and _evidence(action, looked))
    if effect is None:
        logger.warning("%s: lease too short to call (%.1fs left); leaving it to the sweeper", action, left)
        return action
    return _settle(action.mark_succeeded, actor=EXECUTOR, claim=claim,
                   external_ref=_reference(action, effect.external_ref), result=effect.result,
                   evidence=looked and _evidence(action, looked))


def _lapsed_before_call(action, claim, lapsed, *, evidence):
    """The claimed action's grant was revoked, or is shadow again, since its claim: never sent.
    It goes back to the queue under its claim, then is cancelled with the reason, as a claim
    cancels one (action_claim_next). Two moves: the table has no `pending -> cancelled`, as a
    pending action may have been sent."""
    with transaction.atomic():
        requeued = _settle(action.requeue, actor=EXECUTOR, claim=claim, evidence=evidence,
                           reason="its grant lapsed between its claim and its call: never sent")
        return requeued and requeued.cancel(actor=EXECUTOR, reason=lapsed)


def action_verify(action):
    """Branch 3: the outcome is unknown; the provider's answer decides, never a blind retry."""
    lookup, evidence, why = _ask(action)
    if lookup.found is not False:
        return _settle_looked(action, lookup, evidence, why)
    if action.attempts >= settings.MAX_ATTEMPTS:
        # The last look at the provider is the evidence its dead-letter entry shows.
        return _out_of_attempts(action, action.fence, code="attempts_exhausted",
                                message=f"no effect after {action.attempts} attempts", evidence=evidence)
    return _again(action, action.fence, reason="verified absent at the provider", evidence=evidence)


def _ask(action, connector=None):
    """Ask the provider whether the claimed action's effect exists, through `connector` (by
    default the action's, built here: one that cannot be built cannot tell): (its `Lookup`, the
    evidence, why it could not tell if it could not)."""
    try:
        lookup = (connector or connector_for_action(action)).find_effect(action)
    except DatabaseError:
        raise
    except Exception as exc:
        # Not an answer a look-up can read (a bug, an answer of an unexpected shape): retried,
        # it would fail the same way after every lease, and never settle. A person decides.
        logger.exception("%s: the verification failed unexpectedly; a person decides", action)
        return (Lookup(found=None), _evidence(action, {"verification": _unexpected(exc), "found": None}),
                f"the look-up at the provider failed unexpectedly ({type(exc).__name__})")
    return (lookup, _evidence(action, {"verification": lookup.evidence, "found": lookup.found}),
            "the provider cannot say whether the effect happened")


def _settle_looked(action, lookup, evidence, why):
    """Settle the claimed action by a look that decided: found, `succeeded` (or a person's, over
    its limit); cannot tell, a person's, with `why`, unless only a rate limit stopped the look."""
    claim = action.fence
    if lookup.found is None:
        if lookup.retry_after is not None:
            return _look_again_later(action, lookup, evidence)
        return _settle(action.mark_needs_review, actor=EXECUTOR, claim=claim, evidence=evidence, reason=why)
    over_limit = hooks.policy().needs_person_after_verification(action)
    if over_limit:
        return _settle(action.mark_needs_review, actor=EXECUTOR, claim=claim, evidence=evidence, reason=over_limit)
    return _settle(action.mark_succeeded, actor=EXECUTOR, claim=claim,
                   external_ref=_reference(action, lookup.external_ref), result=lookup.result,
                   reason="verified at the provider", evidence=evidence)


def _look_again_later(action, lookup, evidence):
    """A look the provider rate-limited (a 429 says nothing of the effect) is no reason for a
    person: the claimed action is looked at again no sooner than the provider's wait, plus the
    usual backoff, as a rate-limited call is tried again. Bounded as those calls are: the
    MAX_ATTEMPTS-th such look in a row (spread over the provider's waits, each at most
    http.RETRY_AFTER_MAX_SECONDS) leaves it to a person, as a look that cannot tell does. The
    count rides in the evidence of each wait, so any other outcome or a person's move starts it
    afresh."""
    last = action.evidence[-1] if action.evidence else {}
    looks = (last.get("rate_limited_looks", 0) if isinstance(last, dict) else 0) + 1
    if looks >= settings.MAX_ATTEMPTS:
        return _settle(action.mark_needs_review, actor=EXECUTOR, claim=action.fence, evidence=evidence,
                       reason=f"the provider rate-limited {looks} looks in a row")
    evidence = {**evidence, "rate_limited_looks": looks, "retry_after": lookup.retry_after}
    if action.status == S.PENDING:
        # A failure tried again looked first: nothing was sent, and the claim spends no attempt
        # (its rate-limited looks have their own bound). Spent, they left the call after them
        # none of its retries: rate-limited too, it was dead-lettered, with an alert, at once.
        return _again(action, action.fence, reason="the look before the call was rate limited",
                      evidence=evidence, wait=lookup.retry_after, attempt_spent=False)
    return _settle(action.verify_later, not_before=backoff_until(looks, wait=lookup.retry_after), evidence=evidence,
                   claim=action.fence)


def _again(action, claim, *, reason, evidence, wait=None, attempt_spent=True):
    """Back to the queue for another attempt after a backoff, counted from the end of `wait`, the
    seconds a rate-limited provider asked for (the attempt still counts: MAX_ATTEMPTS of them then
    span its windows, not seconds; `attempt_spent` False: the claim made none, Action.requeue);
    or, for an action whose task has stopped, failed, retryable.
    A task's action is attempted only while its task runs: queued
    under a stopped task it would wait for ever (a task resolved by hand, discarded or ended), holding
    its order and customer; failed, it holds nothing, and the task's runner retries it if the task
    runs again (a dead-lettered one redriven; one that ended or was resolved by hand never does:
    failed for good)."""
    with transaction.atomic():
        stopped = task_stopped(action)
        if stopped:
            return _failed_under_stopped_task(action, claim, stopped, message=reason, evidence=evidence)
        return _settle(action.requeue, actor=EXECUTOR, claim=claim, reason=reason, attempt_spent=attempt_spent,
                       not_before=backoff_until(action.attempts, wait=wait), evidence=evidence)


def _out_of_attempts(action, claim, *, code, message, evidence, retry_after=None):
    """Failed, retryable, its attempts spent: its task's runner or a person may try again. Under a
    task that has stopped, as `_again` says."""
    with transaction.atomic():
        stopped = task_stopped(action)
        if stopped:
            return _failed_under_stopped_task(action, claim, stopped, message=message, evidence=evidence)
        return _settle(action.mark_failed, actor=EXECUTOR, claim=claim, code=code, message=message, retryable=True,
                       evidence=evidence, retry_after=retry_after)


def _failed_under_stopped_task(action, claim, stopped, *, message, evidence):
    """Failed, retryable or for good as its stopped task allows (ledger.tasks.task_action_fail)."""
    return task_action_fail(action, stopped, lambda retryable: _settle(
        action.mark_failed, actor=EXECUTOR, claim=claim, code="task_not_running", retryable=retryable,
        evidence=evidence, message=f"{message}; its task is {stopped.state}: nothing attempts it unless the task runs "
        "again"), actor=EXECUTOR)


def action_expire_leases(now=None):
    """Pending actions whose claim lapsed become `unknown`, to be verified.

    Only once the lease's end plus CONNECTOR_TIMEOUT has passed: by then no call made under
    the old claim can still be in flight, so what verification sees is final.
    """
    cutoff = (now or clock.now()) - timedelta(seconds=settings.CONNECTOR_TIMEOUT)
    expired = 0
    while True:
        with transaction.atomic():
            action = (
                Action.objects.select_for_update(skip_locked=True)
                .filter(status=S.PENDING, lease_expires_at__lt=cutoff)
                .first()
            )
            if action is None:
                return expired
            action.mark_unknown(
                actor="system:sweeper", claim=action.fence, verify_at=clock.now(),
                evidence={"at": timezone.now().isoformat(), "lease_expired": action.lease_expires_at.isoformat(),
                          "owner": action.lease_owner, "attempt": action.attempts},
                reason="the worker's lease expired while the call may have been in flight",
            )
            expired += 1


def drain_actions():
    """The RQ job a doorbell rings for (see jobs.py): run actions until none is ready."""
    return drain("actions", action_claim_next, action_run_claimed)


def action_runnable_exists():
    return Action.objects.filter(_due(clock.now())).exists()


def _settle(transition, **kwargs):
    # What the provider answered (the result, the reference, its messages in the evidence) is
    # made storable first: an answer PostgreSQL refuses (a NUL) would fail the settle after the
    # effect, and every verification after it the same way, and the action would never settle.
    kwargs = {name: storable(value) for name, value in kwargs.items()}
    try:
        return transition(**kwargs)
    except StaleClaim:
        # Someone took the action over while this worker was away; their outcome stands.
        logger.warning("late write refused: %s", kwargs)
        return None
    except InvalidTransition:
        # The row moved while its fence stood (a move without a claim now takes a new fence, so
        # this is StaleClaim's case in practice). Their outcome stands too; the drain must go on.
        logger.warning("late write refused, the action was settled meanwhile: %s", kwargs)
        return None


def _reference(action, external_ref):
    """The provider's reference for the effect, at most the column's size (a reference is far
    shorter); where it named none (an empty id), the operation key, as a webhook's settle takes it:
    a succeeded action has one (the database holds it), and the settle failed after the effect."""
    return str(external_ref or "")[:255] or action.operation_key


def _evidence(action, details):
    return {"at": timezone.now().isoformat(), "attempt": action.attempts, **details}


def _unexpected(exc):
    """An error that is no provider's answer, as evidence (the shape of a ProviderError's)."""
    return {"error": type(exc).__name__, "message": str(exc)}
