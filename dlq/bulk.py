"""Safe bulk redrive from the dead-letter queue.

1. Dry run (`bulk_plan`): the open entries the queue's filters select, oldest first (at most
   RUN_MAX), each with what it would do — a task resumes at a step, an action is retried under
   the retry rule or on the person's word — or why it is skipped. Kept as a `planned` run;
   nothing else changes.
2. Start (`bulk_start`): the selection is taken again. If it differs from the dry run's
   (entries appeared, disappeared, or would now do something else) the run is refused with
   the difference. It is refused too while another run calling any of the same connectors is
   running or stopping (`RunInTheWay`): each run keeps to the limit only within itself, and two
   at once would add up. Otherwise it runs, at a rate the person sets and never above the
   strictest redrive rate of the connectors it calls (`redrive_ceiling`).
3. The job (`bulk_redrive_work`, on an RQ worker) redrives the entries one by one at that
   pace, each through `deadletter_redrive` (one audited redrive, as on the entry's page).
   Before each one it looks at what became of those it redrove; when REDRIVE_SPIKE_FAILURES
   of the last REDRIVE_SPIKE_WINDOW failed again at the provider, it stops and leaves the rest
   open, saying why. A person may stop it too. It works for SLICE_SECONDS at a time and then
   hands the run to a new job, so drain jobs get the worker in between. The job working a run
   holds its lease (ledger.locks, named `bulk_redrive:<id>`), renewed as it goes on.
4. The sweeper starts a new job for a run whose job was lost, its lease lapsed (`bulk_redrives_resume`);
   without workers (the embedded default) it works the run itself, INLINE_SLICE_SECONDS per
   pass, so its other steps (expiry, lease recovery, alerts) are not held up for a whole slice.
"""

import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.db.models import Max, Q

from ledger import clock
from ledger.access import WORK_DLQ, decidable_names, user_may
from ledger.jobs import enqueue
from ledger.locks import BULK_REDRIVE_START, lead, let_go, take_turns
from ledger.models import Action, ActionStatus, AuditEvent, Capability, StepStatus, TaskState
from ledger.statemachine import InvalidTransition

from .entries import deadletter_redrive
from .models import DeadLetter, EntryStatus
from .redrive_runs import ACTIVE_STATUSES, BulkRedrive, BulkRedriveItem, Outcome, Plan, RunStatus

RUN_MAX = 500
SLICE_SECONDS = 15
INLINE_SLICE_SECONDS = 1
# A lost job's run waits this long for its lease to lapse before the sweeper starts another.
LEASE_SECONDS = SLICE_SECONDS + 30
POLL_SECONDS = 0.25
SYSTEM = "system:bulk-redrive"
JOB = "dlq.bulk.bulk_redrive_work"

# After a redrive, what says the provider failed the redriven work again: the executor's
# failure, an outcome it could not prove, or a call that never got through (requeued from
# `pending`; requeued from `unknown` is a verification finding nothing, not an error).
ACTION_FAILED_AGAIN = Q(verb__in=("failed", "outcome_unknown")) | Q(verb__in=("requeued", "needs_review"),
                                                                      before__status="pending")
# A task's run failing again, whichever step it was (a look-up at the provider, or its effect).
TASK_FAILED_AGAIN = Q(verb__in=("retry_scheduled", "failed", "dead_lettered"))


class RunInTheWay(Exception):
    """Another run calling some of the same connectors is running or stopping: the two together
    would redrive at up to twice those connectors' limit, so this one is not started."""

    def __init__(self, run, connectors):
        self.run, self.connectors = run, sorted(connectors)
        called = ", ".join(self.connectors)
        super().__init__(f"{run} is {run.status} and calls the same connector{'s' if len(connectors) > 1 else ''} "
                         f"({called}): stop it or wait until it ends")


class SelectionChanged(Exception):
    """The filters select other entries than the dry run listed: nothing is started."""

    def __init__(self, difference):
        super().__init__("the selection changed since the dry run")
        self.difference = difference


@dataclass(frozen=True)
class Difference:
    appeared: list  # entries selected now, not in the dry run
    disappeared: list  # (entry, its dry-run item): listed then, not selected now
    changed: list  # (entry, its dry-run item, the plan now, its detail)

    def __bool__(self):
        return bool(self.appeared or self.disappeared or self.changed)


def _workable(user):
    return {(kind, name) for kind in (Capability.Kind.WORKFLOW, Capability.Kind.ACTION_TYPE)
            for name in decidable_names(user, WORK_DLQ, kind)}


def may_redrive_any(user):
    return bool(_workable(user))


def entry_plan(entry, workable):
    """(plan, detail): what redriving this open entry would do now, for a person who may work `workable`."""
    kind, name = entry.capability
    if (kind, name) not in workable:
        return Plan.SKIP, f"not yours to work: you may not work {name} dead letters"
    if entry.redrive_refusal:
        return Plan.SKIP, entry.redrive_refusal
    if entry.task_id:
        if entry.task.state != TaskState.DEAD_LETTERED:
            return Plan.SKIP, f"the task is {entry.task.state} now"
        steps = sorted(entry.task.steps.all(), key=lambda step: step.position)
        step = next((s for s in steps if s.status != StepStatus.DONE), None)
        where = f"resumes at step {step.position + 1}, {step.name}" if step else "every step is done: it finishes"
        return Plan.TASK_RESUME, f"{where} (fresh budget of {entry.task.max_attempts} attempts)"
    action = entry.action
    if action.status != ActionStatus.FAILED:
        return Plan.SKIP, f"the action is {action.status} now, not failed"
    if action.is_retryable_failure:
        return Plan.ACTION_RETRY, "one more attempt under its operation key (held instead while another action " \
                                  "on its target or customer is in flight)"
    code = action.error.get("code", "error")
    return Plan.ACTION_RETRY_BY_PERSON, f"its failure ({code}) was marked permanent: retried on your word and reason"


def _selected(filters):
    entries = DeadLetter.objects.matching({**filters, "status": EntryStatus.OPEN})
    return list(entries.prefetch_related("task__steps").order_by("id")[:RUN_MAX])


def _action_type(entry):
    return entry.action.action_type if entry.action_id else None  # None: a task's entry


def connectors_called(action_types):
    """The connectors (named by action type) that redriving entries of these action types calls,
    a task's entry being None: a task's workflow chooses its effects as it runs, so it may call any."""
    every = set(settings.CONNECTOR_REDRIVE_RATES)
    return set().union(*(every if action_type is None else {action_type} for action_type in action_types))


def redrive_ceiling(entries):
    """Entries per minute: the strictest CONNECTOR_<TYPE>_REDRIVE_RATE of the connectors these
    entries call (of all, for no entries)."""
    rates = settings.CONNECTOR_REDRIVE_RATES
    called = connectors_called(map(_action_type, entries))
    strictest = min(rates.get(action_type, min(rates.values())) for action_type in called or rates)
    return Decimal(str(strictest)).quantize(Decimal("0.01"))


def bulk_plan(filters, *, user):
    """The dry run: a `planned` run listing every selected entry and what it would do."""
    filters = {key: filters.get(key, "") for key in ("workflow", "code")}
    workable = _workable(user)
    entries = _selected(filters)
    plans = [entry_plan(entry, workable) for entry in entries]
    with transaction.atomic():
        run = BulkRedrive.objects.create(
            filters=filters, planned_by=user.get_username(),
            ceiling=redrive_ceiling([e for e, (plan, _) in zip(entries, plans) if plan != Plan.SKIP]),
        )
        BulkRedriveItem.objects.bulk_create(
            BulkRedriveItem(run=run, entry=entry, position=n, plan=plan, plan_detail=detail[:500])
            for n, (entry, (plan, detail)) in enumerate(zip(entries, plans), start=1)
        )
    return run


def selection_difference(run, *, user):
    """What differs between the run's dry run and the same filters now."""
    workable = _workable(user)
    now = {entry.pk: (entry, *entry_plan(entry, workable)) for entry in _selected(run.filters)}
    then = {item.entry_id: item for item in run.items.select_related("entry", "entry__task", "entry__action")}
    return Difference(
        appeared=[now[pk][0] for pk in now if pk not in then],
        disappeared=[(item.entry, item) for pk, item in then.items() if pk not in now],
        changed=[(now[pk][0], then[pk], now[pk][1], now[pk][2]) for pk in now
                 if pk in then and now[pk][1] != then[pk].plan],
    )


STALE = "this dry run is stale (over an hour old): do a new dry run to see the entries as they are now"


def bulk_start(run, *, user, reason, rate):
    """Run the dry run as it was listed, or refuse (SelectionChanged) with the difference."""
    reason = reason.strip()
    if not reason:
        raise ValueError("a reason is required to redrive")
    with transaction.atomic():
        run = BulkRedrive.objects.select_for_update().get(pk=run.pk)
        if run.status != RunStatus.PLANNED:
            raise InvalidTransition(f"{run} was already started by {run.started_by}")
        if run.stale:
            raise InvalidTransition(STALE)
        difference = selection_difference(run, user=user)
        if difference:
            raise SelectionChanged(difference)
        redrivable = [item.entry for item in run.items.exclude(plan=Plan.SKIP).select_related("entry__action")]
        if not redrivable:
            raise InvalidTransition("nothing in this dry run can be redriven")
        _refuse_if_run_in_the_way(redrivable)
        # The connectors' limits as they are now: a setting lowered since the dry run holds.
        ceiling = redrive_ceiling(redrivable)
        if rate > ceiling:
            raise ValueError(f"at most {ceiling} entries per minute now: the redrive limit of the connectors "
                             "these entries call")
        run.start(actor=user, reason=reason, rate=rate, ceiling=ceiling, locked=True)
        for item in run.items.filter(plan=Plan.SKIP):
            item.settle(Outcome.SKIPPED, item.plan_detail)
        _hand_over(run)
    return run


def _refuse_if_run_in_the_way(entries):
    """Raise RunInTheWay for a running or stopping run that calls any connector these entries
    call: each run keeps to the limit only within itself (`_next_slot`).

    Two starts at once would each find the other not started yet (neither has committed), so
    starts take turns first (ledger.locks.BULK_REDRIVE_START).
    The active runs are locked: one whose job is ending it meanwhile is seen ended, not in the way."""
    take_turns(BULK_REDRIVE_START)
    active = {run.pk: run for run in BulkRedrive.objects.select_for_update().filter(status__in=ACTIVE_STATUSES)
              .order_by("pk")}
    if not active:
        return
    theirs = defaultdict(set)
    items = BulkRedriveItem.objects.filter(run__in=list(active)).exclude(plan=Plan.SKIP).order_by()
    for run_id, action_type in items.values_list("run", "entry__action__action_type").distinct():
        theirs[run_id].add(action_type)
    ours = connectors_called(map(_action_type, entries))
    for run_id, run in active.items():
        shared = ours & connectors_called(theirs[run_id])
        if shared:
            raise RunInTheWay(run, shared)


def bulk_stop(run, *, user, reason):
    """A person stops a running redrive: its job stops before its next entry."""
    if not reason.strip():
        raise ValueError("a reason is required to stop a redrive")
    with transaction.atomic():
        run = BulkRedrive.objects.select_for_update().get(pk=run.pk)
        if run.status != RunStatus.RUNNING:
            raise InvalidTransition(f"{run} is {run.status}, not running")
        return run.ask_to_stop(actor=user, reason=reason.strip(), locked=True)


def lease(run):
    """The name of the run's lease (ledger.locks): held by the job working it."""
    return f"bulk_redrive:{run.pk}"


def _hand_over(run, token=None):
    """The run's next job, after commit, handed the lease by the job `token` (None: the run's
    start); the lease waits for that job alone (a spare the sweeper starts meanwhile finds it
    taken), until it lapses. A job whose lease was taken meanwhile hands nothing over. Without
    workers (the embedded default) a job would run inside the request that started it, for a
    whole slice: the lease is let go instead, and the sweeper's next pass takes it and works
    the run in its own process."""
    if not settings.RQ_ASYNC:
        let_go(lease(run), holder=token)
        return
    successor = uuid.uuid4().hex
    if lead(lease(run), successor, LEASE_SECONDS, handed_by=token):
        transaction.on_commit(lambda: enqueue(JOB, run.pk, successor), robust=True)


def bulk_redrive_work(run_id, token="", seconds=SLICE_SECONDS):
    """The RQ job: one slice of a run, `seconds` long (see the module's docstring, steps 3-4),
    while `token` holds the run's lease."""
    run = BulkRedrive.objects.filter(pk=run_id, status__in=ACTIVE_STATUSES).first()
    if run is None:
        return
    slice_ends = time.monotonic() + seconds
    while time.monotonic() < slice_ends:
        if not lead(lease(run), token, LEASE_SECONDS):
            return  # another job's (this one stalled past its lease, or is a stray)
        run.refresh_from_db()
        if run.status == RunStatus.STOPPING:
            return _end(run)
        _observe(run)
        spike = _spike(run)
        if spike:
            return _end(run, stop_reason=spike)
        item = run.items.filter(outcome=Outcome.PLANNED).select_related("entry").order_by("position").first()
        if item is None:
            return _end(run)
        slot = _next_slot(run)
        if (slot - clock.now()).total_seconds() > POLL_SECONDS:
            time.sleep(POLL_SECONDS)  # short naps: a stop or a spike is seen at once
            continue
        _redrive_one(run, item, slot=slot, token=token)
    with transaction.atomic():
        _hand_over(run, token)


def _next_slot(run):
    """The last redrive of the run plus the spacing of its rate: kept across slices and
    lost jobs, and a run held up (a busy worker) never makes up for it with a burst. On the
    database's clock, as each redrive's time is written: the job that takes a run over may run on
    a host whose clock is ahead, on which the slot had passed (ledger.clock)."""
    last = run.items.aggregate(last=Max("redriven_at"))["last"]
    return last + timedelta(seconds=run.seconds_apart) if last else clock.now()


def _redrive_one(run, item, *, slot, token):
    """Redrive the item's entry at `slot` (to the slot itself, not the next look round after it).

    The loop's look at the run came before the wait for the slot. A person's stop
    (`bulk_stop`) and another job's takeover both change the run's row under its lock, so the
    entry is redriven with that row locked and only while the run is still running under this
    job's lease: neither lets one more entry through after it."""
    entry, user = item.entry, run.started_by
    allowed = user_may(user, WORK_DLQ, *entry.capability)  # before the wait: a redrive keeps to its slot
    if allowed:
        time.sleep(max((slot - clock.now()).total_seconds(), 0))
    with transaction.atomic():
        if not _still_ours(run, token):
            return  # the loop's next look ends the run, or leaves it to the job that took it
        if not allowed:
            item.settle(Outcome.FAILED, f"{user.get_username()} may no longer work {entry.capability[1]} dead letters",
                        actor=SYSTEM)
            return
        try:
            with transaction.atomic():
                redriven_at = clock.now()
                entry = deadletter_redrive(entry, actor=user, reason=run.note)
                now = Action.objects.filter(pk=entry.action_id).values_list("status", flat=True).first()
                detail = {ActionStatus.HELD: "held for a person: another action on its target or customer is in "
                                             "flight",
                          ActionStatus.AWAITING_APPROVAL: "waits for an approver: failed for good, it is over its "
                                                          "limit now"}.get(now, item.plan_detail)
                item.settle(Outcome.REDRIVEN, detail, redriven_at=redriven_at)
        except (InvalidTransition, ValueError) as exc:
            entry.refresh_from_db()
            if entry.status != EntryStatus.OPEN:
                item.settle(Outcome.SKIPPED, f"already {entry.status} by {entry.decided_by or 'the system'}",
                            actor=SYSTEM)
            else:
                item.settle(Outcome.FAILED, str(exc), actor=SYSTEM)


def _still_ours(run, token):
    """Lock the run's row and its lease for the caller's transaction: is it still running, under
    `token`'s lease? (Renewed so, a takeover waits for this transaction and then finds it held.)"""
    running = BulkRedrive.objects.select_for_update().filter(pk=run.pk, status=RunStatus.RUNNING).exists()
    return running and lead(lease(run), token, LEASE_SECONDS)


def _observe(run):
    """Note, on each entry redriven in the spike window, whether its work failed again at the provider."""
    watched = run.items.filter(outcome=Outcome.REDRIVEN).select_related("entry").order_by("-redriven_at")
    for item in watched[:settings.REDRIVE_SPIKE_WINDOW]:
        if item.failed_again:
            continue
        event = _failure_since(item.entry)
        if event is not None:
            item.note_failed_again(_describe(event), event.occurred_at)


def _failure_since(entry):
    """The first event that says the entry's work failed again after its redrive. After it in the
    audit trail's own order (its events' ids, taken as they are written), not by their times: the
    worker that failed it stamps its events by its host's clock (decision 57), and one a few
    seconds behind the bulk job's host wrote failures that seemed older than the redrive."""
    redriven = AuditEvent.objects.filter(object_type=DeadLetter._meta.label_lower, object_id=str(entry.pk),
                                         verb="redriven").values_list("id", flat=True).first()
    if redriven is None:
        return None
    if entry.action_id:
        events = AuditEvent.objects.filter(ACTION_FAILED_AGAIN, object_type="ledger.action",
                                           object_id=str(entry.action_id))
    else:
        actions = [str(pk) for pk in Action.objects.filter(task_id=entry.task_id).values_list("pk", flat=True)]
        events = AuditEvent.objects.filter(
            (Q(object_type="ledger.action", object_id__in=actions) & ACTION_FAILED_AGAIN)
            | (Q(object_type="ledger.task", object_id=str(entry.task_id)) & TASK_FAILED_AGAIN))
    return events.filter(id__gt=redriven).order_by("id").first()


def _describe(event):
    error = (event.after or {}).get("error") or (event.after or {}).get("last_error") or {}
    said = f"{error.get('code', '')}: {error.get('message', '')}" if error else event.reason
    return f"{event.verb} ({event.object_label}){': ' + said if said else ''}"


def _spike(run):
    """Why the run must stop ("" if not): too many of its latest redrives failed again."""
    window, limit = settings.REDRIVE_SPIKE_WINDOW, settings.REDRIVE_SPIKE_FAILURES
    latest = list(run.items.filter(outcome=Outcome.REDRIVEN).order_by("-redriven_at")[:window])
    failed = [item for item in latest if item.failed_again]
    if len(failed) < limit:
        return ""
    return (f"provider error spike: {len(failed)} of the last {len(latest)} redriven entries failed again at the "
            f"provider (first: {failed[-1].failed_again})")


def _end(run, *, stop_reason=""):
    with transaction.atomic():
        run = BulkRedrive.objects.select_for_update().get(pk=run.pk)
        if run.status not in ACTIVE_STATUSES:
            return run
        if stop_reason or run.status == RunStatus.STOPPING:
            run.stop(actor=SYSTEM, stop_reason=stop_reason, locked=True)
        else:
            run.finish(actor=SYSTEM, locked=True)
        for item in run.items.filter(outcome=Outcome.PLANNED):
            item.settle(Outcome.LEFT_OPEN, f"left open: the run stopped ({run.stop_reason})")
        let_go(lease(run))
    return run


def bulk_redrives_resume():
    """The sweeper's pass: a running run whose job was lost (its lease lapsed; without workers,
    its slice is over) gets a new one, which takes the lease here."""
    resumed = 0
    for run in BulkRedrive.objects.filter(status__in=ACTIVE_STATUSES).order_by("pk"):
        token = uuid.uuid4().hex
        if not lead(lease(run), token, LEASE_SECONDS):
            continue  # its job holds it
        if settings.RQ_ASYNC:
            enqueue(JOB, run.pk, token)
        else:
            bulk_redrive_work(run.pk, token, seconds=INLINE_SLICE_SECONDS)
        resumed += 1
    return resumed
