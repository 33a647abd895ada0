"""The seams through which the apps built on the ledger take part in its work.

The ledger knows nothing of `approvals` or `dlq`: each app registers here, from its
`AppConfig.ready()`, what it adds. Its entries, each kept in a plain list or slot:

- reactions to moves (`on_move`): run inside the transaction of every status change of a
  model, after its write and audit event, in registration order (INSTALLED_APPS order:
  the ledger's own first). A reaction that raises rolls the move back.
- reactions to a new action (`on_record`): the intake's counterpart of a move, with the
  reason the action was held or must wait.
- the limits policy (`set_policy`, any object with NoLimits' three functions, such as a
  module): what the intake and the executor ask before running an action. Without one,
  nothing is over a limit.
- sweeper steps (`on_sweep`): extra work for every pass of the sweeper that leads the step,
  named for its counts and its lease (ledger.sweeper).
- overview cards (`on_overview`): the queues a person works, shown on the overview.
- evidence sections (`on_evidence`): an app's part of an action's evidence record
  (ledger.evidence), with the audit events that cover it.
"""

from collections import defaultdict
from dataclasses import dataclass

from django.db.models import Q, Value


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

    def needs_person_after_verification(self, action):
        """Why a verified outcome still goes to a person, or ""."""
        return ""


_reactions = defaultdict(list)
_on_record = []
_sweeps = []
_overview = []
_evidence = []
_policy = [NoLimits()]


def on_move(model, reaction):
    """`reaction(obj, previous, actor)` runs in the transaction of every move of a `model`
    row: `previous` is the status it left, `actor` who moved it."""
    _reactions[model].append(reaction)


def moved(obj, previous, actor):
    for reaction in _reactions[type(obj)]:
        reaction(obj, previous, actor)


def on_record(reaction):
    """`reaction(action, reason)` runs in the transaction that records a new action that is
    not simply queued (held, or awaiting approval), or that keeps one held for a new reason."""
    _on_record.append(reaction)


def recorded(action, reason):
    for reaction in _on_record:
        reaction(action, reason)


def set_policy(policy):
    _policy[0] = policy


def policy():
    return _policy[0]


def on_sweep(name, step):
    """`step()` runs on every pass of the sweeper that leads `name` (one of several sweepers at
    a time); what it returns is reported under `name`. It must stay safe alongside itself (a
    conditional update or SKIP LOCKED per row): a run that outlasts its lease may meet the
    next leader's."""
    if any(taken == name for taken, _ in _sweeps):
        raise ValueError(f"a sweeper step named {name!r} is registered already: the name is its lease")
    _sweeps.append((name, step))


def sweep_steps():
    return list(_sweeps)


def on_overview(cards):
    """`cards(user, now)` returns the overview's cards for its queues, each a dict: `kind`,
    `label`, `count`, `href`, `mine` (how many this user may decide, or None),
    `overdue`, `oldest`, `deadline`, `count_id` and `hint` (said when nothing is oldest)."""
    _overview.append(cards)


def overview_cards(user, now):
    return [card for cards in _overview for card in cards(user, now)]


@dataclass(frozen=True)
class EvidencePart:
    """An app's part of an action's evidence record: `data` (JSON-ready, as its schema says)
    and `audit`, a Q naming the audit events that cover it (the record carries them with
    their links in the hash chain)."""

    data: object
    audit: Q = Q(pk__in=[])


@dataclass(frozen=True)
class EvidenceSection:
    name: str
    build: object  # build(action) -> EvidencePart, in a number of queries that does not grow with the history
    schema: type  # the DRF serializer describing `data`, for the OpenAPI document
    template: str  # what the printable page includes, with `data`


def on_evidence(name, build, *, schema, template):
    """The section `name` of every action's evidence record: `build(action)` returns an
    `EvidencePart`; `schema` (a serializer class) describes its data in the API's document and
    `template` shows it on the printable page."""
    _evidence.append(EvidenceSection(name, build, schema, template))


def evidence_sections():
    return list(_evidence)
