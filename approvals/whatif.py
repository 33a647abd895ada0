"""Policy what-if: a changed limit replayed over the last N days of real actions, before it is saved.

For every action of the limit's type and currency requested in the window, the SQL below
finds the verdict `approvals.policies.verdict_for` would have given it, under the current
limit and under the proposed one, and counts them in one statement:

1. the customer's total that day before the action, as `approvals.intake.customer_total_today`
   counts it when the action is requested: a window sum over the same customer's earlier
   actions of the same UTC day (ties in time broken by id), leaving out what it leaves out
   (`NOT_IN_DAILY_TOTAL`); 0 for an action without a customer. Only summed when one of
   the two limits has a daily customer total (the one costly part: a sort of the window);
2. the verdict, asked in verdict_for's order: above the two-approver threshold, above the
   maximum, above the daily customer total, else it runs. Where the type has limits but the
   currency has none today (`approvals.intake.rule_for`'s `Uncovered`), every request of
   the current rule waits for a person, or is refused when the intake refuses them;
3. conditional counts of both verdicts, of the changes between them, and of the actions that
   actually opened an approval item.

The rule itself is verdict_for's: `tests/approvals/test_whatif_agrees.py` compares this SQL
with verdict_for action by action on a varied data set. Statuses are as they are now: an
action rejected later no longer counts in its customer's total, as it would not today.
The examples' reasons are verdict_for's own words.
"""

from dataclasses import dataclass
from datetime import UTC, timedelta
from decimal import Decimal

from django.core import signing
from django.db import connection, transaction
from django.db.models import (Case, Count, DecimalField, Exists, F, IntegerField, OuterRef, Q, Sum, Value, When,
                              Window)
from django.db.models.functions import Coalesce, TruncDate
from django.db.models.expressions import RowRange
from django.db.models.lookups import GreaterThan
from django.utils import timezone

from ledger.models import Action, ActionStatus

from .intake import NOT_IN_DAILY_TOTAL, rule_for
from .models import ReviewItem, ReviewKind
from .policies import Uncovered, money, verdict_for

DEFAULT_DAYS = 30
MAX_DAYS = 90
EXAMPLES = 10

# The verdict's kinds: 0 runs; the others wait for a person, each for verdict_for's reason,
# but REFUSED, refused at intake.
RUNS, ABOVE_MAX, TWO_APPROVERS, DAILY_TOTAL, UNCOVERED, REFUSED = 0, 1, 2, 3, 4, 5
WAITS = (ABOVE_MAX, TWO_APPROVERS, DAILY_TOTAL, UNCOVERED)
# The preview's rows: what the counts of each limit are of (the last two only when not 0).
ROWS = (("waiting", "waited for a person"), ("two_approvers", "needed two approvers"),
        ("above_max", "needed one approver (above the maximum)"),
        ("daily_total", "been stopped by the customer's daily total"),
        ("uncovered", "needed one approver (no limit in the currency)"),
        ("refused", "been refused at intake (no limit in the currency)"))
ONLY_WHEN_SOME = {"uncovered", "refused"}
VALUES = ("max_amount", "dual_approval_above", "daily_customer_total")
SIGNING_SALT = "approvals.whatif"


@dataclass(frozen=True)
class Proposal:
    """The limit as the form has it; not saved."""

    action_type: str
    currency: str
    max_amount: Decimal
    dual_approval_above: Decimal | None = None
    daily_customer_total: Decimal | None = None

    @classmethod
    def of(cls, data):
        """From a limit form's cleaned data."""
        return cls(data["action_type"], data["currency"], *(data[name] for name in VALUES))

    def values(self):
        """As the audit trail writes amounts ("250.00")."""
        return {"action_type": self.action_type, "currency": self.currency,
                **{name: None if getattr(self, name) is None else money(getattr(self, name)) for name in VALUES}}


def window_start(days, now=None):
    """Midnight (UTC) `days - 1` days ago: today and the days before it, each one whole, so
    that every customer's daily total in the window is complete."""
    now = now or timezone.now()
    return now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=days - 1)


# What an agent asked for. A version a person made by editing a request down (ledger.versions)
# is not a request of its own: it gets no verdict and is not counted (its request is), but
# its amount is in its customer's daily total, as the intake counts it.
REQUESTED = Q(supersedes__isnull=True)


def _verdict(limit, total_before):
    """verdict_for's order as SQL (see the module's docstring): the kind of verdict."""
    if limit is None:
        return Value(RUNS)
    whens = [When(~REQUESTED, then=Value(RUNS))]
    if isinstance(limit, Uncovered):
        return Case(*whens, default=Value(REFUSED if limit.refuse else UNCOVERED), output_field=IntegerField())
    if limit.dual_approval_above is not None:
        whens.append(When(amount__gt=Value(limit.dual_approval_above), then=Value(TWO_APPROVERS)))
    whens.append(When(amount__gt=Value(limit.max_amount), then=Value(ABOVE_MAX)))
    if limit.daily_customer_total is not None:
        whens.append(When(GreaterThan(total_before + F("amount"), Value(limit.daily_customer_total)),
                          then=Value(DAILY_TOTAL)))
    return Case(*whens, default=Value(RUNS), output_field=IntegerField())


def _daily_total_before():
    """The customer's total that day before the action: see the module's docstring, step 1."""
    counted = Case(When(~Q(status__in=NOT_IN_DAILY_TOTAL), then=F("amount")), output_field=DecimalField())
    earlier = Window(Sum(counted), partition_by=[F("customer"), TruncDate("created_at", tzinfo=UTC)],
                     order_by=[F("created_at").asc(), F("id").asc()], frame=RowRange(start=None, end=-1))
    return Case(When(customer="", then=Value(Decimal(0))), default=Coalesce(earlier, Value(Decimal(0))),
                output_field=DecimalField())


def replayed(proposal, current, since):
    """The window's actions, each annotated with `current` and `proposed`: the kind of verdict
    under each limit (`current` may be None: no limit, everything runs; or Uncovered), and
    `total_before` when a daily customer total is in play."""
    actions = Action.objects.filter(action_type=proposal.action_type, currency=proposal.currency,
                                    created_at__gte=since).exclude(status=ActionStatus.SHADOW).order_by()
    total_before = Value(Decimal(0))
    if any(getattr(limit, "daily_customer_total", None) is not None for limit in (current, proposal)):
        actions = actions.annotate(total_before=_daily_total_before())
        total_before = F("total_before")
    return actions.annotate(current=_verdict(current, total_before), proposed=_verdict(proposal, total_before))


def _counts(kind):
    """How many wait for a person, and why, under one of the two limits."""
    return {f"{kind}_waiting": Count("id", filter=Q(**{f"{kind}__in": WAITS})),
            f"{kind}_above_max": Count("id", filter=Q(**{kind: ABOVE_MAX})),
            f"{kind}_two_approvers": Count("id", filter=Q(**{kind: TWO_APPROVERS})),
            f"{kind}_daily_total": Count("id", filter=Q(**{kind: DAILY_TOTAL})),
            f"{kind}_uncovered": Count("id", filter=Q(**{kind: UNCOVERED})),
            f"{kind}_refused": Count("id", filter=Q(**{kind: REFUSED}))}


def whatif(proposal, *, days=DEFAULT_DAYS, now=None):
    """The preview of `proposal` over the last `days` days: a dict of counts (see `_counts`;
    `actions` in the window, `changed`: a different verdict, `newly_waiting` and
    `no_longer_waiting` between the two limits (a refusal does not wait), `asked_for_approval`: those that actually
    opened an approval item) and `examples`, the newest actions whose verdict would change,
    with verdict_for's reasons."""
    since = window_start(days, now)
    current = rule_for(proposal.action_type, proposal.currency)
    with transaction.atomic():
        _one_large_read()
        opened = replayed(proposal, current, since).annotate(
            asked=Exists(ReviewItem.objects.filter(action=OuterRef("pk"), kind=ReviewKind.APPROVAL)))
        counts = opened.aggregate(
            actions=Count("id", filter=REQUESTED), **_counts("current"), **_counts("proposed"),
            changed=Count("id", filter=~Q(current=F("proposed"))),
            newly_waiting=Count("id", filter=~Q(current__in=WAITS) & Q(proposed__in=WAITS)),
            no_longer_waiting=Count("id", filter=Q(current__in=WAITS) & ~Q(proposed__in=WAITS)),
            asked_for_approval=Count("id", filter=Q(asked=True) & REQUESTED),
        )
        examples = _changed_newest(proposal, current, since, now, counts["changed"])
    rows = []
    for key, label in ROWS:
        if key in ONLY_WHEN_SOME and not counts[f"proposed_{key}"] and not counts[f"current_{key}"]:
            continue
        change = counts[f"proposed_{key}"] - counts[f"current_{key}"]
        rows.append({"key": key, "label": label, "current": counts[f"current_{key}"],
                     "proposed": counts[f"proposed_{key}"], "change": f"{change:+,}" if change else "±0"})
    return {"days": days, "since": since, "proposal": proposal, "current": current, "counts": counts, "rows": rows,
            "examples": [_example(action, current, proposal) for action in examples]}


def _one_large_read():
    """PostgreSQL, for the rest of the transaction: no JIT (compiling this statement's
    expressions took 3.7 of its 7.8 s at 1M actions, for one run) and room for the window's
    sort in memory (it spilled to disk at the default 4 MB)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL jit = off")
            cursor.execute("SET LOCAL work_mem = '64MB'")


def _changed_newest(proposal, current, since, now, changed):
    """The EXAMPLES newest actions whose verdict changes. A customer's daily total needs only
    its own day, so the last day alone, then the last week, give exact verdicts: most often
    the examples are there, and the whole window is not sorted a second time."""
    if not changed:
        return []
    found = []
    for days in (1, 7, None):
        start = max(since, window_start(days, now)) if days else since
        found = list(replayed(proposal, current, start).exclude(current=F("proposed"))
                     .order_by("-created_at", "-id")
                     .only("operation_key", "customer", "amount", "currency", "status", "created_at")[:EXAMPLES])
        if len(found) == min(EXAMPLES, changed) or start == since:
            return found
    return found


def _example(action, current, proposal):
    total = getattr(action, "total_before", Decimal(0))
    return {"action": action, "total_before": total,
            "current": verdict_for(current, action.amount, total), "proposed": verdict_for(proposal, action.amount, total)}


def preview_signed(preview):
    """The preview's figures as the page shows them, signed: the save records what was shown."""
    return signing.dumps({"values": preview["proposal"].values(), "days": preview["days"],
                          "since": preview["since"].isoformat(), "counts": preview["counts"]}, salt=SIGNING_SALT)


def preview_for_audit(signed, proposal, *, max_age=3600):
    """What the limit change's audit event records: the preview shown for exactly these
    values (signed by the page, at most `max_age` seconds old), or, when none was shown or
    the values changed after it, the preview over the default window computed now."""
    try:
        shown = signing.loads(signed or "", salt=SIGNING_SALT, max_age=max_age)
    except signing.BadSignature:
        shown = None
    if shown is not None and shown["values"] == proposal.values():
        return {**shown, "shown": True}
    preview = whatif(proposal)
    return {"values": proposal.values(), "days": preview["days"], "since": preview["since"].isoformat(),
            "counts": preview["counts"], "shown": False}
