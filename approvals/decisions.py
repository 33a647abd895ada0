"""What a person decides on a review item. One decision wins; the loser is told who won.

Every decision is taken on the params the person saw (their fingerprint, carried by the
page): changed since, it is refused; an approval or release is bound to them. A release is
bound too to what the person saw in flight on the action's target or customer (its print,
`in_flight_print`): released meanwhile, or retried, another action there refuses it.

Locks are taken action first, then item — the same order as an action's own moves (which
close items), so a decision racing a webhook never deadlocks; a release takes its action's
subjects' locks before both, as the intake takes them before its rows; a failure marked on a
task's action takes its task's lock before both, as a redrive, a discard or a resolve of the
task's dead letter and the executor take a task's before its actions'.
"""

import functools
import hashlib
import json
import operator
from contextlib import contextmanager

from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef, Q

from ledger import clock, hooks
from ledger.access import decidable_names
from ledger.actions import action_lock_subjects, action_release, in_flight_near
from ledger.models import Action, ActionStatus, ActionType, Agent, AuditEvent, Task
from ledger.statemachine import InvalidTransition
from ledger.tasks import task_action_fail, task_stopped
from ledger.versions import VersionRefused, action_version_create, version_params

from .access import PERM_FOR_KIND, acting_for, standing_in_for
from .dbrules import FOUR_EYES_RULE, WINDOW_CLOSED_RULE
from .intake import verdict_for_action
from .models import Approval, ReviewItem, ReviewKind, ReviewStatus


class DecisionRefused(Exception):
    """The decision cannot be taken (already decided, four eyes, a missing reason)."""


class AlreadyDecided(DecisionRefused):
    pass


DECISIONS = {
    ReviewKind.APPROVAL: {"approve", "reject"},
    ReviewKind.HELD: {"release", "reject"},
    ReviewKind.UNKNOWN_OUTCOME: {"mark_succeeded", "mark_failed", "verify"},
}

REASON_REQUIRED = {"approve", "reject", "release", "mark_failed"}


# Decisions that let the action go on: bound to the params the person saw.
BINDING = {"approve", "release"}
PARAMS_CHANGED = "the parameters changed since you opened this page: look at them again"
GROUP_CHANGED = "the held group changed since you opened this page: look at it again"
IN_FLIGHT_CHANGED = ("what is in flight on its order or customer changed since you opened this page: "
                     "look at it again")


def in_flight_print(near):
    """The print of what is in flight near an action (`near`: ledger.actions.in_flight_near):
    which actions, and which of them are held. The held item's page carries it, and a release is
    taken only while it is still the same, as it is taken only on the params the page showed: two
    people releasing two of one group from two pages, or a release and a retry of what held it,
    would otherwise both run. Whether held, not the status: a queued action claimed, or one whose
    call timed out, is the same in flight, and must not send the person back to the page."""
    seen = [[other.pk, other.status == ActionStatus.HELD] for other in near]
    return hashlib.sha256(json.dumps(seen, separators=(",", ":")).encode()).hexdigest()


def review_decide(item, *, user, decision, reason="", external_ref="", fingerprint="", in_flight=""):
    """Take `decision` on `item` as `user`; returns the item as it stands afterwards.

    `fingerprint`: of the action's params as the person saw them (the page carries it). A
    decision whose print is not the params' print now is refused; an approval or release
    is bound to it, so the executor runs the action only with those params. Without one (a
    caller with no page), the params as they are under the lock are what is decided.

    `in_flight`: for a release, the print of what was in flight near the action as the person
    saw it (`in_flight_print`); refused unless it is the print now, read under the subjects'
    locks (those the intake and a retry take), so two releases near each other take turns.
    Without one, what is in flight under the locks is what is decided on."""
    reason = reason.strip()
    if decision not in DECISIONS[item.kind]:
        raise DecisionRefused(f"{decision} is not a decision for a {item.get_kind_display()}")
    # Every decision that changes what happens to money gives its reason; verifying again changes
    # nothing, and marking succeeded is backed by the provider's reference.
    if decision in REASON_REQUIRED and not reason:
        raise DecisionRefused(f"a reason is required to {decision.replace('_', ' ')}")
    if decision == "mark_succeeded" and not external_ref.strip():
        raise DecisionRefused("the provider's reference is required to mark it succeeded")
    with _decision(item):
        if decision == "release":  # before any row, in the intake's order: no deadlock with it
            action_lock_subjects(item.action)  # its target and customer never change
        elif decision == "mark_failed":  # tasks, then actions: a redrive's order (no deadlock with it)
            _lock_its_task(item)
        action, item, fingerprint, behalf = _open_for(item, user, fingerprint)
        if decision == "release" and in_flight and in_flight != in_flight_print(in_flight_near(action)):
            raise DecisionRefused(IN_FLIGHT_CHANGED)
        # Read under the lock: a verification that lands meanwhile must still refuse this.
        if decision == "mark_failed" and any(e.get("found") is True for e in action.evidence or []):
            raise DecisionRefused("the provider reported the effect; mark it succeeded with its reference instead")
        if decision == "approve":
            _approvals_for_params_now(item, action)
        elif item.kind == ReviewKind.APPROVAL and given_by_the_same_eyes(list(item.approvals.all()), user, behalf):
            # An approval is refused by its own count below; a rejection by the same eyes would end
            # the item one of them approved, where the second decision is someone else's.
            raise DecisionRefused("four eyes: you, or whom you stand in for, gave its first approval: its second "
                                  "decision, either way, is someone else's")
        if decision == "approve" and item.approvals_needed > 1 and not _approval_recorded(
                item, action, user, behalf, reason, fingerprint):
            return item
        _decide(item, action, user, behalf, decision, reason, external_ref.strip(), fingerprint)
    return item


@contextmanager
def _decision(item):
    """A decision's transaction. The rules the database holds on a decision (approvals.dbrules:
    four eyes, an approval's window) refuse it as the checks in Python do, when a race of a moment
    let it past them (this process's reading of the database's clock a moment behind); any other
    integrity error is a fault, and raised as one."""
    try:
        with transaction.atomic():
            yield
    except IntegrityError as exc:
        said = str(exc).splitlines()[0]
        if WINDOW_CLOSED_RULE in said:
            raise AlreadyDecided(window_closed(item)) from exc
        if said.startswith(FOUR_EYES_RULE):
            raise DecisionRefused(said) from exc
        raise


def window_closed(item):
    return f"its approval window closed at {item.expires_at:%Y-%m-%d %H:%M} UTC: it expires undecided"


def past_its_window(item):
    """`item`'s approval window has closed, by the database's clock (decision 57), as its sweeper
    and the database's rule read it: nobody decides it, so its page offers no decision and it
    waits for nobody, from then until the sweeper's next pass expires it. `within_its_window` is
    the same rule as a condition on items (what waits for a person is counted in a query)."""
    return item.expires_at is not None and item.expires_at <= clock.now()


def within_its_window():
    """The items not `past_its_window`: with no window, or one still open by the database's clock."""
    return Q(expires_at__isnull=True) | Q(expires_at__gt=clock.now())


def _open_for(item, user, fingerprint):
    """The item's action and the item, locked in that order, still open, and `user` with the
    authority to decide it (the pages check it first; a caller without a page is held to it
    here) and not the agent's owner; the print the decision is bound to: the one the person
    saw, refused unless it is the params' print now (read under the action's lock); and the
    person `user` decides for, when a delegation gives them the authority
    (approvals.access.acting_for)."""
    action = Action.objects.select_for_update().select_related("agent").get(pk=item.action_id)
    item = ReviewItem.objects.select_for_update().get(pk=item.pk)
    if item.status != ReviewStatus.OPEN:
        raise AlreadyDecided(f"already {item.status} by {item.decided_by_label or 'the system'}")
    if past_its_window(item):
        # The sweeper's next pass expires it; until then nobody decides it either (the database
        # refuses an approval after its window as well: approvals.dbrules).
        raise AlreadyDecided(window_closed(item))
    if action.agent.answers_for(user):
        raise DecisionRefused("four eyes: you are responsible for the agent that requested this, or were shown "
                              "its token")
    behalf = acting_for(user, item)  # PermissionDenied without the authority, theirs or a delegator's
    if action.agent.answers_for(behalf):
        raise DecisionRefused(f"four eyes: {behalf.get_username()}, whose delegate you are, is responsible "
                              "for the agent that requested this, or holds its token")
    now = action.params_fingerprint()
    if fingerprint and fingerprint != now:
        raise DecisionRefused(PARAMS_CHANGED)
    return action, item, now, behalf


def _lock_its_task(item):
    """Lock the task of `item`'s action, if it has one (an action's task never changes), before the
    action: `task_stopped` reads it under its lock after the action's, and a redrive or a give-up
    of its dead letter that took it first, then waited for the action, deadlocked with the
    decision. FOR UPDATE, as a redrive takes it: no lock is made stronger halfway through."""
    Task.objects.select_for_update().filter(pk__in=Action.objects.filter(pk=item.action_id).values("task_id")).exists()


def _approvals_for_params_now(item, action):
    """An item counts the approvals its action's params ask for when they are no longer the ones
    recorded (changed behind the ledger's back: a raw UPDATE, a bug): opened for 750.00 and
    approved on 7500.00, one person would otherwise let go alone what needs two. The verdict is
    the executor's on params changed after an approval (intake.verdict_for_action). Only ever
    raised, and only for such params: a limit changed since applies to new actions."""
    if action.params_fingerprint() == action.fingerprint:
        return
    verdict = verdict_for_action(action)
    if verdict.approvals_needed <= item.approvals_needed:
        return
    before = item.approvals_needed
    item.approvals_needed = verdict.approvals_needed
    item.save(update_fields=["approvals_needed"])
    AuditEvent.objects.record(actor="system:approvals", verb="approvals_needed_raised", obj=item,
                              reason=f"its params are not the ones recorded: {verdict.reason}",
                              before={"approvals_needed": before}, after={"approvals_needed": item.approvals_needed})


def _approval_recorded(item, action, user, behalf, reason, fingerprint):
    """Record this approval on `item`; True if with it the item has the approvals that count it
    needs: of two, the second, by someone else, of the same params (a version's editor's approval
    on the item its hold closed is recorded here too, `review_edit`). A delegate's approval is its
    person's too: one of two from each of them is all it can be. An earlier approval counts only
    while its person does not answer for the agent (`approvals_counted`).

    An open item it leaves short of them is kept waiting for a new reason, someone else's approval:
    a move to the status it has (ledger.hooks), here, whoever the caller (a page, a decision link,
    an edit down, the demo), so that what the apps above do of it (dlq mails those it waits for now)
    follows every first of two. A closed one waits for nobody until its release reopens it, a move
    of its own (approvals.reviews)."""
    earlier = list(item.approvals.select_related("user", "on_behalf_of"))
    if given_by_the_same_eyes(earlier, user, behalf):
        raise DecisionRefused("four eyes: the second approval must come from someone else"
                              + (f" than you and {behalf.get_username()}" if behalf else ""))
    if any(a.fingerprint and a.fingerprint != fingerprint for a in earlier):
        raise DecisionRefused("the parameters changed after the first approval, which was for others: "
                              "reject it, or edit it into a new version")
    # A rule of the database's that refuses it (four eyes, the window) is told as the rule says by
    # the decision's transaction (`_decision`). A second tab's approval of the same person never
    # gets here: it waits for the item's lock and finds the first in `earlier`.
    Approval.objects.create(item=item, user=user, on_behalf_of=behalf, reason=reason, fingerprint=fingerprint)
    counted, not_counted = approvals_counted(earlier, action.agent)
    AuditEvent.objects.record(actor=user, verb="approval_recorded", obj=item, reason=reason,
                              after={"approvals": len(counted) + 1, "needed": item.approvals_needed,
                                     "fingerprint": fingerprint,
                                     **({"on_behalf_of": behalf.get_username()} if behalf else {}),
                                     **({"not_counted": not_counted} if not_counted else {})})
    enough = len(counted) + 1 >= item.approvals_needed
    if not enough and item.status == ReviewStatus.OPEN:
        hooks.moved(item, item.status, user, reason)
    return enough


def given_by_the_same_eyes(approvals, user, behalf):
    """The approval among `approvals` that four eyes take for `user`'s own, or None: given by them
    or for them, or by or for `behalf`, the person they decide for (a person and their delegate
    give one approval between them). The decision refuses a second one; the page says so first."""
    eyes = {user.pk, behalf and behalf.pk} - {None}
    return next((a for a in approvals if eyes & {a.user_id, a.on_behalf_of_id}), None)


def by_the_same_eyes(*people):
    """`given_by_the_same_eyes` as a condition on approvals (the queues count with it): given by
    one of `people`, or for one of them by their delegate."""
    return Q(user__in=people) | Q(on_behalf_of__in=people)


def waiting_for(user):
    """The review items `user` may decide, as a condition on items ("waiting for me", the next
    item and a queue row's Reject; the caller keeps the open ones): those whose page offers them a
    decision (`approvals.access.may_decide`), whose approval window is still open
    (`past_its_window`) and on which four eyes take no approval for theirs yet
    (`given_by_the_same_eyes`). An action type they may decide on their own authority, with their own
    eyes alone; one they may decide only for a person whose delegate they are, where neither of them
    answers for the agent that asked nor gave an approval of it (decision 50). The type's and the
    agent's conditions are left out where they exclude nothing, so that the open items are joined
    to their actions only where it matters (decision 38)."""
    answered = _answered_for(user)
    waiting = []
    for perm in dict.fromkeys(PERM_FOR_KIND.values()):
        kinds = [kind for kind, needed in PERM_FOR_KIND.items() if needed == perm]
        own = decidable_names(user, perm)
        if own:
            waiting.append(_of_types(kinds, own) & _clear_of([user], answered))
        for person, theirs in standing_in_for(user, perm):
            if theirs - own:
                waiting.append(_of_types(kinds, theirs - own)
                               & _clear_of([user, person], answered | _answered_for(person)))
    return within_its_window() & functools.reduce(operator.or_, waiting) if waiting else Q(pk__in=[])


def _answered_for(person):
    """The agents `person` owns or was shown the token of: four eyes keep them from their requests."""
    return set(Agent.objects.filter(Agent.answering_for(person)).values_list("pk", flat=True))


def _of_types(kinds, names):
    """Items of `kinds` whose action is of a type among `names`."""
    return Q(kind__in=kinds) if names >= set(ActionType.values) else Q(kind__in=kinds, action__action_type__in=names)


def _clear_of(people, agents):
    """Items four eyes let `people` decide together: not asked for by one of `agents` (those they
    answer for), and with no approval given by or for one of them."""
    clear = ~Exists(Approval.objects.filter(by_the_same_eyes(*people), item=OuterRef("pk")))
    return clear & ~Q(action__agent__in=agents) if agents else clear


def approvals_counted(approvals, agent):
    """The approvals that count, and the names of those that do not: given by a person (or for a
    person, by their delegate) who answers for the agent now, named its owner or shown its token
    since (the database counts so too: approvals.dbrules). Such an approval is passed over rather
    than refusing the one being given: a refusal would leave the item approvable by nobody, and
    the person at the page is told what is true, that their approval is recorded and another is
    needed; the audit event names the approvals left out."""
    counted = [a for a in approvals if not agent.answers_for(a.user, a.on_behalf_of)]
    return counted, [a.user.get_username() for a in approvals if a not in counted]


def _decide(item, action, user, behalf, decision, reason, external_ref, fingerprint):
    """The item's named move for `decision`, then the action's: both rows locked already."""
    decided = {"user": user, "reason": reason, "fingerprint": fingerprint, "locked": True, "on_behalf_of": behalf}
    if decision in ("approve", "reject"):
        getattr(item, decision)(**decided)
    else:
        item.resolve(verb=decision, **decided)
    try:
        if decision == "approve":
            action.approve(actor=user, reason=reason, fingerprint=fingerprint, locked=True)
        elif decision == "reject":
            action.reject(actor=user, reason=reason, locked=True)
        elif decision == "release":
            action_release(action, actor=user, reason=reason, fingerprint=fingerprint)
        elif decision == "mark_succeeded":
            # The provider may have failed that very effect already (a late success over the limit
            # left it to this person): the move tells a person, as any success does, the audit trail
            # naming this person as the one whose move told (ledger.webhooks.failure_told_when_succeeded).
            action.mark_succeeded(actor=user, external_ref=external_ref, reason=reason or "confirmed by a person",
                                  locked=True)
        elif decision == "mark_failed":
            # Retryable only while its task may still run it, as any failure of a task's action
            # (its task locked before the action and the item: `_lock_its_task`).
            task_action_fail(action, task_stopped(action), lambda retryable: action.mark_failed(
                actor=user, code="confirmed_absent", message=reason, retryable=retryable, reason=reason, locked=True),
                actor=user)
        else:
            action.verify_again(actor=user, reason=reason or "verify again", locked=True)
    except InvalidTransition as exc:
        raise DecisionRefused(str(exc)) from exc


def review_edit(item, *, user, changes, reason, fingerprint=""):
    """Edit an over-limit action down instead of rejecting it (`changes`: param -> text): its
    next version (ledger.versions), approved by `user` as it is made — the first of two
    approvals if the limits still ask two for it. The item ends `edited`, the action
    `superseded`. Returns the item and the new version.

    The approval is given on the version's approval item as any is (`review_decide`). A version
    the database held as it was made (something in flight on its target or customer) has that
    item closed by its hold already: the approval is recorded on it as on an open one, the first of
    two for its release to find (decision 23), and one approval alone, bound to the version's params
    from its insert (ledger.versions), so that the record of the version that runs on it names who
    approved it: held, it keeps either through the hold. A first of two tells those the version waits
    for as any does: on its open item as it is given, on the held one when its release reopens it."""
    reason = reason.strip()
    if item.kind != ReviewKind.APPROVAL:
        raise DecisionRefused("only an action awaiting approval can be edited")
    if not reason:
        raise DecisionRefused("a reason is required to edit")
    with _decision(item):
        action, item, fingerprint, behalf = _open_for(item, user, fingerprint)
        try:
            params = version_params(action, changes)
            item.edited(user=user, reason=reason, fingerprint=fingerprint, locked=True, on_behalf_of=behalf)
            version = action_version_create(action, actor=user, reason=reason, params=params)
        except VersionRefused as exc:
            raise DecisionRefused(str(exc)) from None
        waiting = ReviewItem.objects.get(action=version, kind=ReviewKind.APPROVAL)  # (approvals.reviews)
        if waiting.status == ReviewStatus.OPEN:
            review_decide(waiting, user=user, decision="approve", reason=reason,
                          fingerprint=version.params_fingerprint())
        else:  # held as it was made: the only record of who let this version go, and which one
            _approval_recorded(waiting, version, user, behalf, reason, version.params_fingerprint())
    return item, Action.objects.get(pk=version.pk)


def params_changed(before, after):
    """(param, before, after) for each param an edit changed, by name ("—" where one has none):
    what a version's page shows of its edit, and a decision link refused by one lists."""
    before, after = before or {}, after or {}
    return [(name, before.get(name, "—"), after.get(name, "—"))
            for name in sorted(set(before) | set(after)) if before.get(name) != after.get(name)]


def held_group(item):
    """The open held items waiting with this one: held actions on its action's target or
    customer, oldest first (this one among them)."""
    action = item.action
    subjects = Q(action__target=action.target) | (Q(action__customer=action.customer) if action.customer else Q())
    return list(ReviewItem.objects.filter(subjects, kind=ReviewKind.HELD, status=ReviewStatus.OPEN)
                .select_related("action").order_by("action_id"))


def held_group_decide(item, *, user, release, reason, fingerprint="", in_flight="", members=None):
    """One decision for a held group: release the action `release` (a pk in the group) and
    reject the rest, or reject them all (`release` None), with one reason for all. The one
    released goes first, so that no rejection lets the system release another meanwhile;
    `fingerprint`: of its params as the person saw them, `in_flight`: the print of what was in
    flight near it (review_decide); `members`: the actions the person saw in the group (a page's
    form says them), refused unless they are the group's now: a request held since would be
    rejected unseen. Without them, the group as it is is decided."""
    reason = reason.strip()
    if not reason:
        raise DecisionRefused("a reason is required")
    with transaction.atomic():
        group = held_group(item)
        chosen = [member for member in group if member.action_id == release]
        if release is not None and not chosen:
            raise DecisionRefused("the action to release is not held in this group any more")
        if members is not None and sorted(members) != sorted(member.action_id for member in group):
            raise DecisionRefused(GROUP_CHANGED)
        if chosen:  # its subjects' locks before the rows, as review_decide takes them (no deadlock)
            action_lock_subjects(chosen[0].action)
        # Every member's action, then every item, in id order, before any is decided: two people
        # deciding one group at once took them in two orders (each the one released first) and
        # deadlocked. So the second waits for the first, then finds the group decided.
        list(Action.objects.select_for_update().filter(pk__in=[m.action_id for m in group]).order_by("pk"))
        list(ReviewItem.objects.select_for_update().filter(pk__in=[m.pk for m in group]).order_by("pk"))
        for member in sorted(group, key=lambda member: member.action_id != release):
            released = member.action_id == release
            review_decide(member, user=user, decision="release" if released else "reject", reason=reason,
                          fingerprint=fingerprint if released else "", in_flight=in_flight if released else "")
    return group
