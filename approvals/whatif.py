"""Policy what-if: a changed limit replayed over the last N days of real actions, before it is saved.

For every action of the limit's type and currency requested in the window, the SQL below
finds the verdict `approvals.policies.verdict_for` would have given it, under the current
limit and under the proposed one, and counts them in one statement:

1. the customer's total that day before the action, as `approvals.intake.customer_total_today`
   counts it when the action is requested: a window sum over the same customer's earlier
   actions of the same UTC day (ties in time broken by id), counting what it counts
   (`IN_DAILY_TOTAL`); the actions without a customer share one total, as if they were one
   customer. Only summed when one of the two limits has a daily customer total (the one
   costly part: a sort of the window);
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

A closed day is read from its summary when it has one that is not stale (PostgreSQL,
approvals.summaries, decision 39): there each verdict depends only on whether the amount and
the customer's total after it are above the thresholds, so the day's requests are counted by
the cells the thresholds cut (`_summarised`), and each cell's verdict is `_kind` of it, the
SQL's rule in Python. Today, and a day without a fresh summary, are counted from their rows
as above, one day at a time; `tests/approvals/test_whatif_summaries.py` compares the two.

A type's first limit changes more than its own currency: once it is saved, every other currency
of the type is Uncovered, where until then it ran unlimited. So the preview of a first limit
also counts, over the same days, the type's requests in each other currency (`_left_uncovered`):
every one of them would then wait for a person, or be refused at intake. A later limit leaves
nothing newly uncovered: a limit in a new currency covers it (replayed above, from today's
Uncovered), and the type's other currencies stay as they were.
"""

from collections import Counter
from dataclasses import dataclass
from datetime import UTC, timedelta
from decimal import Decimal

from django.core import signing
from django.db import connection, transaction
from django.db.models import (Case, Count, DecimalField, Exists, F, IntegerField, OuterRef, Q, Subquery, Sum, Value,
                              When, Window)
from django.db.models.functions import Coalesce, TruncDate
from django.db.models.expressions import RowRange
from django.db.models.lookups import GreaterThan
from django.utils import timezone

from ledger.models import Action, ActionStatus

from .intake import IN_DAILY_TOTAL, rule_for, uncovered_refused
from .models import ActionSummary, ReviewItem, ReviewKind, SummaryDay
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
                **{name: None if getattr(self, name) is None else money(getattr(self, name), self.currency)
                   for name in VALUES}}


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


def _kind(limit, amount, total_before):
    """`_verdict`'s rule in Python, for a request (the summaries hold requests only)."""
    if limit is None:
        return RUNS
    if isinstance(limit, Uncovered):
        return REFUSED if limit.refuse else UNCOVERED
    if amount is None:
        return RUNS
    if limit.dual_approval_above is not None and amount > limit.dual_approval_above:
        return TWO_APPROVERS
    if amount > limit.max_amount:
        return ABOVE_MAX
    if limit.daily_customer_total is not None and total_before + amount > limit.daily_customer_total:
        return DAILY_TOTAL
    return RUNS


def daily_total_before(*by):
    """The customer's total that day before the action: see the module's docstring, step 1
    (`by`: more fields the totals are apart by, for a query over several types and currencies)."""
    counted = Case(When(IN_DAILY_TOTAL, then=F("amount")), output_field=DecimalField())
    earlier = Window(Sum(counted), partition_by=[*map(F, by), F("customer"), TruncDate("created_at", tzinfo=UTC)],
                     order_by=[F("created_at").asc(), F("id").asc()], frame=RowRange(start=None, end=-1))
    return Coalesce(earlier, Value(Decimal(0)), output_field=DecimalField())


def replayed(proposal, current, since, until=None):
    """The actions from `since` (to `until`), each annotated with `current` and `proposed`: the
    kind of verdict under each limit (`current` may be None: no limit, everything runs; or
    Uncovered), and `total_before` when a daily customer total is in play. Whole days only, so
    that each customer's total is complete."""
    actions = Action.objects.filter(action_type=proposal.action_type, currency=proposal.currency,
                                    created_at__gte=since).exclude(status=ActionStatus.SHADOW).order_by()
    if until is not None:
        actions = actions.filter(created_at__lt=until)
    total_before = Value(Decimal(0))
    if any(getattr(limit, "daily_customer_total", None) is not None for limit in (current, proposal)):
        actions = actions.annotate(total_before=daily_total_before())
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
    opened an approval item), `examples`, the newest actions whose verdict would change,
    with verdict_for's reasons, and `left_uncovered` (see `_left_uncovered`)."""
    since = window_start(days, now)
    current = rule_for(proposal.action_type, proposal.currency)
    day_starts = [since + timedelta(days=i) for i in range(days)]
    with transaction.atomic():
        _one_large_read()
        by_day = _summarised(proposal, current, [start.date() for start in day_starts[:-1]])
        left_uncovered = _left_uncovered(proposal, current, day_starts, set(by_day))
        for start in day_starts:
            if start.date() not in by_day:
                by_day[start.date()] = _from_rows(proposal, current, start)
        counts = {key: sum(day[key] for day in by_day.values()) for key in _tally([])}
        examples = _changed_newest(proposal, current, day_starts, by_day)
    rows = []
    for key, label in ROWS:
        if key in ONLY_WHEN_SOME and not counts[f"proposed_{key}"] and not counts[f"current_{key}"]:
            continue
        change = counts[f"proposed_{key}"] - counts[f"current_{key}"]
        rows.append({"key": key, "label": label, "current": counts[f"current_{key}"],
                     "proposed": counts[f"proposed_{key}"], "change": f"{change:+,}" if change else "±0"})
    return {"days": days, "since": since, "proposal": proposal, "current": current, "counts": counts, "rows": rows,
            "examples": [_example(action, current, proposal) for action in examples], "left_uncovered": left_uncovered}


def _left_uncovered(proposal, current, day_starts, summarised):
    """None, unless `proposal` is its type's first limit (today's rule in its currency is None: the
    type has no limit at all). Then {"currencies": {currency: requests}, "refused": ...}: the
    window's requests of the type in each other currency, which saving it makes Uncovered, each
    waiting for a person or, `refused`, refused at intake (LIMITS_UNCOVERED_CURRENCY). Only a
    request with an amount counts: without one the verdict is to run, Uncovered or not. The days
    in `summarised` are read from their summaries, the others from their rows."""
    if current is not None:
        return None
    requests = Counter(_others_summarised(proposal, summarised))
    for start in day_starts:
        if start.date() not in summarised:
            requests.update(_others_from_rows(proposal, start))
    return {"currencies": {currency: n for currency, n in sorted(requests.items()) if n},
            "refused": uncovered_refused()}


def _others_from_rows(proposal, start):
    """{currency: requests with an amount} of the proposal's type in its other currencies, on the
    day from `start`: one pass over the day, as `_from_rows` reads it."""
    others = (Action.objects.filter(REQUESTED, action_type=proposal.action_type, amount__isnull=False,
                                    created_at__gte=start, created_at__lt=start + timedelta(days=1))
              .exclude(currency__in=["", proposal.currency]).exclude(status=ActionStatus.SHADOW).order_by())
    return {row["currency"]: row["n"] for row in others.values("currency").annotate(n=Count("id"))}


def _others_summarised(proposal, days):
    """`_others_from_rows` over `days`, from their summaries: per day and currency, its customers'
    first requests are the running count at its largest amount (one index look, as `_summarised`
    reads a cut), and the other requests are summed from their rows."""
    if not days:
        return {}
    of_type = ActionSummary.objects.filter(action_type=proposal.action_type)
    currencies = [currency for currency in _summarised_currencies(proposal.action_type)
                  if currency != proposal.currency]
    looks = {f"n{i}": Coalesce(Subquery(of_type.filter(day=OuterRef("pk"), currency=currency, total_before=0,
                                                       amount__isnull=False).order_by("-amount").values("n_upto")[:1]), 0)
             for i, currency in enumerate(currencies)}
    requests = Counter()
    for row in SummaryDay.objects.filter(day__in=days).annotate(**looks).values(*looks):
        requests.update({currency: row[f"n{i}"] for i, currency in enumerate(currencies)})
    after = (of_type.filter(day__in=days, total_before__gt=0).exclude(currency=proposal.currency)
             .values("currency").annotate(n=Sum("n")))
    requests.update({row["currency"]: row["n"] for row in after})
    return requests


def _summarised_currencies(action_type):
    """The currencies the type's summaries hold, in order: one look each at the first requests'
    index (summary_first_idx), where a DISTINCT would read all of it. Every summarised currency has
    some, a customer's first request of its day."""
    found = []
    firsts = ActionSummary.objects.filter(action_type=action_type, total_before=0).order_by("currency")
    while (currency := firsts.filter(currency__gt=found[-1] if found else "")
           .values_list("currency", flat=True).first()) is not None:
        found.append(currency)
    return found


def _from_rows(proposal, current, start):
    """The counts of the day from `start`, from its actions."""
    opened = replayed(proposal, current, start, start + timedelta(days=1)).annotate(
        asked=Exists(ReviewItem.objects.filter(action=OuterRef("pk"), kind=ReviewKind.APPROVAL)))
    return opened.aggregate(
        actions=Count("id", filter=REQUESTED), **_counts("current"), **_counts("proposed"),
        changed=Count("id", filter=~Q(current=F("proposed"))),
        newly_waiting=Count("id", filter=~Q(current__in=WAITS) & Q(proposed__in=WAITS)),
        no_longer_waiting=Count("id", filter=Q(current__in=WAITS) & ~Q(proposed__in=WAITS)),
        asked_for_approval=Count("id", filter=Q(asked=True) & REQUESTED),
    )


def _tally(cells):
    """`_from_rows`' counts from (current kind, proposed kind, requests, of them asked) cells."""
    counts = {"actions": 0, "changed": 0, "newly_waiting": 0, "no_longer_waiting": 0, "asked_for_approval": 0}
    for kind, limit_kind in (("current", 0), ("proposed", 1)):
        for name, of in (("waiting", WAITS), ("above_max", {ABOVE_MAX}), ("two_approvers", {TWO_APPROVERS}),
                         ("daily_total", {DAILY_TOTAL}), ("uncovered", {UNCOVERED}), ("refused", {REFUSED})):
            counts[f"{kind}_{name}"] = sum(cell[2] for cell in cells if cell[limit_kind] in of)
    for current, proposed, n, asked in cells:
        counts["actions"] += n
        counts["asked_for_approval"] += asked
        counts["changed"] += n if current != proposed else 0
        counts["newly_waiting"] += n if current not in WAITS and proposed in WAITS else 0
        counts["no_longer_waiting"] += n if current in WAITS and proposed not in WAITS else 0
    return counts


def _cuts(limits, names):
    return sorted({getattr(limit, name) for limit in limits for name in names} - {None})


def _cell(cuts, value):
    """A value in each cell the cuts make (`> cut` is true for the cuts below it): its top cut,
    or above the last one."""
    return cuts[value] if value < len(cuts) else (cuts[-1] if cuts else Decimal(0)) + 1


def _cell_of(field, cuts):
    """SQL: the number of the cell `field` is in (0: at most the first cut)."""
    return Case(*(When(**{f"{field}__lte": cut}, then=Value(i)) for i, cut in enumerate(cuts)),
                default=Value(len(cuts)), output_field=IntegerField())


def _summarised(proposal, current, days):
    """{day: counts} for those of `days` whose summary is fresh (PostgreSQL only)."""
    if connection.vendor != "postgresql":
        return {}
    limits = [limit for limit in (current, proposal) if limit is not None and not isinstance(limit, Uncovered)]
    by_amount = _cuts(limits, ("dual_approval_above", "max_amount"))
    by_total = _cuts(limits, ("daily_customer_total",))
    alone = sorted({*by_amount, *by_total})
    of_limit = ActionSummary.objects.filter(action_type=proposal.action_type, currency=proposal.currency)

    def upto(field, cut=None, **where):
        rows = of_limit.filter(day=OuterRef("pk"), total_before=0, **where)
        if cut is not None:
            rows = rows.filter(amount__lte=cut)
        return Coalesce(Subquery(rows.order_by("-amount").values(field)[:1]), 0)

    # A customer's first request of the day (total 0: the total after it is its amount): per
    # cut, the running counts of the day's amounts up to it, one look each.
    looks = {}
    for i, cut in enumerate([*alone, None]):
        where = {} if cut is not None else {"amount__isnull": False}
        looks[f"n{i}"], looks[f"asked{i}"] = upto("n_upto", cut, **where), upto("asked_upto", cut, **where)
    looks["n_none"], looks["asked_none"] = upto("n", amount__isnull=True), upto("asked", amount__isnull=True)
    fresh = SummaryDay.objects.filter(day__in=days, stale=False).annotate(**looks).values("day", *looks)
    cells = {}
    for row in fresh:
        day = cells[row["day"]] = []
        below = below_asked = 0
        for i in range(len(alone) + 1):
            amount = _cell(alone, i)
            day.append((amount, Decimal(0), row[f"n{i}"] - below, row[f"asked{i}"] - below_asked))
            below, below_asked = row[f"n{i}"], row[f"asked{i}"]
        day.append((None, Decimal(0), row["n_none"], row["asked_none"]))
    # The others (a total before them): counted by the cell of their amount and of their total after.
    after = (of_limit.filter(day__in=list(cells), total_before__gt=0)
             .annotate(after=F("total_before") + F("amount"))
             .values("day", a=_cell_of("amount", by_amount), s=_cell_of("after", by_total))
             .annotate(count=Sum("n"), of_them_asked=Sum("asked")))
    for row in after:
        amount = _cell(by_amount, row["a"])
        cells[row["day"]].append((amount, _cell(by_total, row["s"]) - amount, row["count"], row["of_them_asked"]))
    return {day: _tally([(_kind(current, amount, total), _kind(proposal, amount, total), n, asked)
                         for amount, total, n, asked in day_cells])
            for day, day_cells in cells.items()}


def _one_large_read():
    """PostgreSQL, for the rest of the transaction: no JIT (compiling this statement's
    expressions took 3.7 of its 7.8 s at 1M actions, for one run) and room for the window's
    sort in memory (it spilled to disk at the default 4 MB)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL jit = off")
            cursor.execute("SET LOCAL work_mem = '64MB'")


def _changed_newest(proposal, current, day_starts, by_day):
    """The EXAMPLES newest actions whose verdict changes, read from the days that have some,
    newest first, one day at a time: a customer's daily total needs only its own day."""
    found = []
    for start in reversed(day_starts):
        if len(found) == EXAMPLES:
            break
        if by_day[start.date()]["changed"]:
            found += list(replayed(proposal, current, start, start + timedelta(days=1))
                          .exclude(current=F("proposed")).order_by("-created_at", "-id")
                          .only("operation_key", "customer", "amount", "currency", "status", "created_at")
                          [:EXAMPLES - len(found)])
    return found


def _example(action, current, proposal):
    total = getattr(action, "total_before", Decimal(0))
    no_customer = not action.customer
    return {"action": action, "total_before": total,
            "current": verdict_for(current, action.amount, total, no_customer=no_customer),
            "proposed": verdict_for(proposal, action.amount, total, no_customer=no_customer)}


def preview_signed(preview):
    """The preview's figures as the page shows them, signed: the save records what was shown."""
    return signing.dumps({"values": preview["proposal"].values(), "days": preview["days"],
                          "since": preview["since"].isoformat(), "counts": preview["counts"],
                          "left_uncovered": preview["left_uncovered"]}, salt=SIGNING_SALT)


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
            "counts": preview["counts"], "left_uncovered": preview["left_uncovered"], "shown": False}
