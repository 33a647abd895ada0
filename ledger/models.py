"""The ledger: agents, the actions they request, tasks and their checkpoints, audit events.

Every status change is one method here that locks the row, checks the transition table,
writes with `update_fields` and records an audit event, all in one transaction. Nothing
else assigns `status`.
"""

import copy
import hashlib
import json
import secrets
from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.db import connections, models, router
from django.db.models import Q
from django.db.models.fields.json import KeyTextTransform
from django.utils import timezone

from . import clock, hooks, money
from .audit import (  # noqa: F401 (models of this app, defined beside their manager)
    AuditEvent, ChainCheck, ChainCheckpoint, ChainWalk)
from .authority import Grant, GrantState, ReplayRun  # noqa: F401 (models of this app, see authority.py)
from .locks import StepLease  # noqa: F401 (the sweeper steps' leases, defined beside their statement)
from .retention import ArchivedKey, ArchivedTask  # noqa: F401 (the archived keys, defined beside their lifetime)
from .compiled import Compiled, update
from .statemachine import (CONDITIONAL, InvalidTransition, LeasedWork, Machine, StaleClaim,  # noqa: F401 (re-exported)
                           next_fence)


# --- Agents and what they may do --------------------------------------------------------------


class AgentManager(models.Manager):
    def for_token(self, token, *, operation_key=None):
        """The active agent whose token this is, or None; its user is loaded when first used.

        With an `operation_key`, the same statement tells whether an action holds that key,
        `agent.key_action_id` (its id, or None), and the limits' version the intake will judge
        the request by, `agent.limits_version` (None where unknown)."""
        if not token:
            return None
        if operation_key is None:
            return _agent_by_token_hash.first(Agent.hash_token(token))
        return _agent_by_token_hash_and_key.first(Agent.hash_token(token), operation_key)


UNASSIGNED_OWNER = "owner-to-be-named"


class Agent(models.Model):
    """A service account. Its bearer token is shown once and stored only as a hash.

    Each agent has a user of its own so that django-guardian can hold its grants.
    """

    name = models.SlugField(max_length=100, unique=True)
    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="agent")
    token_hash = models.CharField(max_length=64, unique=True)
    token_prefix = models.CharField(max_length=12)
    # The person responsible for the agent: four eyes forbid them to decide its requests (held
    # by the database too: approvals.dbrules). Agents made before owners were required belong to
    # UNASSIGNED_OWNER until a person is named (the agents page says so).
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="owned_agents")
    # The person its current token was shown to (who created the agent or last rotated its token;
    # null: a command did). They can act as the agent, so four eyes forbid them to decide its
    # requests too (approvals.dbrules), whoever owns it.
    token_issued_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                        related_name="+")
    is_active = models.BooleanField(default=True)
    # Bumped by every grant and revoke: the key of each process's cache of grant checks.
    grants_version = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)

    objects = AgentManager()

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    @property
    def audit_actor(self):
        return f"agent:{self.name}"

    def answers_for(self, *people):
        """Whether one of `people` (users, or None) owns the agent or was shown its token: four eyes
        keep them from deciding its requests and making its grants live (the database holds the
        first too: approvals.dbrules)."""
        return bool({person.pk for person in people if person is not None} & {self.owner_id, self.token_issued_by_id})

    @staticmethod
    def answering_for(user):
        """The agents `user` owns or was shown the token of, as a condition on agents."""
        return Q(owner=user) | Q(token_issued_by=user)

    @staticmethod
    def hash_token(token):
        # Tokens are 256 random bits, so a plain digest is enough: nothing to brute-force.
        return hashlib.sha256(token.encode()).hexdigest()

    @staticmethod
    def new_token():
        return "sur_" + secrets.token_urlsafe(32)


# Every API request authenticates: compiled once (see ledger/compiled.py).
# SELECT id, name, user_id, grants_version, is_active FROM ledger_agent WHERE token_hash = %s AND is_active
def _active_agent(digest):
    return (Agent.objects.filter(token_hash=digest, is_active=True)
            .only("name", "user_id", "grants_version", "is_active").order_by())


_agent_by_token_hash = Compiled(_active_agent)


# The same, and in the same statement whether the key is taken and the limits' version:
# ..., (SELECT id FROM ledger_action WHERE operation_key = %s LIMIT 1) AS key_action_id,
#      (SELECT version FROM approvals_limitsversion LIMIT 1) AS limits_version   (the policy's)
def _active_agent_and_key(digest, key):
    return _active_agent(digest).annotate(
        key_action_id=models.Subquery(Action.objects.filter(operation_key=key).order_by().values("pk")[:1]),
        limits_version=hooks.policy().version_expression(),
    )


_agent_by_token_hash_and_key = Compiled(_active_agent_and_key)


class Capability(models.Model):
    """An action type or a workflow: what grants (object permissions) are about."""

    class Kind(models.TextChoices):
        ACTION_TYPE = "action_type", "action type"
        WORKFLOW = "workflow", "workflow"

    kind = models.CharField(max_length=20, choices=Kind.choices)
    name = models.CharField(max_length=100)

    class Meta:
        ordering = ["kind", "name"]
        constraints = [models.UniqueConstraint(fields=["kind", "name"], name="capability_unique_kind_name")]
        permissions = [
            ("use_capability", "Agent may request this action type or start this workflow"),
            ("approve_capability", "May approve or reject actions of this type"),
            ("resolve_capability", "May resolve unknown outcomes and held groups of this type"),
            ("work_deadletters_capability", "May redrive, resolve and discard dead-letter entries"),
        ]

    def __str__(self):
        return f"{self.get_kind_display()} {self.name}"


# --- Actions ----------------------------------------------------------------------------------


class ActionStatus(models.TextChoices):
    QUEUED = "queued"
    AWAITING_APPROVAL = "awaiting_approval"
    HELD = "held"
    PENDING = "pending"
    UNKNOWN = "unknown"
    NEEDS_REVIEW = "needs_review"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    REJECTED = "rejected"
    CANCELLED = "cancelled"
    # Requested under a shadow grant: recorded and fingerprinted, never executed (ledger.grants).
    SHADOW = "shadow"
    # Nobody decided within the limit's approval window: not a person's no (error approval_expired).
    EXPIRED = "expired"
    # A person edited it down instead of rejecting it: a new version (ledger.versions) runs instead.
    SUPERSEDED = "superseded"


S = ActionStatus

# The whole state machine of an action. A failed action goes back to queued only when its
# error says it is retryable; that condition is checked in `Action.requeue`. A queued action
# goes back to awaiting approval when its params are no longer the ones a person approved.
ACTION_TRANSITIONS = {
    S.QUEUED: {S.PENDING, S.HELD, S.CANCELLED, S.AWAITING_APPROVAL},
    S.AWAITING_APPROVAL: {S.QUEUED, S.HELD, S.REJECTED, S.CANCELLED, S.EXPIRED, S.SUPERSEDED},
    S.HELD: {S.QUEUED, S.AWAITING_APPROVAL, S.REJECTED, S.CANCELLED},
    # (needs_review: a failure tried again, whose look before its call could not tell, or found the effect
    # over its limit: ledger.executor)
    S.PENDING: {S.SUCCEEDED, S.FAILED, S.UNKNOWN, S.QUEUED, S.NEEDS_REVIEW},
    S.UNKNOWN: {S.SUCCEEDED, S.FAILED, S.QUEUED, S.NEEDS_REVIEW},
    S.NEEDS_REVIEW: {S.SUCCEEDED, S.FAILED, S.QUEUED, S.UNKNOWN},
    S.FAILED: {S.QUEUED, S.HELD, S.AWAITING_APPROVAL},
    S.SUCCEEDED: set(),
    S.REJECTED: set(),
    S.CANCELLED: set(),
    # Recorded as it is and final: nothing may ever make it pending.
    S.SHADOW: set(),
    S.EXPIRED: set(),
    S.SUPERSEDED: set(),
}
# An action in one of these blocks others on the same target or customer.
IN_FLIGHT_STATUSES = {S.QUEUED, S.PENDING, S.UNKNOWN, S.AWAITING_APPROVAL, S.HELD, S.NEEDS_REVIEW}
# (A superseded action is not among them: its new version, in flight on the same subjects,
# holds what it held.)
SETTLED = {S.SUCCEEDED, S.FAILED, S.REJECTED, S.CANCELLED, S.EXPIRED}
# A failure for good whose effect a person made by hand (its dead letter resolved:
# ledger.actions.action_done_by_hand): unlike one given up, it happened.
DONE_BY_HAND = Q(status=S.FAILED, error__done_by_hand=True)
# A booking action whose slot is held (ledger.actions.booking_follow_action frees it otherwise):
# neither ended without it (rejected, cancelled, expired, failed for good but by a person's
# hand), nor never booked (shadow), nor replaced by its version (superseded).
BOOKING_HELD = ~Q(status__in=[S.SUPERSEDED, S.REJECTED, S.CANCELLED, S.EXPIRED, S.SHADOW]) & (~Q(
    status=S.FAILED, error__retryable=False) | DONE_BY_HAND)


def held_nearby(action_id, target, customer):
    """SQL: whether an action other than `action_id` is held on `target` or `customer` (SQL
    expressions)."""
    return (f"EXISTS (SELECT 1 FROM ledger_action h WHERE h.status = '{S.HELD}' AND h.id <> {action_id} "
            f"AND (h.target = {target} OR ({customer} <> '' AND h.customer = {customer})))")


# Read back by the statement that settles an action (compiled.update's `read_back`): whether
# another action is held on its target or customer. The settle looks for the ones it may release
# only then (ledger.actions.held_release_when_settled): a statement fewer on nearly every settle
# (decision 54). On PostgreSQL it is asked through a function (ledger.dbrules.HELD_NEARBY), which
# reads what is committed once the UPDATE has its row: the UPDATE's own snapshot is older when it
# waited for the row's lock, and would miss an action held meanwhile by the one that held it.
# SQLite serialises writers: there the UPDATE's own look sees every commit.
HELD_NEARBY = {
    "postgresql": "ledger_held_nearby(ledger_action.id, ledger_action.target, ledger_action.customer)",
    "sqlite": held_nearby("ledger_action.id", "ledger_action.target", "ledger_action.customer"),
}
# Waiting for a person: the task that owns the action waits too.
PERSON_STATUSES = {S.AWAITING_APPROVAL, S.HELD, S.NEEDS_REVIEW}


class ActionType(models.TextChoices):
    REFUND = "refund"
    SEND_MESSAGE = "send_message"
    CREATE_BOOKING = "create_booking"


# The provider events that say an effect failed, and the type of action whose effect each is about
# (ledger.webhooks.SETTLING settles by them).
EFFECT_FAILED = {"refund.failed": ActionType.REFUND, "message.failed": ActionType.SEND_MESSAGE,
                 "booking.failed": ActionType.CREATE_BOOKING}
# The effect a stored event's payload names (its data's id), as each database reads JSON.
_EVENT_EFFECT = {"postgresql": "e.payload -> 'data' ->> 'id'", "sqlite": "json_extract(e.payload, '$.data.id')"}


def failure_stored(key, effect, vendor):
    """SQL for `vendor`'s database: whether an event is stored in which a provider failed `effect`,
    about the action whose operation key is `key` (SQL expressions). Wider than the match that tells
    a person (ledger.webhooks._failure_stored: the connector serving the action, its type's failures,
    the effect's id as text, a test-mode event only for a replay run's action), which it lets through."""
    failures = ", ".join(f"'{event_type}'" for event_type in EFFECT_FAILED)
    return (f"EXISTS (SELECT 1 FROM ledger_webhookevent e WHERE e.operation_key = {key} "
            f"AND e.event_type IN ({failures}) AND {_EVENT_EFFECT[vendor]} = {effect})")


# Read back by the statement that moves an action to succeeded, as HELD_NEARBY is and for the same
# reasons (a function on PostgreSQL, ledger.dbrules.FAILURE_STORED): whether the provider's failure
# of the very effect it succeeded with is stored already, a refund's `refund.failed` come while
# the call or a look was out, or before its late success (decision 60). Only then does the success
# look for that event and tell a person (ledger.webhooks.failure_told_when_succeeded): no statement
# of its own on nearly every success. A failure committed after the UPDATE has the row finds the
# action succeeded once it has the row itself, and tells a person then (ledger.webhooks._settle).
FAILURE_STORED = {
    "postgresql": "ledger_failure_stored(ledger_action.operation_key, ledger_action.external_ref)",
    "sqlite": failure_stored("ledger_action.operation_key", "ledger_action.external_ref", "sqlite"),
}


APPROVAL_EXPIRED = "approval_expired"  # the error code of an expired action (stable: CONTRACT)


def fingerprint(kind, target, params):
    """What a key asks for, hashed from its canonical form: the same request, the same print.
    An amount is the same amount whatever its spelling ("25" and "25.00" EUR: money.canonical);
    migration 0025 gave the rows recorded before this rule their print under it."""
    canonical = json.dumps([kind, target, money.canonical(params)], sort_keys=True, separators=(",", ":"),
                           default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def money_in_params(params):
    """`(amount, currency)` as params ask for them, the way the intake writes them into the
    columns of their own (None and "" where there are none)."""
    amount = params.get("amount")
    return (None if amount in (None, "") else Decimal(str(amount))), params.get("currency", "")


def request_fingerprint(action_type, target, params, customer):
    """An action's fingerprint. A booking's customer is part of what is asked (the provider
    books for them); anyone else's customer is not."""
    return fingerprint(action_type, target,
                       {**params, "customer": customer} if action_type == ActionType.CREATE_BOOKING else params)


class Action(LeasedWork):
    """One ledger entry per operation key, written before any call to a provider."""

    TRANSITIONS = ACTION_TRANSITIONS
    FENCED = True  # a pending action's claim holder settles it by its fence (statemachine.Machine)

    operation_key = models.CharField(max_length=255, unique=True)
    fingerprint = models.CharField(max_length=64)
    action_type = models.CharField(max_length=40, choices=ActionType.choices)
    target = models.CharField(max_length=255)
    customer = models.CharField(max_length=255, blank=True, default="")
    params = models.JSONField()
    # The refund amount and currency again, as columns: limits, daily totals and the queues
    # sum and filter on them. Written once, with params, by the intake; never changed.
    amount = models.DecimalField(max_digits=18, decimal_places=3, null=True, blank=True)
    currency = models.CharField(max_length=3, blank=True, default="")
    decision_id = models.CharField(max_length=255, blank=True, default="")
    task = models.ForeignKey("Task", null=True, blank=True, on_delete=models.PROTECT, related_name="actions")
    # Indexed by action_agent_idx (agent, created_at), which also serves lookups by agent alone.
    agent = models.ForeignKey(Agent, on_delete=models.PROTECT, related_name="actions", db_index=False)
    status = models.CharField(max_length=20, choices=ActionStatus.choices, default=S.QUEUED)
    external_ref = models.CharField(max_length=255, blank=True, default="")
    result = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    # What verification saw: provider answers, times, lease history. Shown to reviewers.
    evidence = models.JSONField(default=list, blank=True)
    # The fingerprint of the params a person saw when they approved it or released it to the
    # queue: the executor calls the provider only while the params still have it
    # (ledger.executor), and a release after a hold queues it on them (ledger.actions.action_release).
    approved_fingerprint = models.CharField(max_length=64, blank=True, default="")
    # The action a person edited down into this one (ledger.versions); that one is superseded.
    supersedes = models.OneToOneField("self", null=True, blank=True, on_delete=models.PROTECT,
                                      related_name="superseded_by")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["status", "next_attempt_at"], name="action_runnable_idx"),
            # A claim's look (ledger.executor: due, ORDER BY next_attempt_at, id LIMIT 1) stops at
            # the first due row it may take instead of sorting the queue (decision 38).
            models.Index(fields=["next_attempt_at", "id"], condition=Q(status__in=[S.QUEUED, S.UNKNOWN]),
                         name="action_due_idx"),
            models.Index(fields=["target", "status"], name="action_target_idx"),
            models.Index(fields=["customer", "status"], name="action_customer_idx"),
            models.Index(fields=["agent", "-created_at"], name="action_agent_idx"),
            models.Index(fields=["-created_at", "-id"], name="action_recent_idx"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(status__in=ActionStatus.values), name="action_status_valid"),
            models.CheckConstraint(condition=~Q(operation_key=""), name="action_key_not_empty"),
            models.CheckConstraint(
                condition=Q(amount__isnull=True) | Q(amount__gt=0), name="action_amount_positive"
            ),
            models.CheckConstraint(
                condition=~Q(status=S.SUCCEEDED) | ~Q(external_ref=""), name="action_succeeded_has_ref"
            ),
            # What workers claim and the sweeper expires is found by these times: a row without
            # one would never be run, verified or taken back, and nothing would say so.
            models.CheckConstraint(
                condition=~Q(status__in=[S.QUEUED, S.UNKNOWN]) | Q(next_attempt_at__isnull=False),
                name="action_due_has_time",
            ),
            models.CheckConstraint(
                condition=~Q(status=S.PENDING) | Q(lease_expires_at__isnull=False), name="action_pending_has_lease"
            ),
            # An expired wait is never recorded as anything else (a rejection, a failure): the
            # agent reads the code.
            models.CheckConstraint(
                condition=~Q(status=S.EXPIRED) | Q(error__code=APPROVAL_EXPIRED), name="action_expired_says_so"
            ),
            # A message is sent once per recipient, message type and decision, whatever key
            # asks for it (the intake answers a second one with the first one's row). A shadow
            # row sends nothing: once the grant is live, the decision asked again is sent.
            models.UniqueConstraint(
                "target", KeyTextTransform("message_type", "params"), "decision_id",
                condition=Q(action_type=ActionType.SEND_MESSAGE) & ~Q(decision_id="") & ~Q(status=S.SHADOW),
                name="action_message_once_per_decision",
            ),
            # A refund is made once per order and decision, whatever key or task asks for it (a
            # task's refund carries the decision its input names, else its task's id). A person's
            # edit-down supersedes the original before its version is inserted, so the version
            # takes its place; a shadow row refunds nothing, so the decision asked again once the
            # grant is live is refunded.
            models.UniqueConstraint(
                "target", "decision_id",
                condition=Q(action_type=ActionType.REFUND) & ~Q(decision_id="")
                & ~Q(status__in=[S.SUPERSEDED, S.SHADOW]),
                name="action_refund_once_per_decision",
            ),
            # A booking is made once per resource, customer and decision, whatever key asks for
            # it (its times are params: moved, they are the same decision asked otherwise), while
            # it holds its slot (BOOKING_HELD): one rejected, cancelled or failed for good (not by
            # a person's hand) may be asked again, as it always could.
            models.UniqueConstraint(
                "target", "customer", "decision_id",
                condition=Q(action_type=ActionType.CREATE_BOOKING) & ~Q(decision_id="") & BOOKING_HELD,
                name="action_booking_once_per_decision",
            ),
        ]

    def __str__(self):
        return self.operation_key

    @property
    def is_retryable_failure(self):
        return self.status == S.FAILED and bool((self.error or {}).get("retryable"))

    @property
    def is_done_by_hand(self):
        return self.status == S.FAILED and bool((self.error or {}).get("done_by_hand"))

    def _refuse(self, to):
        if self.is_done_by_hand:
            return "a person did it by hand: a retry would do it again"
        if self.status == S.FAILED and not self.is_retryable_failure:
            return "its failure is not retryable"
        return ""

    def _read_back(self, to):
        if to not in SETTLED:
            return {}
        vendor = connections[router.db_for_write(Action)].vendor
        if to == S.SUCCEEDED:
            return {"held_nearby": HELD_NEARBY[vendor], "failure_stored": FAILURE_STORED[vendor]}
        return {"held_nearby": HELD_NEARBY[vendor]}

    def _snapshot(self, changes=()):
        snap = super()._snapshot(changes)
        if "approved_fingerprint" in changes:  # what a person's approval was bound to, in its event
            snap["approved_fingerprint"] = self.approved_fingerprint
        return snap

    def params_fingerprint(self):
        """The fingerprint of the params as they are now (a person approves what they saw)."""
        return request_fingerprint(self.action_type, self.target, self.params, self.customer)

    def has_approval(self):
        """Whether a person let these very params go (approved them, or released them to the queue):
        its print is theirs. Never of params changed since, nor of an action waiting for approval
        (every move there drops the print)."""
        return bool(self.approved_fingerprint) and self.approved_fingerprint == self.params_fingerprint()

    def claim(self, *, owner, locked=False):
        """Take a queued action under a lease; its new fence makes any older claim stale."""
        return self._move(
            S.PENDING, actor="system:executor", verb="claimed", claim=self.fence, locked=locked,
            attempts=lambda row: row.attempts + 1, next_attempt_at=None,
            **_lease(owner), fence=next_fence,
        )

    def claim_for_verification(self, *, owner):
        """Take an unknown action's lease (its status stays) so one worker verifies it."""
        lease = {**_lease(owner), "fence": self.fence + 1}
        claimed = Action.objects.filter(pk=self.pk, status=S.UNKNOWN, fence=self.fence).update(
            updated_at=timezone.now(), **lease
        )
        if claimed != 1:
            raise StaleClaim(f"{self.operation_key}: taken by another worker")
        self.__dict__.update(lease)
        return self

    def verify_later(self, *, not_before, evidence, claim):
        """The unknown action its verification claimed stays unknown, verified again at
        `not_before` (its look was rate limited): the lease let go and `evidence` appended. No
        status moves, so it is written as its claim was (`claim_for_verification`), under the
        claim's fence: a move made meanwhile (a webhook's settle, a person's) took a new fence and
        stands, and this write is refused (StaleClaim), the worker's copy left as it was."""
        changes = {"next_attempt_at": not_before, **_NO_LEASE, "updated_at": timezone.now(),
                   "evidence": [*self.evidence, evidence]}
        row = copy.copy(self)
        row.__dict__.update(changes)
        if not update(row, list(changes), status=S.UNKNOWN, fence=claim):
            raise StaleClaim(f"{self.operation_key}: claim {claim} superseded while it was verified")
        self.__dict__.update(changes)
        return self

    def mark_succeeded(self, *, actor, external_ref, result=None, claim=None, reason="", evidence=None, locked=False):
        changes = {"evidence": lambda row: [*row.evidence, evidence]} if evidence else {}
        return self._move(
            S.SUCCEEDED, actor=actor, verb="succeeded", reason=reason, claim=claim, locked=locked,
            external_ref=external_ref, result=result, error=None, next_attempt_at=None, **_NO_LEASE, **changes,
        )

    def mark_failed(self, *, actor, code, message, retryable, claim=None, reason="", evidence=None, locked=False,
                    retry_after=None):
        """`retry_after`: the seconds a rate-limited provider last asked to be left alone for, kept in
        the error the agent reads; the action's task, retrying it, waits that long first."""
        error = {"code": code, "message": message, "retryable": retryable,
                 **({"retry_after": retry_after} if retry_after is not None else {})}
        changes = {"evidence": lambda row: [*row.evidence, evidence]} if evidence else {}
        return self._move(
            S.FAILED, actor=actor, verb="failed", reason=reason, claim=claim, locked=locked,
            error=error, next_attempt_at=None, **_NO_LEASE, **changes,
        )

    def mark_unknown(self, *, actor, evidence, claim, verify_at, reason=""):
        """The call's outcome cannot be proven. Bumps the fence: the old claim may still be
        out there (a stalled worker), and nothing it writes may land after this."""
        return self._move(
            S.UNKNOWN, actor=actor, verb="outcome_unknown", reason=reason, claim=claim,
            evidence=lambda row: [*row.evidence, evidence], next_attempt_at=verify_at,
            fence=next_fence, **_NO_LEASE,
        )

    def mark_needs_review(self, *, actor, evidence, claim=None, reason=""):
        return self._move(
            S.NEEDS_REVIEW, actor=actor, verb="needs_review", reason=reason, claim=claim,
            evidence=lambda row: [*row.evidence, evidence], next_attempt_at=None, **_NO_LEASE,
        )

    def requeue(self, *, actor, reason, claim=None, not_before=None, evidence=None, attempt_spent=True):
        """A new attempt under the same key: only when the effect provably did not happen.
        `attempt_spent` False: the claim it ends gives its attempt back, as a task's deferred run
        does: it neither called nor learnt anything (its look before the call was rate limited)."""
        changes = {"next_attempt_at": not_before or clock.now(), **_NO_LEASE}
        if not attempt_spent:
            changes["attempts"] = lambda row: row.attempts - 1
        if evidence:
            changes["evidence"] = lambda row: [*row.evidence, evidence]
        return self._move(S.QUEUED, actor=actor, verb="requeued", reason=reason, claim=claim, **changes)

    def ask_approval(self, *, actor, reason, locked=False):
        """A failure for good that a person retries, over its limit now (the customer's total
        moved on while it did not count): a person approves it first, on its params as they are."""
        return self._move(S.AWAITING_APPROVAL, actor=actor, verb="sent_for_approval", reason=reason, locked=locked,
                          approved_fingerprint="", next_attempt_at=None)

    def verify_again(self, *, actor, reason, locked=False):
        """A person asks the executor to look at the provider once more."""
        return self._move(S.UNKNOWN, actor=actor, verb="verify_again", reason=reason, locked=locked,
                          next_attempt_at=clock.now())

    def hold(self, *, actor, reason, approval_stands=True):
        """`approval_stands` False: held as a new request is, without the approval it had (a failure
        for good retried by a person, asked of the limits again: ledger.actions.action_retry)."""
        dropped = {} if approval_stands else {"approved_fingerprint": ""}
        return self._move(S.HELD, actor=actor, verb="held", reason=reason, next_attempt_at=None, **dropped)

    def release(self, *, actor, reason, needs_approval=False, fingerprint="", locked=False):
        """`needs_approval`: to wait for a person's approval, with no print (a later release would
        take one for an approval: ledger.actions.action_release). Else queued; `fingerprint`: of
        the params the person releasing it saw (none when the system releases it): it binds the
        release as an approval binds."""
        if needs_approval:
            return self._move(S.AWAITING_APPROVAL, actor=actor, verb="released", reason=reason, locked=locked,
                              approved_fingerprint="")
        bound = {"approved_fingerprint": fingerprint} if fingerprint else {}
        return self._move(S.QUEUED, actor=actor, verb="released", reason=reason, locked=locked,
                          next_attempt_at=clock.now(), **bound)

    def approve(self, *, actor, reason="", fingerprint="", locked=False):
        """Bound to the params the approver saw (`fingerprint`; without one, the params as
        they are under the lock now): the executor runs it only with those."""
        return self._move(S.QUEUED, actor=actor, verb="approved", reason=reason, locked=locked,
                          next_attempt_at=clock.now(),
                          approved_fingerprint=lambda row: fingerprint or row.params_fingerprint())

    def approval_lapse(self, *, evidence, locked=False):
        """The executor's move for a queued action whose params are not the ones approved
        (changed behind the ledger's back): no call; a person must approve it again."""
        return self._move(S.AWAITING_APPROVAL, actor="system:executor", verb="approval_lapsed", locked=locked,
                          reason="the parameters are not the ones a person approved (they changed after it was "
                                 "approved): a person must approve them again",
                          approved_fingerprint="", next_attempt_at=None,
                          evidence=lambda row: [*row.evidence, evidence])

    def expire(self, *, reason, locked=False):
        """Nobody decided within the approval window: final, and said as such (not rejected)."""
        return self._move(S.EXPIRED, actor="system:approvals", verb="expired", reason=reason, locked=locked,
                          error={"code": APPROVAL_EXPIRED, "message": reason, "retryable": False})

    def supersede(self, *, actor, reason, locked=False):
        """A person edited it down: its new version (ledger.versions) runs in its place."""
        return self._move(S.SUPERSEDED, actor=actor, verb="superseded", reason=reason, locked=locked)

    def reject(self, *, actor, reason, locked=False):
        return self._move(S.REJECTED, actor=actor, verb="rejected", reason=reason, locked=locked)

    def cancel(self, *, actor, reason, locked=False):
        return self._move(S.CANCELLED, actor=actor, verb="cancelled", reason=reason, locked=locked)


def _lease(owner):
    return {"lease_owner": owner, "lease_expires_at": clock.now() + timedelta(seconds=settings.LEASE_SECONDS)}


_NO_LEASE = {"lease_owner": "", "lease_expires_at": None}


# --- Tasks and checkpoints --------------------------------------------------------------------


class TaskState(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    DEAD_LETTERED = "dead_lettered"
    CANCELLED = "cancelled"


class StepStatus(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    SKIPPED = "skipped"


T = TaskState

# The whole state machine of a task. `running -> queued` is a retry after backoff, a lease
# taken back from a lost worker, or a step that must wait for its action's next attempt.
TASK_TRANSITIONS = {
    T.QUEUED: {T.RUNNING, T.CANCELLED, T.DEAD_LETTERED},
    T.RUNNING: {T.QUEUED, T.WAITING, T.SUCCEEDED, T.FAILED, T.DEAD_LETTERED},
    T.WAITING: {T.QUEUED, T.FAILED, T.CANCELLED},
    T.DEAD_LETTERED: {T.QUEUED, T.CANCELLED},
    T.SUCCEEDED: set(),
    T.FAILED: set(),
    T.CANCELLED: set(),
}


class Task(LeasedWork):
    """A multi-step job of an agent; with its steps, the checkpoint a restarted worker resumes from."""

    STATUS_FIELD = "state"
    TRANSITIONS = TASK_TRANSITIONS
    AUDITED = ("attempts", "next_attempt_at")

    task_id = models.CharField(max_length=255, unique=True)
    fingerprint = models.CharField(max_length=64)
    workflow = models.CharField(max_length=100)
    input = models.JSONField()
    agent = models.ForeignKey(Agent, on_delete=models.PROTECT, related_name="tasks")
    state = models.CharField(max_length=20, choices=TaskState.choices, default=TaskState.QUEUED)
    max_attempts = models.PositiveIntegerField()
    last_error = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["state", "next_attempt_at"], name="task_runnable_idx"),
            models.Index(fields=["agent", "-created_at"], name="task_agent_idx"),
            models.Index(fields=["-created_at", "-id"], name="task_recent_idx"),
            # The dead-letter queue filtered by workflow joins its entries to their tasks: without
            # it, every task is read (decision 38). workflow never changes: no HOT update lost.
            models.Index(fields=["workflow"], name="task_workflow_idx"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(state__in=TaskState.values), name="task_state_valid"),
            models.CheckConstraint(condition=Q(attempts__lte=models.F("max_attempts")), name="task_attempts_capped"),
            # As for actions: a queued task without a time, or a running one without a lease, is lost.
            models.CheckConstraint(
                condition=~Q(state=T.QUEUED) | Q(next_attempt_at__isnull=False), name="task_queued_has_time"
            ),
            models.CheckConstraint(
                condition=~Q(state=T.RUNNING) | Q(lease_expires_at__isnull=False), name="task_running_has_lease"
            ),
        ]

    def __str__(self):
        return self.task_id

    def _snapshot(self, changes=()):
        snap = super()._snapshot(changes)
        if snap.get("next_attempt_at"):
            snap["next_attempt_at"] = snap["next_attempt_at"].isoformat()
        return snap

    def claim(self, *, owner, locked=False):
        """A run of the task: one attempt, under a lease that the runner keeps alive."""
        return self._move(
            T.RUNNING, actor="system:runner", verb="claimed", claim=self.fence, locked=locked,
            attempts=lambda row: row.attempts + 1, next_attempt_at=None,
            **_lease(owner), fence=next_fence,
        )

    def defer(self, *, claim, until, reason):
        """Give the run back without spending an attempt: its action is not settled yet."""
        return self._move(
            T.QUEUED, actor="system:runner", verb="deferred", reason=reason, claim=claim,
            attempts=lambda row: row.attempts - 1, next_attempt_at=until, **_NO_LEASE,
        )

    def wait_for_person(self, *, claim, reason):
        return self._move(
            T.WAITING, actor="system:runner", verb="waiting", reason=reason, claim=claim,
            attempts=lambda row: row.attempts - 1, next_attempt_at=None, **_NO_LEASE,
        )

    def wake(self, *, actor, reason):
        return self._move(T.QUEUED, actor=actor, verb="woken", reason=reason, next_attempt_at=clock.now())

    def retry_later(self, *, claim, error, until):
        return self._move(
            T.QUEUED, actor="system:runner", verb="retry_scheduled", reason=error["message"], claim=claim,
            last_error=error, next_attempt_at=until, **_NO_LEASE,
        )

    def mark_succeeded(self, *, claim):
        return self._move(T.SUCCEEDED, actor="system:runner", verb="succeeded", claim=claim, **_NO_LEASE)

    def mark_failed(self, *, actor, error, claim=None):
        return self._move(
            T.FAILED, actor=actor, verb="failed", reason=error["message"], claim=claim, last_error=error,
            next_attempt_at=None, fence=next_fence, **_NO_LEASE,
        )

    def mark_dead_lettered(self, *, actor, error, claim=None):
        """Out of attempts. The dead-letter queue reacts to this move (dlq: its entry and alert)."""
        return self._move(
            T.DEAD_LETTERED, actor=actor, verb="dead_lettered", reason=error["message"], claim=claim,
            last_error=error, next_attempt_at=None, fence=next_fence, **_NO_LEASE,
        )

    def take_back(self, *, reason):
        """The sweeper's move when a worker vanished mid-run (its lease expired)."""
        return self._move(
            T.QUEUED, actor="system:sweeper", verb="lease_expired", reason=reason, claim=self.fence,
            next_attempt_at=clock.now(), fence=next_fence, **_NO_LEASE,
        )

    def redrive(self, *, actor, reason):
        """From the dead-letter queue: a fresh budget of attempts, resuming at the checkpoint."""
        return self._move(
            T.QUEUED, actor=actor, verb="redriven", reason=reason, attempts=0, next_attempt_at=clock.now(),
            fence=next_fence,
        )

    def cancel(self, *, actor, reason):
        return self._move(T.CANCELLED, actor=actor, verb="cancelled", reason=reason, fence=next_fence, **_NO_LEASE)

    def heartbeat(self):
        """Extend the lease; False if the claim was lost (the runner must stop at once)."""
        until = clock.now() + timedelta(seconds=settings.LEASE_SECONDS)
        kept = Task.objects.filter(pk=self.pk, fence=self.fence, state=T.RUNNING).update(lease_expires_at=until)
        if kept:
            self.lease_expires_at = until
        return kept == 1


St = StepStatus

# A step's status, written in its task's transactions (and audited with the task): a failed
# step runs again on the task's next attempt, and may fail again. `running` and `skipped`
# belong to the checkpoint's vocabulary; no workflow sets them yet.
STEP_TRANSITIONS = {
    St.PENDING: {St.RUNNING, St.DONE, St.FAILED, St.SKIPPED},
    St.RUNNING: {St.DONE, St.FAILED},
    St.FAILED: {St.RUNNING, St.DONE, St.FAILED},
    St.DONE: set(),
    St.SKIPPED: set(),
}


class TaskStep(Machine, models.Model):
    # Written in its task's transactions, under the task's lock, and audited with the task.
    TRANSITIONS = STEP_TRANSITIONS
    LOCKING = CONDITIONAL
    AUDITED = ()

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="steps")
    position = models.PositiveSmallIntegerField()
    name = models.CharField(max_length=100)
    status = models.CharField(max_length=20, choices=StepStatus.choices, default=StepStatus.PENDING)
    idempotency_key = models.CharField(max_length=255, blank=True, default="")
    result = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["task", "position"]
        constraints = [
            models.UniqueConstraint(fields=["task", "position"], name="taskstep_unique_position"),
            models.UniqueConstraint(fields=["task", "name"], name="taskstep_unique_name"),
            models.CheckConstraint(condition=Q(status__in=StepStatus.values), name="taskstep_status_valid"),
        ]

    def __str__(self):
        return f"{self.task_id}:{self.name}"

    def mark_done(self, result):
        """Inside the checkpoint's transaction (runner.py), which audits it on the task."""
        self._move(St.DONE, result=result, error=None)

    def mark_failed(self, error):
        self._move(St.FAILED, error=error)


# --- Webhooks -----------------------------------------------------------------------


class Confirmation(models.Model):
    """The refund workflow's local record, written once per key with its step's checkpoint."""

    key = models.CharField(max_length=255, unique=True)
    task = models.ForeignKey(Task, on_delete=models.PROTECT, related_name="confirmations")
    order_id = models.CharField(max_length=255)
    external_ref = models.CharField(max_length=255)
    amount = models.DecimalField(max_digits=18, decimal_places=3)
    currency = models.CharField(max_length=3)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self):
        return self.key


class Booking(Machine, models.Model):
    """The slot a `create_booking` action asks for. On PostgreSQL the database refuses an
    overlapping pending or confirmed booking of the same resource (migration 0008)."""

    class Status(models.TextChoices):
        PENDING = "pending"
        CONFIRMED = "confirmed"
        RELEASED = "released"

    # The slot follows its action (ledger.actions.booking_follow_action): confirmed when the
    # booking happened, released when it never will. Confirmed is final (and its slot: the
    # database's ledger.dbrules.BOOKING_CONFIRMED_FINAL); released is too, but
    # for a booking whose action a person then did by hand (`_refuse`, and the database's
    # ledger.dbrules.BOOKING_RELEASED_FINAL): one that failed for good let its slot go, and the
    # person booked it outside Surety (ledger.actions._book_again). The exclusion constraint
    # leaves released rows out, so it checks the one taken again like a new one.
    TRANSITIONS = {Status.PENDING: {Status.CONFIRMED, Status.RELEASED}, Status.CONFIRMED: set(),
                   Status.RELEASED: {Status.CONFIRMED}}
    # Moved inside its action's move (under the action's lock), and audited with the action.
    LOCKING = CONDITIONAL
    AUDITED = ()

    action = models.OneToOneField(Action, on_delete=models.PROTECT, related_name="booking")
    resource = models.CharField(max_length=255)
    customer = models.CharField(max_length=255)
    start = models.DateTimeField()
    end = models.DateTimeField()
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING)

    class Meta:
        indexes = [models.Index(fields=["resource", "start"], name="booking_resource_idx")]
        constraints = [
            models.CheckConstraint(condition=Q(end__gt=models.F("start")), name="booking_ends_after_start"),
            # The exclusion constraint covers pending and confirmed rows: a stray status
            # would slip a live booking past it.
            models.CheckConstraint(condition=Q(status__in=["pending", "confirmed", "released"]),
                                   name="booking_status_valid"),
        ]

    def __str__(self):
        return f"{self.resource} {self.start:%Y-%m-%d %H:%M}–{self.end:%H:%M} ({self.status})"

    def confirm(self):
        self._move(self.Status.CONFIRMED)

    def release(self):
        self._move(self.Status.RELEASED)

    def _refuse(self, to):
        # Its action as the database holds it: marked done by hand first, in the same transaction
        # (ledger.actions.action_done_by_hand), not as a copy in memory may say.
        if self.status == self.Status.RELEASED and not Action.objects.filter(
                DONE_BY_HAND, pk=self.action_id).exists():
            return "its slot was let go: only a booking a person then did by hand takes it again"
        return ""


def named_operation_key(data):
    """The operation key a provider event's data names in its metadata, or ""."""
    metadata = data.get("metadata") if isinstance(data, dict) else None
    key = metadata.get("operation_key") if isinstance(metadata, dict) else None
    return key if isinstance(key, str) else ""


class WebhookClaim(models.Model):
    """An inbound event's id, claimed once per connector in the transaction that stores the event:
    a redelivery finds the claim and does nothing. Apart from the event because webhook events are
    partitioned by id (ledger.partitions), and a unique key of a partitioned table must hold the
    partition key. It leaves with its event (dlq.archive)."""

    connector = models.CharField(max_length=50)
    event_id = models.CharField(max_length=255)
    received_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["connector", "event_id"], name="webhookclaim_unique_event"),
        ]

    def __str__(self):
        return f"{self.connector}:{self.event_id}"


class WebhookEvent(models.Model):
    """An inbound provider event, stored once by its id (its WebhookClaim)."""

    connector = models.CharField(max_length=50)
    event_id = models.CharField(max_length=255)
    event_type = models.CharField(max_length=100)
    payload = models.JSONField()
    # The key the payload names (named_operation_key, cut to the column), indexed: an action's
    # evidence finds its events by it rather than reading every payload.
    operation_key = models.CharField(max_length=255, blank=True, default="", db_index=True)
    received_at = models.DateTimeField(default=timezone.now)
    outcome = models.CharField(max_length=255, blank=True, default="")

    def __str__(self):
        return f"{self.connector}:{self.event_id}"
