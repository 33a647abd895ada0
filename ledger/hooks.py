"""The seams through which the apps built on the ledger take part in its work.

The ledger knows nothing of `approvals` or `dlq`: each app registers here, from its
`AppConfig.ready()`, how it reacts to the ledger's changes and what limits it sets. (What the
pages, the evidence record, the sweeper and /metrics are made of is listed, not registered:
console.) Its entries, each kept in a plain list or slot:

- reactions to moves (`on_move`): run inside the transaction of every status change of a
  model, after its write and audit event, in registration order (INSTALLED_APPS order:
  the ledger's own first). A reaction that raises rolls the move back. A new action that
  waits for a person is a move from no status, and a row kept waiting for a new reason (an
  action kept held, a review item given the first of two approvals) a move to the status it
  has: one path for the apps to follow a row, whichever way it came.
- the limits policy (`set_policy`, any object with NoLimits' four functions, such as a
  module): what the intake and the executor ask before running an action. Without one,
  nothing is over a limit.
- whether a stopped task may run again (`set_redrivable`): the executor asks it of a task's
  action it cannot attempt while the task is stopped (failed, to be retried if the task runs
  again, or for good). Without one, no stopped task runs again.
- what is done when the provider fails an effect the ledger recorded as made
  (`set_effect_failed`): a webhook says so after the action succeeded, or the action succeeds with
  an effect whose failure a webhook told already. Without one, it is logged.
"""

import logging
from collections import defaultdict
from dataclasses import dataclass

from django.db.models import Value

logger = logging.getLogger("surety.hooks")


@dataclass(frozen=True)
class Verdict:
    """What the limits say of a request: how many people must approve it (0: none), and why;
    `refused`, a code: the intake refuses the request instead, and records nothing."""

    approvals_needed: int = 0
    reason: str = ""
    refused: str = ""


RUN = Verdict()


class NoLimits:
    """The policy of a ledger without an approvals app: every request runs."""

    def version_expression(self):
        """A SQL expression for the limits' version, read by the statement that authenticates
        an API request (so a request costs no statement of its own for the limits)."""
        return Value(None)

    def verdict_for_request(self, *, action_type, amount, currency, customer, recorded=None, limits_version=None,
                            lock_subjects=None):
        """`recorded`: the action itself, when it is already in the ledger (a held one released)."""
        return RUN

    def verdict_for_action(self, action):
        """The verdict on an action already recorded (a held one released, a failure for good
        retried), on the params the provider would be sent."""
        return RUN

    def needs_person_after_verification(self, action):
        """Why a verified outcome still goes to a person, or ""."""
        return ""


_reactions = defaultdict(list)
_policy = [NoLimits()]


def on_move(model, reaction):
    """`reaction(obj, previous, actor, reason)` runs in the transaction of every move of a
    `model` row: `previous` is the status it left (None: the row is new; its own status: it
    stays, for a new reason), `actor` who moved it, `reason` what its audit event says."""
    _reactions[model].append(reaction)


def moved(obj, previous, actor, reason=""):
    for reaction in _reactions[type(obj)]:
        reaction(obj, previous, actor, reason)


def set_policy(policy):
    _policy[0] = policy


_redrivable = [lambda task_id: False]


def set_redrivable(predicate):
    """`predicate(task_id)`: whether the stopped task may still be run again by a person."""
    _redrivable[0] = predicate


def redrivable(task_id):
    return _redrivable[0](task_id)


def policy():
    return _policy[0]


def _effect_failed_logged(action, **details):
    logger.warning("the provider failed %s's effect %s after it succeeded", action, details.get("external_ref"))


_effect_failed = [_effect_failed_logged]


def set_effect_failed(reaction):
    """`reaction(action, *, connector, external_ref, evidence, actor)`: the provider failed the
    effect `external_ref`, which the succeeded `action` names (a refund Stripe fails days later, the
    card closed). In the transaction that brought the two together: the failure's event arriving
    after the success, or a move to succeeded after the failure was stored; `actor` is its maker."""
    _effect_failed[0] = reaction


def effect_failed(action, **details):
    _effect_failed[0](action, **details)
