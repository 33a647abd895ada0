"""Reconciliation: the ledger against each connector's own records of what it did.

`reconcile(window)`, for each connector that can list its records (one that cannot is
skipped, and the report says so):
1. read the provider's records created in the window, page by page as the provider pages;
2. per chunk of CHUNK records, one query reads the ledger rows of their operation keys, and
   the two are joined in memory by key: nothing is asked per action;
3. a record whose key has no ledger row is an orphan effect; a key with more than one record
   in the window, or a record other than the one its succeeded ledger row names, a double
   effect; a record whose amount or currency differs from its ledger row, an amount mismatch.
   Amounts are compared in the provider's own units where it counts in integers: the ledger's
   amount converted by the connector's rule (Stripe's 500000 for 5000 HUF), so that an effect
   a hundredth or a hundred times the ledger's is found, whatever the currency's CLDR digits;
   a record whose ledger row says no effect was made (failed, rejected, cancelled, expired,
   shadow, superseded), a denied effect: the ledger's word is what a person acts on (a failed
   one in the dead-letter queue retried against a provider that has forgotten the key would make
   the effect a second time, so its entry is not redriven once such an incident names its key:
   dlq.models.DeadLetter.redrive_refusal). An effect the provider lists as not carried out (a
   refund that failed at Stripe: `Record.made`) is none of these, unless it is the very effect a
   succeeded ledger row names: a failed effect (the provider failed it after it succeeded, and
   no money may have moved). A listing reads records by when they were made, so it finds a failure
   only if it happened before their window was read: so runs also read the LATE_FAILURES before
   their window again for such failures alone (`late_span`: a scheduled run a part of it, so that
   the schedule reads it all once per RECONCILE_LATE_FAILURES_INTERVAL_SECONDS). The provider's
   webhook tells one first, and opens the same incident (`incident_open_for_failed_effect`), once;
4. each finding opens its incident, with an alert, unless it already has one: running the
   same window again opens nothing new, and an effect made after its incident was resolved opens
   one of its own.

Memory grows by one record, without the provider's raw answer, per operation key seen in the
window (a double's first record may be many pages before its second), and by one reference per
record (a listing names each effect once: one named again is paging that does not advance, which
would list for ever, and fails the connector's part); the raw answer is kept only for the records
that are findings when they are read (orphans and mismatches).

The schedule (`reconcile_schedule`, a sweeper step) starts a run every RECONCILE_INTERVAL_SECONDS
over the time since the last complete run, less RECONCILE_OVERLAP_SECONDS (a provider's record
may become visible a little after its creation time), at most RECONCILE_LOOKBACK_SECONDS back. A run
by hand (`manage.py reconcile`) reads any window that starts within the operation key's lifetime
(`earliest_since`): before it, what people resolved may be archived, and would be found again; it
reads the whole LATE_FAILURES before its window again, as every run once did (decision 66).
"""

import logging
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from itertools import chain, islice

from django.conf import settings
from django.db import DatabaseError, IntegrityError, transaction
from django.utils import timezone

from ledger import money
from ledger.connectors import connector_for, http
from ledger.jobs import enqueue
from ledger.models import SETTLED, Action, ActionStatus, ActionType
from ledger.retention import key_lifetime, rfc3339

from .incidents import Incident, IncidentKind, ReconciliationRun

logger = logging.getLogger("surety.reconcile")
ACTOR = "system:reconcile"
# Records joined with the ledger per query: one IN list of this many keys.
CHUNK = 1000
LEDGER_FIELDS = ("pk", "operation_key", "action_type", "status", "amount", "currency", "external_ref")
# The statuses in which the ledger says the action's effect was never made. (In flight, or a
# person's to review, it may yet be found: not a finding.)
NO_EFFECT = (SETTLED - {ActionStatus.SUCCEEDED}) | {ActionStatus.SHADOW, ActionStatus.SUPERSEDED}
# How far back before their windows runs also read the provider's records for failures alone
# (`late_span`): a refund Stripe fails later (a card account closed) is failed within days of it.
# The schedule pages through this much of the provider's listing again once per
# RECONCILE_LATE_FAILURES_INTERVAL_SECONDS, a part in each run; a run by hand, all of it.
LATE_FAILURES = timedelta(days=30)


@dataclass(frozen=True)
class Window:
    """[since, until): the records created in it are compared with the ledger."""

    since: datetime
    until: datetime

    def __post_init__(self):
        if timezone.is_naive(self.since) or timezone.is_naive(self.until):
            raise ValueError("a reconciliation window needs time-zone-aware times")
        if self.since >= self.until:
            raise ValueError("a reconciliation window must end after it starts")


@dataclass
class Finding:
    kind: str
    connector: str
    action_type: str
    operation_key: str
    subject: str
    effects: list = field(default_factory=list)
    ledger: dict | None = None

    def __post_init__(self):
        # A provider may carry a longer key than any the ledger holds (255): such an effect is
        # an orphan, filed under the key's first 255 characters.
        self.operation_key, self.subject = self.operation_key[:255], self.subject[:255]

    @property
    def external_refs(self):
        return [effect["external_ref"] for effect in self.effects]

    @property
    def evidence(self):
        return {"effects": self.effects, "ledger": self.ledger}

    @property
    def summary(self):
        what = self.operation_key or f"{self.external_refs[0]} (no operation key)"
        effects = "an effect" if len(self.effects) == 1 else f"{len(self.effects)} effects"
        if self.kind == IncidentKind.ORPHAN_EFFECT:
            return f"{what}: {effects} at {self.connector} and no ledger entry"
        if self.kind == IncidentKind.DENIED_EFFECT:
            return f"{what}: {effects} at {self.connector}, and the ledger says {self.ledger['status']}"
        if self.kind == IncidentKind.FAILED_EFFECT:
            lost = "no money may have moved" if self.action_type == ActionType.REFUND else "it may not have happened"
            return f"{what}: {self.connector} failed {self.external_refs[0]}, which the ledger says succeeded: {lost}"
        if self.kind == IncidentKind.DOUBLE_EFFECT:
            refs = {*self.external_refs, self.ledger["external_ref"]} - {""}
            return f"{what}: {len(refs)} effects at {self.connector} for one ledger entry"
        effect = self.effects[0]
        return f"{what}: {self.connector} has {_written(effect['amount'], effect['currency'])} {effect['currency']}, " \
               f"the ledger {_written(self.ledger['amount'], self.ledger['currency'])} {self.ledger['currency']}"


def _written(amount, currency):
    """`amount` as its currency writes it, as every page does (the ledger's column keeps three
    decimals: "500.000" JPY is 500); one with more decimals than its currency has (a provider's
    25.005 EUR) as it is: rounded, it could read as the amount it differs from."""
    return money.canonical({"amount": amount, "currency": currency})["amount"]


def _effect(record, *, raw=False):
    effect = {"external_ref": record.external_ref, "amount": None if record.amount is None else str(record.amount),
              "currency": record.currency, "created_at": record.created_at.isoformat()}
    if record.units is not None:
        effect["units"] = record.units
    return {**effect, "raw": record.raw} if raw else effect


def _ledger(row):
    return {"action_id": row["pk"], "status": row["status"], "external_ref": row["external_ref"],
            "amount": None if row["amount"] is None else str(row["amount"]), "currency": row["currency"]}


def _differs(connector, record, row):
    if row["amount"] is None:
        return False  # an effect without an amount (a message): nothing to compare
    if record.amount is None or record.currency != row["currency"]:
        return True
    if record.units is None:  # a provider that counts in decimals
        return record.amount != row["amount"]
    try:
        return record.units != connector.to_provider_units(row["amount"], row["currency"])
    except ValueError:  # an amount the provider cannot take: whatever it made, not the ledger's
        return True


def _chunks(records, size):
    records = iter(records)
    while chunk := list(islice(records, size)):
        yield chunk


def findings_in(connector, records):
    """Steps 2-3 for one connector's records; returns (records read, findings)."""
    name = connector.name
    orphans, mismatches, doubles, denied, failed = {}, {}, {}, {}, {}
    first_seen = {}  # operation key -> its first record in the window
    listed = set()  # (action type, reference) of every record read
    read = 0
    for chunk in _chunks(records, CHUNK):
        read += len(chunk)
        keys = {record.operation_key for record in chunk if record.operation_key}
        rows = {row["operation_key"]: row
                for row in Action.objects.filter(operation_key__in=keys).order_by().values(*LEDGER_FIELDS)}
        for record in chunk:
            if (record.action_type, record.external_ref) in listed:
                # The same effect listed again is no second effect: the provider's paging did not
                # advance (a proxy that drops the cursor answers one page, "more", for ever).
                raise http.ProviderError(f"the listing named {record.external_ref} twice: its paging does not "
                                         "advance", code="listing_repeats")
            listed.add((record.action_type, record.external_ref))
            key, row = record.operation_key, rows.get(record.operation_key)
            if not record.made:
                # Not carried out: no effect, unless it is the very one a succeeded row names (the
                # provider failed it after it succeeded, and the ledger says it was made).
                if row is not None and row["status"] == ActionStatus.SUCCEEDED and row["external_ref"] == \
                        record.external_ref:
                    failed.setdefault(key, Finding(IncidentKind.FAILED_EFFECT, name, row["action_type"], key, key,
                                                   ledger=_ledger(row))).effects.append(_effect(record, raw=True))
                continue
            if row is None:
                subject = key or record.external_ref
                orphans.setdefault(subject, Finding(IncidentKind.ORPHAN_EFFECT, name, record.action_type, key,
                                                    subject)).effects.append(_effect(record, raw=True))
                continue
            if row["status"] in NO_EFFECT:
                denied.setdefault(key, Finding(IncidentKind.DENIED_EFFECT, name, row["action_type"], key, key,
                                               ledger=_ledger(row))).effects.append(_effect(record, raw=True))
                continue
            if _differs(connector, record, row):
                mismatches.setdefault(key, Finding(IncidentKind.AMOUNT_MISMATCH, name, row["action_type"], key, key,
                                                   ledger=_ledger(row))).effects.append(_effect(record, raw=True))
            first = first_seen.get(key)
            if first is None:
                first_seen[key] = replace(record, raw={})  # what a double's evidence needs, no more
            names_another = row["status"] == ActionStatus.SUCCEEDED and row["external_ref"] != record.external_ref
            if first is not None or names_another:
                double = doubles.setdefault(key, Finding(IncidentKind.DOUBLE_EFFECT, name, row["action_type"], key,
                                                         key, ledger=_ledger(row)))
                for seen in (first, record):
                    if seen is not None and seen.external_ref not in double.external_refs:
                        double.effects.append(_effect(seen))
    return read, [*orphans.values(), *doubles.values(), *mismatches.values(), *denied.values(), *failed.values()]


def incident_open_for_failed_effect(action, *, connector, external_ref, evidence, actor):
    """The ledger's seam (hooks.set_effect_failed): a webhook says the provider failed `external_ref`,
    the effect the succeeded `action` names (or said so before the action succeeded with it). Its incident and alert, as reconciliation opens for the
    same finding (once while open)."""
    row = {"pk": action.pk, "status": action.status, "external_ref": action.external_ref, "amount": action.amount,
           "currency": action.currency}
    Incident.objects.open_for(Finding(IncidentKind.FAILED_EFFECT, connector, action.action_type, action.operation_key,
                                      action.operation_key, effects=[{
        "external_ref": external_ref, "amount": None, "currency": "", "created_at": None, "raw": evidence}],
                                      ledger=_ledger(row)), actor=actor)


def _connectors():
    """{name: connector} of the registry, once per name: a connector serving several action
    types lists its records once. (A registry entry that cannot be built stops every start:
    the system check surety.E002.)"""
    found = {}
    for action_type in settings.SURETY_CONNECTORS:
        connector = connector_for(action_type)
        found.setdefault(connector.name, connector)
    return found


def _open(findings):
    """Step 4: an incident per finding that has none (one query finds those that do); (opened,
    effects added). A finding has one while an incident of its kind about its subject is open, or
    when the incidents about it, resolved, named every effect it names: a window read again opens
    nothing. An effect none of them named (a third refund of one order) is added to the open one,
    or opens an incident of its own once they are all resolved: which of the two is decided per
    finding under its lock (Incident.objects.naming), as people resolve and concurrent runs open
    incidents while this one goes through its findings."""
    if not findings:
        return 0, 0
    named = {}
    for connector, kind, subject, refs in Incident.objects.filter(
            subject__in={f.subject for f in findings}).values_list("connector", "kind", "subject", "external_refs"):
        named.setdefault((connector, kind, subject), set()).update(refs)
    opened = added = 0
    for finding in findings:
        found = set(finding.external_refs)
        if finding.kind == IncidentKind.DOUBLE_EFFECT:
            # The ledger's own effect is among a double's records when the window reaches back to it:
            # no finding of its own, whether an earlier, narrower window named it or not.
            found.discard(finding.ledger["external_ref"])
        new = found - named.get((finding.connector, finding.kind, finding.subject), set())
        if new:
            _, was_opened, effects_added = Incident.objects.naming(finding, new, actor=ACTOR)
            opened, added = opened + was_opened, added + effects_added
    return opened, added


def late_span(window, resume=None, part=None):
    """The records made before `window` that a run reads again for failures alone (`_failed_in`):
    the LATE_FAILURES before it, from `resume` if that is within them, at most `part` of them; None
    when the window itself reaches back that far. (The two spans share no record: the listing reads
    [since, until), and Stripe's cuts both ends to the second.)"""
    earliest = window.until - LATE_FAILURES
    if earliest >= window.since:
        return None
    start = resume if resume is not None and earliest <= resume < window.since else earliest
    return Window(start, window.since if part is None else min(start + part, window.since))


def _failed_in(connector, span):
    """The records made in `span` that the provider lists as not carried out: a refund answered
    `pending` or `succeeded`, read as made when its own window was read, that the provider failed
    since. Its webhook tells it first; if that was lost (an endpoint down past the provider's
    retries, a wrong secret), this is what does. The rest of those records were compared when their
    own window was read."""
    if span is None:
        return
    for record in connector.records(span.since, span.until):
        if not record.made:
            yield record


def reconcile(window, late=None):
    """Compare every connector's records in `window` with the ledger, and look among its records in
    `late` (a Window before it, `late_span`) for effects failed since; returns the report: per
    connector, records read and incidents opened, or why it was skipped or failed."""
    report = {}
    for name, connector in _connectors().items():
        records = connector.records(window.since, window.until)
        if records is None:
            logger.info("reconciliation skips %s: it cannot list its records", name)
            report[name] = {"skipped": "this connector cannot list its records"}
            continue
        try:
            read, findings = findings_in(connector, chain(records, _failed_in(connector, late)))
        except http.ProviderError as exc:
            logger.warning("reconciliation of %s failed: %s", name, exc)
            report[name] = {"failed": str(exc)}
            continue
        except DatabaseError:
            raise  # the ledger's, not the provider's
        except Exception as exc:
            # A 2xx answer of a shape the connector did not expect (Stripe's SDK reads one that is
            # no list with Python's own errors), or a bug in it: its part fails, as a provider's
            # error does, and the other connectors are still read.
            logger.exception("reconciliation of %s failed unexpectedly", name)
            report[name] = {"failed": f"its listing could not be read ({type(exc).__name__}: {exc})"}
            continue
        opened, added = _open(findings)
        report[name] = {"records": read, "findings": len(findings), "opened": opened, "added": added}
    return report


# --- The schedule ------------------------------------------------------------------------------


def reconcile_schedule(now=None):
    """The sweeper's step: start the run of the current slot if none has started; returns how
    many runs it started (0 or 1). Slots are RECONCILE_INTERVAL_SECONDS apart, each run is
    a row with its slot's end as a unique `until`, so of two sweepers only one starts it.
    An interval of 0 switches the schedule off (`manage.py reconcile` still runs one)."""
    interval = settings.RECONCILE_INTERVAL_SECONDS
    if interval <= 0:
        return 0
    now = now or timezone.now()
    until = datetime.fromtimestamp(now.timestamp() // interval * interval, tz=now.tzinfo)
    if ReconciliationRun.objects.filter(scheduled=True, until__gte=until).exists():
        return 0
    try:
        with transaction.atomic():
            run = run_start(until)
    except IntegrityError:
        return 0  # another sweeper started this slot's run
    transaction.on_commit(lambda: enqueue(run_finish, run.pk), robust=True)
    return 1


def run_start(until, since=None):
    """The run row for the window ending at `until`: from `since` (a run by hand, no earlier than
    `earliest_since`, reading all of its `late_span` again), or the schedule's, from where its last
    complete run ended, less the overlap, at most the lookback before `until`, reading the next part
    of its late span (`_late_part`)."""
    if since is not None:
        window = Window(since, until)
        earliest = earliest_since()
        if window.since < earliest:
            raise ValueError(f"a window may start no earlier than {rfc3339(earliest)}, OPERATION_KEY_LIFETIME_DAYS "
                             f"({settings.OPERATION_KEY_LIFETIME_DAYS} days) ago: the ledger's actions, and the "
                             "incidents people resolved, may be archived before then, and an effect they answered "
                             "for would be reported again as an effect without a ledger entry")
        return _run_row(window, late_span(window), scheduled=False)
    earliest = until - timedelta(seconds=settings.RECONCILE_LOOKBACK_SECONDS)
    last = ReconciliationRun.objects.filter(scheduled=True, complete=True).order_by("-until").first()
    overlap = timedelta(seconds=settings.RECONCILE_OVERLAP_SECONDS)
    window = Window(max(earliest, last.until - overlap) if last else earliest, until)
    # The round goes on from the last finished run's part, complete or not: a connector whose listing
    # failed misses that part until the next round (decision 66), where waiting for a complete run
    # held every connector's round on one provider that stayed down. A run whose job never finished
    # read nothing for sure: its part is read again. A round ends with the part that reached its
    # run's window; the next starts from the oldest records again.
    read = ReconciliationRun.objects.filter(scheduled=True, finished_at__isnull=False).order_by("-until").first()
    resume = read.late_until if read and read.late_until and read.late_until < read.since else None
    return _run_row(window, late_span(window, resume, _late_part()))


def _late_part():
    """How much of its late span a scheduled run reads: in one RECONCILE_LATE_FAILURES_INTERVAL_SECONDS
    the schedule's runs read the LATE_FAILURES and what its end moved by meanwhile, so every record
    in it is read again at least once per interval (and one run, rounding up), a part in each run,
    not all of it in every run nor all of it in one (decision 66). An interval no longer than a
    run's makes each run read all of it."""
    runs_per_interval = settings.RECONCILE_LATE_FAILURES_INTERVAL_SECONDS / settings.RECONCILE_INTERVAL_SECONDS
    return (LATE_FAILURES + timedelta(seconds=settings.RECONCILE_LATE_FAILURES_INTERVAL_SECONDS)) / runs_per_interval


def _run_row(window, late, *, scheduled=True):
    late_since, late_until = (late.since, late.until) if late else (None, None)
    return ReconciliationRun.objects.create(since=window.since, until=window.until, scheduled=scheduled,
                                            late_since=late_since, late_until=late_until)


def earliest_since():
    """How far back a window may start: the key's lifetime. An action is archived once its lifetime
    has passed, and a resolved incident with it or after it (DEAD_LETTER_RETENTION_DAYS after its
    resolution, never shorter than the lifetime: config.settings); read again without them, an effect
    people resolved would be a new finding, its alert raised again. Within the lifetime the incidents
    resolved about its effects are kept, and answer for them (`_open`), and so are the actions recorded
    in it (decision 65). (The schedule reads back at most RECONCILE_LOOKBACK_SECONDS, a day by default.)"""
    return timezone.now() - key_lifetime()


def run_finish(run_id):
    """The job: reconcile the run's window and record what it found."""
    run = ReconciliationRun.objects.get(pk=run_id)
    if run.finished_at is not None:
        return run
    late = Window(run.late_since, run.late_until) if run.late_since else None
    report = reconcile(Window(run.since, run.until), late)
    run.report, run.finished_at = report, timezone.now()
    run.complete = not any("failed" in part for part in report.values())
    run.save(update_fields=["report", "finished_at", "complete"])
    return run
