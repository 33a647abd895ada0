"""Limits applied to the ledger: what the intake and the executor ask of the policies.

This module is the ledger's policy (`ledger.hooks.set_policy`, in ApprovalsConfig.ready):
`version_expression`, `verdict_for_request`, `verdict_for_action` and `needs_person_after_verification`.
"""

from decimal import Decimal

from django.conf import settings
from django.db.models import Q, Subquery, Sum
from django.utils import timezone

from ledger.compiled import Compiled, register_cache
from ledger.hooks import Verdict
from ledger.locks import NO_CUSTOMER_TOTAL, take_turns
from ledger.models import DONE_BY_HAND, Action, ActionStatus, money_in_params

from .models import Limit, LimitsVersion
from .policies import RUN, Uncovered, money, verdict_for


# The intake's question for a request without a known version (a workflow step's action):
# SELECT ... FROM approvals_limit WHERE action_type = %s AND currency = %s
_limit = Compiled(lambda action_type, currency: Limit.objects.filter(action_type=action_type, currency=currency),
                  name="approvals.intake: the limit of a type and currency")

# This process's copy of every limit, and the LimitsVersion it was read at (or after): a new
# key costs a statement less (decision 08).
_copy = (None, {})


def _forget_limits():
    global _copy
    _copy = (None, {})


register_cache("approvals.intake._copy", holds="every limit, as of a limits version", clear=_forget_limits,
               stale_when="the limits' version differs from the one the request read (every change bumps it)")


def _limits(version):
    """{(action_type, currency): limit}, from this process's copy while it is of `version`."""
    global _copy
    seen, limits = _copy  # one read: another thread may replace the pair meanwhile
    if seen != version:
        # Read after the version: at least as new as it, so never older than the copy claims.
        limits = {(limit.action_type, limit.currency): limit for limit in Limit.objects.all()}
        _copy = (version, limits)
    return limits


def limit_for(action_type, currency, version=None):
    """The limit of this action type and currency, or None. With the limits' `version` as a
    request read it (see ledger.models.Agent.for_token), from this process's copy while it
    is of that version: the limits are few, and change far less often than requests come."""
    if not currency:
        return None
    if version is None:
        return _limit.first(action_type, currency)
    return _limits(version).get((action_type, currency))


def uncovered_refused():
    """LIMITS_UNCOVERED_CURRENCY: "refuse" refuses a new request no limit of its type covers."""
    return settings.LIMITS_UNCOVERED_CURRENCY == "refuse"


def rule_for(action_type, currency, version=None, *, at_intake=True):
    """What the policy applies to an amount of this type and currency: its limit; where the
    type has limits in other currencies only, `Uncovered` (it fails closed: a person
    approves, or at intake the request is refused when the setting says so); None where
    the type has no limit at all (unlimited by design). The one place that decides it, for
    the intake, the what-if and every later look at a recorded action (`at_intake` False:
    never refused, it waits for a person)."""
    limit = limit_for(action_type, currency, version)
    if limit is not None or not currency:
        return limit
    limits = Limit.objects.filter(action_type=action_type) if version is None else _limits(version).values()
    covered = covered_currencies(limits).get(action_type)
    if not covered:
        return None
    return Uncovered(action_type, currency, covered, refuse=at_intake and uncovered_refused())


def covered_currencies(limits):
    """{action_type: its limits' currencies, sorted} over `limits`: a type that is not in it
    has no limit at all and runs unlimited; the others' other currencies are Uncovered."""
    covered = {}
    for limit in limits:
        covered.setdefault(limit.action_type, set()).add(limit.currency)
    return {action_type: tuple(sorted(codes)) for action_type, codes in covered.items()}


def verdict_for_request(*, action_type, amount, currency, customer, recorded=None, limits_version=None,
                        lock_subjects=None):
    """The limits' verdict on a request; `recorded`: the action itself when it is already in
    the ledger (a held action being released), whose own amount is not yet part of the total;
    `lock_subjects`: called before the customer's daily total is summed.

    A request that names no customer counts in the total of those that name none, as one
    customer's would (decision 30): leaving the customer out does not escape the total."""
    limit = rule_for(action_type, currency, limits_version, at_intake=recorded is None)
    if limit is None or amount is None:
        return RUN
    total_today = Decimal(0)
    if getattr(limit, "daily_customer_total", None) is not None:
        if lock_subjects:
            lock_subjects()
            if not customer:  # no customer's lock among the subjects': these take turns on one of their own
                take_turns(NO_CUSTOMER_TOTAL)
        total_today = customer_total_today(action_type, currency, customer, excluding=recorded)
    return verdict_for(limit, amount, total_today, no_customer=not customer)


# What a customer's daily total counts (the what-if's window sums count the same): every action
# but those that will not move money: rejected, cancelled, failed for good, expired, only shadow,
# or superseded by a version (which counts instead). A failure that may be retried counts: its
# retry runs on the verdict it was recorded under (ledger.actions.action_retry), and left out, a
# refund asked for the customer meanwhile passed the total, then both ran. So does one a person did
# by hand (DONE_BY_HAND): failed for good in the ledger, its money moved all the same.
IN_DAILY_TOTAL = ~Q(status__in=[ActionStatus.REJECTED, ActionStatus.CANCELLED, ActionStatus.FAILED,
                                ActionStatus.SHADOW, ActionStatus.EXPIRED, ActionStatus.SUPERSEDED]) | Q(
    status=ActionStatus.FAILED, error__retryable=True) | DONE_BY_HAND


def customer_total_today(action_type, currency, customer, excluding=None):
    """The customer's total today for an action type and currency, as the limits count it
    (`IN_DAILY_TOTAL`); without the action `excluding`. `customer` "": the total of the
    actions that name none."""
    start_of_day = timezone.now().replace(hour=0, minute=0, second=0, microsecond=0)
    today = Action.objects.filter(
        IN_DAILY_TOTAL, action_type=action_type, currency=currency, customer=customer, created_at__gte=start_of_day)
    if excluding is not None:
        today = today.exclude(pk=excluding.pk)
    return today.aggregate(total=Sum("amount"))["total"] or Decimal(0)


def verdict_for_action(action):
    """The verdict on an action already recorded, as if it were requested now, on what the
    provider would be sent: the amount and currency in its params, read as the intake reads
    them. They differ from the columns the intake wrote only when the params were changed
    behind the ledger's back (a raw UPDATE, a bug); then the columns understate what would be
    sent. Params not readable as money, or in another currency than recorded (which may have
    no limit at all), get the strictest review instead."""
    try:
        amount, currency = money_in_params(action.params)
    except (ArithmeticError, AttributeError, TypeError, ValueError):
        currency = None
    if currency != action.currency:
        return Verdict(2, "its params are not an amount in the currency recorded: two approvers")
    return verdict_for_request(action_type=action.action_type, amount=amount, currency=currency,
                               customer=action.customer, recorded=action)


def needs_person_after_verification(action):
    """Over its limit, or with no limit covering its currency, an unknown outcome goes to a
    person even when the provider was sure."""
    limit = rule_for(action.action_type, action.currency, at_intake=False)
    if limit is None or action.amount is None:
        return ""
    if isinstance(limit, Uncovered):
        return f"verified, but {limit.why()}"
    if action.amount <= limit.max_amount:
        return ""
    return (f"verified, but {money(action.amount, action.currency)} {action.currency} is above the limit of "
            f"{money(limit.max_amount, action.currency)}")


def version_expression():
    """The limits' version as SQL, for the statement that authenticates an API request."""
    return Subquery(LimitsVersion.objects.order_by().values("version")[:1])
