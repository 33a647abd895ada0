"""What a connector is, and the permit without which its write method refuses to run.

Only the guarded executor may cause a provider-side effect. `Connector.perform` checks for a
permit naming this very action and claim; `write_permit` is used in `ledger/executor.py`
and nowhere else (tests/ledger/test_connector_guard.py checks the source tree for that).

A connector's write (`perform`) and look-up (`find_effect`) are each held to one deadline,
however many requests they make (Stripe's: the charge, then the refund): `CONNECTOR_TIMEOUT`
from their start, and for a write never past its claim's lease. No byte of their requests is
sent after it (ledger.connectors.http), so the sweeper, which verifies an expired claim only once
the lease's end plus `CONNECTOR_TIMEOUT` has passed, leaves the provider at least that long to
finish what it received.
"""

import contextlib
import contextvars
import functools
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime
from decimal import Decimal
from http import HTTPStatus

from django.conf import settings

from .. import money
from ..metrics import connector_call_observed
from . import http

_permit = contextvars.ContextVar("connector_write_permit", default=None)


class UnguardedWrite(RuntimeError):
    """A connector's write was called outside the guarded executor."""


@dataclass(frozen=True)
class Effect:
    external_ref: str
    result: dict


@dataclass(frozen=True)
class Lookup:
    """What the provider says about an operation key: found True/False, or None if it can't tell.

    `retry_after`: it could not tell because the provider rate-limited the look (its last answer
    was a 429), which says nothing of the effect: the seconds it asked to be left alone for, after
    which the executor asks again. Every connector's look-up says so (`_measured_lookup`)."""

    found: bool | None
    external_ref: str = ""
    result: dict = field(default_factory=dict)
    evidence: dict = field(default_factory=dict)
    retry_after: float | None = None


@dataclass(frozen=True)
class Record:
    """One effect as the provider lists it, for reconciliation with the ledger (read-only).

    `operation_key` is what the effect carries of ours ("" if nothing); `amount` is in the
    currency's major unit, as the ledger keeps it (25.00, not 2500 cents), None where the
    effect has none (a message); `units`, the amount as the provider counts it where it
    counts in integers (Stripe: 2500), which reconciliation compares; `action_type` is the
    ledger's type the effect is of; `raw`, the provider's own answer, is kept as an
    incident's evidence, so it must be JSON; `made` is False for one the provider lists but
    did not carry out (a refund that failed or was canceled at Stripe: no money moved).
    """

    operation_key: str
    external_ref: str
    amount: Decimal | None
    currency: str
    created_at: datetime
    action_type: str = ""
    raw: dict = field(default_factory=dict, compare=False)
    units: int | None = None
    made: bool = True


@contextlib.contextmanager
def write_permit(action):
    token = _permit.set((action.pk, action.fence))
    try:
        yield
    finally:
        _permit.reset(token)


class Connector:
    """A provider for one or more action types, built by the registry with its options."""

    name = ""
    # The option that says where the provider is called (an HTTP base URL), or "" if none.
    base_option = ""
    # Whether `find_effect` can ever answer: the replay set verifies every effect by it, so a
    # connector whose provider cannot be asked (SMTP) cannot pass it, and its grants stay shadow.
    verifiable = True

    def __init__(self, **options):
        self.options = options

    @property
    def base_url(self):
        """Where this connector calls its provider now ("" if not over HTTP)."""
        return self.options.get(self.base_option, "") if self.base_option else ""

    def through(self, base_url):
        """A copy of this connector whose provider calls go to `base_url` (a fault proxy's)."""
        if not self.base_option:
            raise TypeError(f"the {self.name} connector does not call its provider over HTTP")
        return type(self)(**{**self.options, self.base_option: base_url})

    def check(self):
        """What stops this connector from working (missing credentials, a bad URL), as messages."""
        return []

    # Amounts in the provider's own units. The default is the currency's minor units as CLDR
    # counts them (ledger.money); a provider that counts otherwise (Stripe) says so in its own.
    def to_provider_units(self, amount, currency) -> int:
        """The integer the provider takes for `amount` in `currency`; ValueError, saying why,
        for an amount it cannot take."""
        return money.to_minor_units(amount, currency)

    def from_provider_units(self, units, currency) -> Decimal:
        """The amount an integer of the provider's units stands for."""
        return money.from_minor_units(units, currency)

    def amount_problem(self, amount, currency) -> str | None:
        """Why the provider cannot take `amount` in `currency`, for the agent; None if it can.
        Asked at intake, before anything is written (ledger.validation)."""
        try:
            self.to_provider_units(amount, currency)
        except ValueError as exc:
            return str(exc)
        return None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # Every connector's look-ups are measured for /metrics, however it writes them.
        if "find_effect" in vars(cls):
            cls.find_effect = _measured_lookup(vars(cls)["find_effect"])

    def perform(self, action) -> Effect:
        if _permit.get() != (action.pk, action.fence):
            raise UnguardedWrite(f"{self.name}: write for {action.operation_key} outside the guarded executor")
        started = time.perf_counter()
        # The executor starts a write only with CONNECTOR_TIMEOUT and a margin of lease left; a
        # worker that stalled after that look gets what is left of the lease, or nothing at all.
        seconds = settings.CONNECTOR_TIMEOUT
        if action.lease_expires_at is not None:
            seconds = min(seconds, action.lease_left())
        try:
            with http.deadline(seconds):
                effect = self._send(action)
        except Exception as exc:
            _observe_failure(self.name, "perform", started, exc)
            raise
        connector_call_observed(self.name, "perform", started, "ok")
        return effect

    def _send(self, action) -> Effect:
        raise NotImplementedError

    def find_effect(self, action) -> Lookup:
        """Ask the provider whether the action's effect exists. Read-only."""
        return Lookup(found=None, evidence={"reason": f"{self.name} cannot be asked"})

    def find_order(self, order_id) -> dict | None:
        """The order a refund task is about to refund, as the provider keeps it: {"order_id",
        "customer", "amount"} (the amount in the currency's major unit, as text, or None). Read-only;
        raises `http.Rejected` with status 404 for an order the provider does not know, another
        `http.ProviderError` when it cannot tell. None: this provider keeps no orders to read (a
        team's own service), and the task refunds without reading one."""
        return None

    def records(self, since, until) -> Iterable[Record] | None:
        """Every effect the provider committed in [since, until), paged as the provider pages,
        or None if this connector cannot list its records (reconciliation then skips it and
        says so). Read-only; raises `http.ProviderError` if the provider fails midway."""
        return None


_FAILURE_KINDS = ((http.NotSent, "not_sent"), (http.OutcomeUnknown, "outcome_unknown"), (http.Rejected, "rejected"))
_LOOKUP_OUTCOMES = {True: "found", False: "absent", None: "inconclusive"}


def _lookup_outcome(lookup):
    """The `outcome` label of a look-up: a rate-limited one (it could not tell only because the
    provider asked to be left alone) apart from one that could not tell, which a person settles."""
    return "rate_limited" if lookup.found is None and lookup.retry_after is not None else _LOOKUP_OUTCOMES[lookup.found]


# The failure codes /metrics counts by name; any other is counted as "other" (the action's error
# keeps it as it came). A provider names its own code in a refusal's body (http.call, Stripe's
# SDK), so counted as it came, a provider, or anything answering in its place, would decide how
# many series there are. Known: the codes the connectors name themselves (tests/ledger/
# test_metrics.py finds each in their source), HTTP's registered statuses, SMTP's refusals and
# deferrals (from the operator's own mail server), and what the providers the product speaks to
# answer: the sandbox, and Stripe as the sandbox's Stripe wire format does.
COUNTED_CODES = frozenset({
    # the connectors' own
    "provider_error", "rejected", "deadline_passed", "busy", "connect_failed", "timeout", "connection_lost",
    "rate_limited", "unreadable_answer", "bad_answer", "not_authorized", "idempotency_conflict",
    "unsupported_action_type", "amount_not_in_minor_units", "currency_mismatch", "not_a_refund",
    "replayed_refund_unread", "refund_failed", "refund_canceled", "channel_not_supported",
    "smtp_login_refused", "smtp_connect_failed", "smtp_connection_lost",
    *(f"http_{status.value}" for status in HTTPStatus),
    *(f"smtp_{reply}" for reply in range(400, 600)),
    # the sandbox's
    "unauthorized", "method_not_allowed", "invalid", "not_found", "internal_error", "declined", "slot_taken",
    "order_exists", "order_not_found",
    # Stripe's
    "card_declined", "amount_too_large", "charge_already_refunded", "resource_missing", "parameter_missing",
    "parameter_unknown", "parameter_invalid_integer", "parameter_invalid_string", "metadata_key_length_exceeded",
})


def _counted_code(exc):
    """The `code` label of a failed call: a known code as it is, any other "other". An exception
    that is no ProviderError (a connector's bug) is named by its class, which no answer chooses."""
    if not isinstance(exc, http.ProviderError):
        return type(exc).__name__
    return exc.code if isinstance(exc.code, str) and exc.code in COUNTED_CODES else "other"


def _observe_failure(connector, operation, started, exc):
    kind = next((kind for cls, kind in _FAILURE_KINDS if isinstance(exc, cls)), "error")
    connector_call_observed(connector, operation, started, kind, _counted_code(exc))


def _measured_lookup(find_effect):
    @functools.wraps(find_effect)
    def measured(self, action):
        started = time.perf_counter()
        try:
            with http.deadline(), http.rate_limit_watched() as limited:
                lookup = find_effect(self, action)
        except Exception as exc:
            _observe_failure(self.name, "find_effect", started, exc)
            raise
        # Read here, not by each connector from its own error (an http.call's NotSent, an SDK's
        # exception): a look it could not finish for a 429 is told apart however it was written.
        if lookup.found is None and lookup.retry_after is None and limited.retry_after is not None:
            lookup = replace(lookup, retry_after=limited.retry_after)
        connector_call_observed(self.name, "find_effect", started, _lookup_outcome(lookup))
        return lookup

    return measured
