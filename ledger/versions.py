"""Versions of an action: a person edits an over-limit action down instead of rejecting it.

The edit never changes the action the agent asked for. It makes a new action, the next
version, with its own operation key (the original's and `~v2`, `~v3`, …), its own audit
trail and review item, and a `supersedes` link; the original ends `superseded`. So a replay
of the original key still answers the original row, and nothing runs twice: only the version
can reach the provider, and only once a person has approved it.

1. `version_params`: the edited params, refused (VersionRefused, in words) unless the action
   may be edited at all (`edit_refusal`: never one sent to its provider before), only the
   fields declared editable for the action type change, the result is valid params for that
   type, something changed, and the amount did not go up.
2. `action_version_create` (in the caller's transaction, with the original locked and waiting
   for approval): the original moves to `superseded` with the editor's reason, then the new
   version is inserted `awaiting_approval` (the database may hold it, as any insert, when
   something else is in flight on its target or customer) and the apps are told, as of any
   new action that waits (`hooks.moved` from no status): the approvals app opens its review
   item, with as many approvers as the limits ask for the new amount.

The editor approves the version as it is made (decision 24). Where that one approval is all its
limits ask, it is bound to the version's params from the insert (`approved_fingerprint`, as
`Action.approve` binds one): the database may hold the version as it is made, and an approval
given before a hold stands through it (decision 23), so its release queues it rather than asking
a person again. Not held, the editor's approval of its item moves it on, bound to the same print;
where two approvals are asked, the editor's is the first, on its approval item
(approvals.decisions.review_edit).
"""

import re

from django.db import IntegrityError, transaction

from . import hooks
from .compiled import insert
from .models import Action, ActionStatus, ActionType, AuditEvent, money_in_params, request_fingerprint
from .validation import PARAMS

# What an approver may change, per action type; anything else is asked again by the agent.
EDITABLE_PARAMS = {ActionType.REFUND: ("amount", "reason")}
VERSION_SUFFIX = re.compile(r"~v([0-9]+)$")


class VersionRefused(Exception):
    """The edit is not allowed; the message says why, for a person."""


def version_key(action):
    """`refund:ORD-1:dec-7` -> `refund:ORD-1:dec-7~v2`; `…~v2` -> `…~v3`."""
    found = VERSION_SUFFIX.search(action.operation_key)
    base = action.operation_key[: found.start()] if found else action.operation_key
    return f"{base}~v{int(found.group(1)) + 1 if found else 2}"


def edit_refusal(action):
    """Why `action` cannot be edited into a version, for a person ("" when it can). One sent to
    its provider before (a failure tried again, back with a person) may have made its effect
    under its key: a version runs under a key of its own, which the look a retried failure makes
    before its call (ledger.executor) does not cover, and a provider would take it as new."""
    if not EDITABLE_PARAMS.get(action.action_type):
        return f"a {action.action_type} cannot be edited: approve or reject it"
    if action.attempts:
        return ("it was sent to the provider before, under its own key: a version, under a new key, could make "
                "the effect a second time. Approve or reject it")
    return ""


def version_params(action, changes):
    """The params of the next version: `action`'s with `changes` (field -> text) applied."""
    refusal = edit_refusal(action)
    if refusal:
        raise VersionRefused(refusal)
    editable = EDITABLE_PARAMS[action.action_type]
    fixed = sorted(set(changes) - set(editable))
    if fixed:
        raise VersionRefused(f"{', '.join(fixed)} may not be edited (for a {action.action_type}: "
                             f"{', '.join(editable)})")
    params = {**action.params, **{field: value for field, value in changes.items()
                                  if value != "" or field in action.params}}
    incoming = PARAMS[action.action_type](data=params)
    if not incoming.is_valid():
        raise VersionRefused("; ".join(f"{field}: {' '.join(map(str, messages))}"
                                       for field, messages in incoming.errors.items()))
    params = dict(incoming.validated_data)
    # Against the params the person saw (the columns are a copy): an edit lowers the amount or
    # keeps it while changing another field (a refund's reason), never raises it.
    amount, was = money_in_params(params)[0], money_in_params(action.params)[0]
    if amount is not None and was is not None:
        if amount > was:
            raise VersionRefused(f"the amount may not go up: {params['amount']} is above "
                                 f"{action.params['amount']} {action.currency}")
        if amount == was:  # "750" for "750.00" is no change
            params["amount"] = action.params["amount"]
    if params == action.params:
        raise VersionRefused("nothing was changed")
    return params


def action_version_create(original, *, actor, reason, params):
    """The next version of `original` (locked by the caller, awaiting approval) with `params`
    (from `version_params`, which refuses an action that may not be edited); `original` ends superseded. Returns the new version."""
    refusal = edit_refusal(original)  # of the locked row: the page's copy may be older
    if refusal:
        raise VersionRefused(refusal)
    key = version_key(original)
    if len(key) > Action._meta.get_field("operation_key").max_length:
        raise VersionRefused("the operation key is too long for a version of its own: reject it instead")
    if original.status != ActionStatus.AWAITING_APPROVAL:
        raise VersionRefused(f"it is {original.status}, no longer awaiting approval")
    original.supersede(actor=actor, reason=reason, locked=True)
    amount, was = money_in_params(params)[0], money_in_params(original.params)[0]
    version = Action(
        operation_key=key, action_type=original.action_type, target=original.target,
        customer=original.customer, params=params, amount=amount, currency=original.currency,
        decision_id=original.decision_id, task=original.task, agent=original.agent,
        status=ActionStatus.AWAITING_APPROVAL, supersedes=original,
        fingerprint=request_fingerprint(original.action_type, original.target, params, original.customer),
    )
    # Its editor's approval, where it is all the limits ask (the module's docstring).
    if hooks.policy().verdict_for_action(version).approvals_needed <= 1:
        version.approved_fingerprint = version.fingerprint
    try:
        with transaction.atomic():
            version = insert(version, stored=("status", "next_attempt_at"))
    except IntegrityError:
        raise VersionRefused(f"the operation key {key} is already taken: reject it instead") from None
    # Said as the edit was: down where the amount went down, else by the fields it changed.
    changed = sorted(name for name in set(params) | set(original.params)
                     if params.get(name) != original.params.get(name))
    lowered = amount is not None and was is not None and amount < was
    why = (f"edited down from {original.operation_key}" if lowered else
           f"edited from {original.operation_key}, its {' and '.join(changed)} changed") + f": {reason}"
    AuditEvent.objects.record(actor=actor, verb="requested", obj=version, reason=why,
                              after={"status": version.status, "supersedes": original.operation_key,
                                     "params": params, "approved_fingerprint": version.approved_fingerprint or None})
    hooks.moved(version, None, actor, why)
    return version


def latest_version(action):
    """The version that runs in `action`'s place: itself unless a person edited it down."""
    while action.status == ActionStatus.SUPERSEDED:
        action = Action.objects.select_related("task").get(supersedes=action)
    return action


def edited_from(action):
    """`action` and the versions it was edited down from, newest first (`latest_version`'s way
    back): one decision, whose effect under any of their keys is the decision's."""
    chain = [action]
    while action.supersedes_id:
        action = Action.objects.only("operation_key", "supersedes_id").get(pk=action.supersedes_id)
        chain.append(action)
    return chain
