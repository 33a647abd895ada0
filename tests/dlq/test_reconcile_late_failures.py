"""A refund Stripe fails days after the ledger recorded it made, whose webhook never came (an endpoint
down past Stripe's retries, a wrong secret): a run by hand, whatever its window, reads the provider's
listing back far enough to find it, and opens the failed-effect incident of decision 60, once, also
when the webhook arrives after all. A refund still `pending` is no finding. The schedule reads those
30 days again once a day, a part in each run (decision 66): a day of scheduled runs reads each
earlier refund once, not in every run; a failure is found within the day and a run; a run that
failed leaves its part to the next. The provider is the sandbox's Stripe wire format over HTTP, read
by the Stripe connector, each of its listing requests counted as sent."""

import json
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from io import StringIO
from urllib.parse import parse_qs, urlsplit

import pytest
from django.core.management import call_command
from django.db import IntegrityError, transaction
from django.utils import timezone

from dlq.incidents import Incident, IncidentKind, ReconciliationRun
from dlq.models import Alert
from dlq.reconcile import reconcile_schedule, run_finish
from ledger.connectors import http
from ledger.signing import sign_webhook
from sandbox.models import SandboxOrder, SandboxRefund
from tests.conftest import answering, thread_server
from tests.connectors.stripe_stack import sandbox_stripe
from tests.factories import make_action, make_agent

SECRET = "whsec_late_failures"
HOUR, DAY = timedelta(hours=1), timedelta(days=1)


def stripe_at(settings, api_base):
    settings.SURETY_CONNECTORS = {**settings.SURETY_CONNECTORS, "refund": {
        "class": "ledger.connectors.stripe.StripeConnector",
        "options": {"api_key": "sk_test_surety", "api_base": api_base, "webhook_secret": SECRET}}}


@pytest.fixture
def stripe_at_the_sandbox(stack, settings):
    stripe_at(settings, sandbox_stripe(stack.url))
    return stack


def refunded_at(n, created_at, status):
    """A refund the ledger recorded succeeded, made at `created_at`, as Stripe lists it now (`status`)."""
    key, charge = f"refund:ch_late{n}:full:dec-{n}", f"ch_late{n}"
    SandboxOrder.objects.create(order_id=charge, customer=f"CUST-{n}", amount=Decimal("25.00"), currency="EUR")
    refund = SandboxRefund.objects.create(order_id=charge, amount=Decimal("25.00"), currency="EUR", status=status,
                                          operation_key=key, metadata={"operation_key": key}, created_at=created_at)
    make_action(make_agent(f"billing-{n}")[0], "succeeded", key=key, target=charge, external_ref=refund.refund_id)
    return key, refund


def days_ago(days):
    return timezone.now() - timedelta(days=days)


def reconcile_last_hour():
    out = StringIO()
    call_command("reconcile", "--hours", "1", stdout=out)
    return out.getvalue()


def deliver_failure(client, refund):
    """Stripe's `refund.failed` for `refund`, signed as its endpoint's secret signs it."""
    data = {"id": refund.refund_id, "object": "refund", "amount": 2500, "currency": "eur", "charge": refund.order_id,
            "metadata": refund.metadata, "status": "failed", "failure_reason": "expired_or_canceled_card"}
    body = json.dumps({"id": "evt_late_1", "object": "event", "type": "refund.failed", "created": int(time.time()),
                       "data": {"object": data}}).encode()
    answer = client.generic("POST", "/webhooks/stripe/", body, content_type="application/json",
                            headers={"Stripe-Signature": sign_webhook(body, SECRET)})
    assert answer.status_code == 200, answer.content


def test_a_refund_failed_days_after_it_succeeded_opens_one_incident_without_its_webhook(stripe_at_the_sandbox,
                                                                                       client):
    key, refund = refunded_at(1, days_ago(3), "failed")

    printed = reconcile_last_hour()

    incident = Incident.objects.get()
    assert (incident.kind, incident.connector, incident.subject) == (IncidentKind.FAILED_EFFECT, "stripe", key)
    assert incident.external_refs == [refund.refund_id]
    assert incident.evidence["effects"][0]["raw"]["status"] == "failed"
    assert Alert.objects.filter(incident=incident).count() == 1
    assert "opened 1" in printed

    # Run again, then the webhook arrives after all: the same incident, no other, no other alert.
    assert "opened 0" in reconcile_last_hour()
    deliver_failure(client, refund)
    assert Incident.objects.get() == incident and Alert.objects.count() == 1


def test_a_refund_still_pending_is_no_finding_beside_one_that_failed(stripe_at_the_sandbox):
    _, pending = refunded_at(1, days_ago(2), "pending")
    failed_key, failed = refunded_at(2, days_ago(2), "failed")

    reconcile_last_hour()

    incident = Incident.objects.get()
    assert (incident.subject, incident.external_refs) == (failed_key, [failed.refund_id])


# --- The schedule's runs -------------------------------------------------------------------------


@dataclass
class Listing:
    """One request for a page of Stripe's refunds listing: the span it asked for (Unix seconds,
    [gte, lt)) and the refunds in its answer."""

    gte: int
    lt: int
    refunds: list

    def holds(self, moment):
        return self.gte <= int(moment.timestamp()) < self.lt


@pytest.fixture
def listings(monkeypatch):
    """Every refunds listing request the Stripe connector sends, as it is sent and answered."""
    sent = []
    exchange = http.exchange

    def counted(method, url, **kwargs):
        response = exchange(method, url, **kwargs)
        parts, answer = urlsplit(url), response.json()
        query = parse_qs(parts.query)  # Stripe's parameters: the sandbox's own listing has others
        if method == "GET" and parts.path.endswith("/v1/refunds") and "created[gte]" in query and "data" in answer:
            sent.append(Listing(int(query["created[gte]"][0]), int(query["created[lt]"][0]),
                                [refund["id"] for refund in answer["data"]]))
        return response

    monkeypatch.setattr(http, "exchange", counted)
    return sent


@pytest.fixture
def hourly(stripe_at_the_sandbox, settings):
    """The schedule with a run an hour (a day: 24 runs; the default 300 s makes it 288, each reading
    a twelfth as much) and the default late-failures interval, a day."""
    settings.RECONCILE_INTERVAL_SECONDS = HOUR.total_seconds()
    settings.RECONCILE_OVERLAP_SECONDS = HOUR.total_seconds()
    settings.RECONCILE_LOOKBACK_SECONDS = DAY.total_seconds()
    settings.RECONCILE_LATE_FAILURES_INTERVAL_SECONDS = DAY.total_seconds()
    return settings


def hours_ago(hours):
    """That many whole hours before the last whole hour: where a slot of the hourly schedule ends."""
    hour = HOUR.total_seconds()
    return datetime.fromtimestamp((time.time() // hour - hours) * hour, tz=UTC)


def scheduled_run(at, listings):
    """The schedule's run of the slot ending `at`, started by the sweeper's step and run to its end
    as its job runs it; with the listing requests it sent: (run, its window's, its late ones)."""
    sent = len(listings)
    assert reconcile_schedule(at) == 1
    run = run_finish(ReconciliationRun.objects.get(scheduled=True, until=at).pk)
    since = int(run.since.timestamp())
    window = [listing for listing in listings[sent:] if listing.gte >= since]
    return run, window, [listing for listing in listings[sent:] if listing.gte < since]


@pytest.mark.parametrize(("late_failures_interval", "requests", "reads_per_refund"), [
    (HOUR, 24 * (1 + 4), 24),  # as each run was: all 30 days, 4 pages of 100, in each of the 24
    (DAY, 24 * (1 + 1), 1),  # the default: once in the day, a part of 31 hours in each run
])
def test_a_days_scheduled_runs_read_the_30_days_before_their_windows_again_once_not_in_every_run(
        hourly, listings, late_failures_interval, requests, reads_per_refund):
    hourly.RECONCILE_LATE_FAILURES_INTERVAL_SECONDS = late_failures_interval.total_seconds()
    start = hours_ago(24)
    # A refund every two hours, made between a day and 29 days before the day: within the 30 days
    # before every window of the day, and in none of them.
    SandboxRefund.objects.bulk_create(
        SandboxRefund(refund_id=f"re_old_{n}", order_id=f"ch_old{n}", amount=Decimal("25.00"), currency="EUR",
                      created_at=start - DAY - n * 2 * HOUR) for n in range(28 * 12))

    runs = [scheduled_run(start + hour * HOUR, listings) for hour in range(1, 25)]

    read = Counter(refund for _, _, late in runs for listing in late for refund in listing.refunds)
    # The figures of decision 66: the day's 24 runs sent 120 listing requests and read 8,064 earlier
    # refunds again, 336 refunds 24 times; or 48, and each refund once.
    assert (len(listings), sum(read.values())) == (requests, reads_per_refund * 28 * 12)
    assert set(read.values()) == {reads_per_refund} and len(read) == 28 * 12
    for run, window, late in runs:
        assert run.complete and len(window) == 1 and window[0].refunds == []
        if late_failures_interval == DAY:  # no run reads them all: a part, where the last one stopped
            assert [(listing.gte, listing.lt) for listing in late] == [
                (int(run.late_since.timestamp()), int(run.late_until.timestamp()))]
            assert run.late_until - run.late_since <= 31 * HOUR


def test_a_late_failure_whose_webhook_was_lost_is_found_within_the_interval_and_a_run(hourly, listings):
    """The refund fails at Stripe just after a run read its part: the runs after it read other parts,
    and the one whose part holds it again, within a day and an hour, opens the incident."""
    key, refund = refunded_at(1, days_ago(4), "succeeded")
    start = hours_ago(48)
    for hour in range(1, 26):  # the schedule's runs, to the first that reads the refund's part
        _, _, late = scheduled_run(start + hour * HOUR, listings)
        if any(listing.holds(refund.created_at) for listing in late):
            break
    else:
        pytest.fail("no run of a day and an hour read the refund again")
    SandboxRefund.objects.filter(pk=refund.pk).update(status="failed")  # and no webhook says so
    failed_at = start + hour * HOUR

    while not Incident.objects.exists():
        hour += 1
        run, _, late = scheduled_run(start + hour * HOUR, listings)
        assert run.until - failed_at <= DAY + HOUR, "not found within the interval and a run"
    assert any(listing.holds(refund.created_at) for listing in late)
    assert run.late_since <= refund.created_at < run.late_until
    incident = Incident.objects.get()
    assert (incident.kind, incident.subject, incident.external_refs) == (IncidentKind.FAILED_EFFECT, key,
                                                                         [refund.refund_id])


def test_a_provider_down_holds_no_other_connectors_round_and_a_run_never_finished_leaves_its_part(
        stripe_at_the_sandbox, hourly, listings):
    """Stripe does not answer the second run: the round goes on from its part all the same (waiting
    for a complete run, one provider down for days held every connector's round on one part), and
    Stripe's missed part is read in the next round. A run whose job never finished leaves its part
    to the next run."""
    start = hours_ago(4)
    first, _, _ = scheduled_run(start + HOUR, listings)
    assert first.complete and first.late_since == start + HOUR - timedelta(days=30)

    with thread_server(answering(b'{"status": "maintenance"}', "application/json")) as down:
        stripe_at(hourly, down.url)
        second, _, _ = scheduled_run(start + 2 * HOUR, listings)
    assert "failed" in second.report["stripe"] and not second.complete
    assert second.late_since == first.late_until
    stripe_at(hourly, sandbox_stripe(stripe_at_the_sandbox.url))

    assert reconcile_schedule(start + 3 * HOUR) == 1  # its job is lost: never finished
    third = ReconciliationRun.objects.get(scheduled=True, until=start + 3 * HOUR)
    assert third.late_since == second.late_until  # the round went on from the incomplete run's part
    fourth, _, late = scheduled_run(start + 4 * HOUR, listings)
    assert fourth.late_since == third.late_since  # the part of the run that never finished, read
    assert [(listing.gte, listing.lt) for listing in late] == [
        (int(third.late_since.timestamp()), int(fourth.late_until.timestamp()))]


@pytest.mark.parametrize("late", [
    {"late_since": "since"},  # one end alone
    {"late_since": "since", "late_until": "since"},  # no span
    {"late_since": "late", "late_until": "until"},  # past the window's start
], ids=["one-end", "empty", "past-the-window"])
def test_the_database_refuses_a_late_part_that_is_no_span_before_the_window(db, late):
    until = hours_ago(0)
    moments = {"since": until - HOUR, "until": until, "late": until - DAY}
    with pytest.raises(IntegrityError), transaction.atomic():
        ReconciliationRun.objects.create(since=until - HOUR, until=until,
                                         **{name: moments[moment] for name, moment in late.items()})
