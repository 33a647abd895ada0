"""Reconciliation compares the ledger with the sandbox provider's own records over real HTTP:
a double effect, an orphan effect and an amount mismatch planted directly in the sandbox's
tables each open one incident and raise one alert; a second run over the same window opens
nothing; a connector that cannot list its records is skipped and the report says so."""

import json
from datetime import timedelta
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from dlq.incidents import Incident, IncidentKind, ReconciliationRun, incident_resolve
from dlq.models import Alert
from dlq.reconcile import Window, findings_in, reconcile, reconcile_schedule, run_finish
from ledger.actions import action_request
from ledger.connectors.base import Connector, Record
from ledger.executor import action_claim_next
from ledger.models import Action, AuditEvent
from sandbox.models import SandboxRefund
from tests.conftest import answering, thread_server, wait_until
from tests.factories import api_client, audit_events, make_action, make_agent, person, post_action, refund_body

K = IncidentKind


class UnlistedConnector(Connector):
    """A connector that cannot list its records (the base class's answer)."""

    name = "unlisted"


class RepeatingConnector(Connector):
    """A provider whose paging does not advance (a proxy that drops the cursor): its page,
    one refund the ledger recorded, listed twice; listed from memory, to end."""

    name = "repeating"

    def records(self, since, until):
        page = [Record("refund:ORD-R:full:dec-1", "re_existing", Decimal("25.00"), "EUR", since, "refund")]
        return [*page, *page]


class LongKeyConnector(Connector):
    """A provider whose metadata holds longer values than the sandbox's columns (Stripe's hold
    500 characters): one record, listed from memory, since no such provider runs here."""

    name = "long-keys"

    def records(self, since, until):
        return [Record("k" * 300, "ext_1", None, "", since, "send_message")]


def last_hour():
    now = timezone.now()
    return Window(now - timedelta(hours=1), now + timedelta(minutes=1))


@pytest.fixture
def refunded(stack):
    """Three refunds made for real: requested through the API, executed by a worker against
    the sandbox over HTTP. Returns their actions by operation key."""
    agent, token = make_agent("billing")
    client = api_client(stack.url, token)
    keys = [f"refund:ORD-{n}:full:dec-{n}" for n in (1, 2, 3)]
    for n, key in enumerate(keys, 1):
        assert post_action(client, key, refund_body(order=f"ORD-{n}", customer=f"CUST-{n}")).status_code == 201
    stack.start_worker()
    wait_until(lambda: Action.objects.filter(operation_key__in=keys, status="succeeded").count() == 3,
               message="the three refunds to succeed")
    return {key: Action.objects.get(operation_key=key) for key in keys}


def test_it_opens_one_incident_and_one_alert_per_planted_finding_and_nothing_on_a_second_run(stack, refunded):
    double_key, mismatch_key, clean_key = refunded
    assert reconcile(last_hour())["sandbox"] == {"records": 3, "findings": 0, "opened": 0, "added": 0}

    # Planted at the provider, behind the ledger's back.
    second = SandboxRefund.objects.create(order_id="ORD-1", amount=Decimal("25.00"), currency="EUR",
                                          operation_key=double_key, metadata={"operation_key": double_key})
    orphan = SandboxRefund.objects.create(order_id="ORD-GHOST", amount=Decimal("80.00"), currency="EUR",
                                          operation_key="refund:ORD-GHOST:full:dec-9")
    SandboxRefund.objects.filter(operation_key=mismatch_key).update(amount=Decimal("250.00"))

    report = reconcile(last_hour())
    assert report["sandbox"] == {"records": 5, "findings": 3, "opened": 3, "added": 0}
    double = Incident.objects.get(kind=K.DOUBLE_EFFECT)
    assert double.operation_key == double_key and double.connector == "sandbox" and double.action_type == "refund"
    assert sorted(double.external_refs) == sorted([refunded[double_key].external_ref, second.refund_id])
    assert double.evidence["ledger"]["external_ref"] == refunded[double_key].external_ref
    ghost = Incident.objects.get(kind=K.ORPHAN_EFFECT)
    assert ghost.subject == "refund:ORD-GHOST:full:dec-9" and ghost.external_refs == [orphan.refund_id]
    assert ghost.evidence["ledger"] is None and ghost.evidence["effects"][0]["raw"]["order_id"] == "ORD-GHOST"
    mismatch = Incident.objects.get(kind=K.AMOUNT_MISMATCH)
    assert mismatch.operation_key == mismatch_key
    assert mismatch.evidence["effects"][0]["amount"] == "250.00" and mismatch.evidence["ledger"]["amount"] == "25.000"
    assert not Incident.objects.filter(operation_key=clean_key).exists()

    for incident in (double, ghost, mismatch):
        [alert] = Alert.objects.filter(incident=incident)
        assert alert.kind == "incident" and alert.link == f"/incidents/{incident.pk}/"
        [opened] = AuditEvent.objects.history(incident)
        assert opened.verb == "incident_opened" and opened.actor == "system:reconcile"
    # The alerts go out as a dead letter's do: by the worker, on every channel, recorded.
    wait_until(lambda: not Alert.objects.filter(delivered_at__isnull=True).exists(), message="alerts delivered")
    assert all(alert.deliveries.filter(ok=True).exists() for alert in Alert.objects.all())

    assert reconcile(last_hour())["sandbox"] == {"records": 5, "findings": 3, "opened": 0, "added": 0}
    assert Incident.objects.count() == 3 and Alert.objects.count() == 3


def test_an_effect_under_the_key_of_an_action_the_ledger_says_never_ran_is_a_denied_effect(stack):
    """A refund the ledger has as failed (its dead letter could be retried) or cancelled, made at
    the provider all the same: reported as such, with the ledger's status, once; an action still
    in flight is no finding (its effect may be on its way to being recorded)."""
    agent, _ = make_agent("billing")
    keys = {"failed": "refund:ORD-F:full:dec-1", "cancelled": "refund:ORD-C:full:dec-1",
            "queued": "refund:ORD-Q:full:dec-1"}
    actions = {status: action_request(agent=agent, operation_key=key, action_type="refund", target=f"ORD-{status}",
                                      params={"amount": "25.00", "currency": "EUR"})[0] for status, key in keys.items()}
    claimed = action_claim_next("tests:worker", only=actions["failed"].pk)
    claimed.mark_failed(actor="system:tests", claim=claimed.fence, code="declined", message="no", retryable=True)
    actions["cancelled"].cancel(actor="system:tests", reason="not wanted")
    for status, key in keys.items():
        SandboxRefund.objects.create(order_id=f"ORD-{status}", amount=Decimal("25.00"), currency="EUR",
                                     operation_key=key)

    assert reconcile(last_hour())["sandbox"] == {"records": 3, "findings": 2, "opened": 2, "added": 0}
    found = {i.operation_key: i for i in Incident.objects.all()}
    assert found.keys() == {keys["failed"], keys["cancelled"]}
    assert {i.kind for i in found.values()} == {K.DENIED_EFFECT}
    failed = found[keys["failed"]]
    assert failed.evidence["ledger"]["status"] == "failed" and failed.external_refs
    [opened] = AuditEvent.objects.history(failed)
    assert opened.reason == f"{keys['failed']}: an effect at sandbox, and the ledger says failed"
    assert Alert.objects.filter(incident__kind=K.DENIED_EFFECT).count() == 2
    assert reconcile(last_hour())["sandbox"]["opened"] == 0


def test_a_second_effect_outside_the_window_is_still_a_double(stack, refunded):
    """The ledger names the effect it recorded: another effect for the key, even one created
    long after the first, is a double."""
    key = next(iter(refunded))
    later = SandboxRefund.objects.create(order_id="ORD-1", amount=Decimal("25.00"), currency="EUR", operation_key=key,
                                         created_at=timezone.now() + timedelta(days=2))
    window = Window(timezone.now() + timedelta(days=1), timezone.now() + timedelta(days=3))
    assert reconcile(window)["sandbox"] == {"records": 1, "findings": 1, "opened": 1, "added": 0}
    double = Incident.objects.get()
    assert double.kind == K.DOUBLE_EFFECT and double.external_refs == [later.refund_id]
    assert double.evidence["ledger"]["external_ref"] == refunded[key].external_ref


def test_an_effect_without_an_operation_key_is_an_orphan_of_its_own(stack):
    refs = [SandboxRefund.objects.create(order_id=f"ORD-X{n}", amount=Decimal("5.00"), currency="EUR").refund_id
            for n in (1, 2)]
    assert reconcile(last_hour())["sandbox"]["opened"] == 2
    assert sorted(Incident.objects.values_list("subject", flat=True)) == sorted(refs)
    assert set(Incident.objects.values_list("operation_key", flat=True)) == {""}


def test_a_connector_that_cannot_list_its_records_is_skipped_and_the_report_says_so(stack, settings):
    settings.SURETY_CONNECTORS = {**settings.SURETY_CONNECTORS,
                                  "send_message": {"class": f"{__name__}.UnlistedConnector", "options": {}}}
    report = reconcile(last_hour())
    assert report["unlisted"] == {"skipped": "this connector cannot list its records"}
    assert report["sandbox"]["records"] == 0


def test_the_schedule_starts_one_run_per_slot_from_where_the_last_complete_one_ended(stack, settings):
    settings.RECONCILE_INTERVAL_SECONDS = 300
    settings.RECONCILE_OVERLAP_SECONDS = 600
    settings.RECONCILE_LOOKBACK_SECONDS = 86400
    now = timezone.now()
    assert reconcile_schedule(now) == 1
    assert reconcile_schedule(now) == 0  # the same slot: another sweeper pass, or another sweeper
    first = ReconciliationRun.objects.get()
    assert first.until <= now < first.until + timedelta(seconds=300)
    assert first.since == first.until - timedelta(days=1)
    stack.start_worker()  # the run's job was enqueued when the run's row committed
    wait_until(lambda: ReconciliationRun.objects.filter(pk=first.pk, finished_at__isnull=False).exists(),
               message="the run's job to finish")
    first.refresh_from_db()
    assert first.complete and first.report["sandbox"] == {"records": 0, "findings": 0, "opened": 0, "added": 0}
    assert run_finish(first.pk).finished_at == first.finished_at  # a second delivery of the job does nothing

    assert reconcile_schedule(now + timedelta(seconds=300)) == 1
    second = ReconciliationRun.objects.exclude(pk=first.pk).get()
    assert second.since == first.until - timedelta(seconds=600)
    assert second.until == first.until + timedelta(seconds=300)


def test_the_command_reconciles_the_last_hours_and_prints_the_report(stack):
    SandboxRefund.objects.create(order_id="ORD-GHOST", amount=Decimal("5.00"), currency="EUR", operation_key="ghost")
    out = StringIO()
    call_command("reconcile", "--hours", "1", stdout=out)
    assert "sandbox: records 1, findings 1, opened 1" in out.getvalue()
    run = ReconciliationRun.objects.get()
    assert run.complete and run.until - run.since == timedelta(hours=1)
    for bad in (["--hours", "-1"], ["--since", "yesterday"], ["--hours", "1", "--since", "2026-09-10T00:00Z"],
                ["--hours", "1e300"], ["--hours", "nan"]):
        with pytest.raises(CommandError):
            call_command(*["reconcile", *bad], stdout=StringIO())
    assert ReconciliationRun.objects.count() == 1


def test_a_run_by_hand_leaves_the_schedules_windows_alone(stack, settings):
    """A person's `reconcile` over the last hour, after scheduled runs failed for hours (a provider
    down), does not move where the schedule's next window starts: those hours are still read. A
    run by hand ending in the future, or where another ended, neither stops the schedule nor fails."""
    settings.RECONCILE_INTERVAL_SECONDS = 300
    settings.RECONCILE_OVERLAP_SECONDS = 0
    settings.RECONCILE_LOOKBACK_SECONDS = 86400
    now = timezone.now()
    done = ReconciliationRun.objects.create(since=now - timedelta(hours=9), until=now - timedelta(hours=6),
                                            complete=True, finished_at=now)
    ReconciliationRun.objects.create(since=done.until, until=now - timedelta(hours=3))  # failed: not complete
    later = (now + timedelta(hours=2)).isoformat()
    for window in (["--hours", "1"], ["--hours", "1", "--until", later], ["--hours", "2", "--until", later]):
        call_command("reconcile", *window, stdout=StringIO())

    assert reconcile_schedule(now) == 1
    scheduled = ReconciliationRun.objects.filter(scheduled=True).latest("until")
    assert scheduled.since == done.until and scheduled.until <= now


def test_a_provider_key_longer_than_any_in_the_ledger_is_an_orphan_filed_under_its_first_255_characters(
        stack, settings):
    settings.SURETY_CONNECTORS = {**settings.SURETY_CONNECTORS,
                                  "send_message": {"class": f"{__name__}.LongKeyConnector", "options": {}}}
    assert reconcile(last_hour())["long-keys"] == {"records": 1, "findings": 1, "opened": 1, "added": 0}
    assert reconcile(last_hour())["long-keys"]["opened"] == 0
    incident = Incident.objects.get()
    assert incident.subject == incident.operation_key == "k" * 255 and incident.external_refs == ["ext_1"]


@pytest.mark.parametrize(("answer", "shown"), [
    (b'{"status": "maintenance"}', '{"status": "maintenance"}'),  # a proxy's page in JSON: no listing
    (b'{"data": [{"amount": "5.00"}], "has_more": false}', '{"data": [{"amount": "5.00"}]'),  # no ids
    (b'{"data": [{"id": "re_1", "created": "yesterday"}]}', '{"id": "re_1", "created": "yesterday"}'),  # no time
    (b'{"data": [{"id": "re_2", "created": "2026-12-01T10:00:00Z", "amount": "lots"}]}', '"amount": "lots"'),
])
def test_a_listing_that_cannot_be_read_fails_the_connectors_part_of_the_run_with_the_answer(
        db, settings, answer, shown):
    with thread_server(answering(answer, "application/json")) as proxy:
        settings.SANDBOX_BASE_URL = proxy.url
        report = reconcile(last_hour())
    assert report["sandbox"]["failed"].startswith("the sandbox's refunds listing cannot be read: ")
    assert shown in report["sandbox"]["failed"]
    assert not Incident.objects.exists()


@pytest.mark.parametrize("answer", [
    b'{"status": "maintenance"}',  # a proxy's page in JSON, answered 200: no listing at all
    b'[]',  # JSON, but no object
])
def test_a_2xx_answer_the_connector_cannot_read_fails_its_part_and_the_others_are_still_read(db, settings, answer):
    """Stripe's SDK reads an answer that is no list with errors of Python's own (no StripeError)."""
    with thread_server(answering(answer, "application/json")) as proxy:
        settings.SURETY_CONNECTORS = {
            **settings.SURETY_CONNECTORS,
            "refund": {"class": "ledger.connectors.stripe.StripeConnector",
                       "options": {"api_key": "sk_test_surety", "api_base": proxy.url}},
            "send_message": {"class": f"{__name__}.LongKeyConnector", "options": {}}}
        report = reconcile(last_hour())
    assert "failed" in report["stripe"], report
    assert report["long-keys"] == {"records": 1, "findings": 1, "opened": 1, "added": 0}
    assert Incident.objects.get().connector == "long-keys"


def test_paging_that_does_not_advance_fails_the_connectors_part_instead_of_listing_for_ever(db, settings):
    """A proxy that drops `starting_after` answers the first page again, `has_more` for ever."""
    page = json.dumps({"data": [{"id": "re_loop", "created": timezone.now().isoformat(), "amount": "5.00",
                                 "currency": "EUR"}], "has_more": True}).encode()
    with thread_server(answering(page, "application/json")) as proxy:
        settings.SANDBOX_BASE_URL = proxy.url
        report = reconcile(last_hour())
    assert "re_loop" in report["sandbox"]["failed"]
    assert not Incident.objects.exists()


def test_a_record_listed_twice_is_no_double_effect(db, settings):
    agent, _ = make_agent("billing")
    make_action(agent, "succeeded", key="refund:ORD-R:full:dec-1", target="ORD-R")
    settings.SURETY_CONNECTORS = {**settings.SURETY_CONNECTORS,
                                  "refund": {"class": f"{__name__}.RepeatingConnector", "options": {}}}
    report = reconcile(last_hour())
    assert "re_existing" in report["repeating"]["failed"]
    assert not Incident.objects.exists()



def planted(key, refund_id, at):
    """A refund at the sandbox provider under `key`, made at `at`, behind the ledger's back."""
    return SandboxRefund.objects.create(refund_id=refund_id, order_id=key.split(":")[1], amount=Decimal("25.00"),
                                        currency="EUR", operation_key=key, created_at=at)


def double_reported(key):
    """The ledger's refund under `key` and a second one at the sandbox provider, both made now, read
    by one run: its incident, and when."""
    agent, _ = make_agent("billing")
    make_action(agent, "succeeded", key=key, target=key.split(":")[1], external_ref="re_existing")
    now = timezone.now()
    planted(key, "re_existing", now)
    planted(key, "re_2", now)
    assert reconcile(Window(now - timedelta(hours=1), now + timedelta(minutes=1)))["sandbox"]["opened"] == 1
    return Incident.objects.get(), now


def test_a_new_effect_under_a_key_whose_incident_was_resolved_opens_an_incident_of_its_own(stack):
    """Resolved, an incident still answers for the effects it named (a window read again opens
    nothing), but not for one made since: a third refund of one order is found and reported."""
    key = "refund:ORD-R:full:dec-1"
    first, now = double_reported(key)
    window = Window(now - timedelta(hours=1), now + timedelta(minutes=1))
    incident_resolve(first, actor=person("olga", "operators"), reason="re_2 clawed back")
    assert reconcile(window)["sandbox"]["opened"] == 0  # the same effects, read again

    later = now + timedelta(days=1)
    planted(key, "re_3", later)
    assert reconcile(Window(later - timedelta(hours=1), later + timedelta(minutes=1)))["sandbox"]["opened"] == 1
    second = Incident.objects.exclude(pk=first.pk).get()
    assert (second.kind, second.status, second.external_refs) == (K.DOUBLE_EFFECT, "open", ["re_3"])
    assert Alert.objects.filter(incident=second).exists()
    assert reconcile(Window(now - timedelta(hours=1), later + timedelta(minutes=1)))["sandbox"]["opened"] == 0


def test_a_resolved_double_read_again_by_a_wider_window_opens_nothing(stack):
    """A window that reaches back to the ledger's own refund lists it beside the double the
    incident named: nothing new happened at the provider, and nothing is opened."""
    agent, _ = make_agent("billing")
    key = "refund:ORD-W:full:dec-1"
    make_action(agent, "succeeded", key=key, target="ORD-W", external_ref="re_1")
    now = timezone.now()
    planted(key, "re_1", now - timedelta(hours=2))
    planted(key, "re_2", now)
    assert reconcile(Window(now - timedelta(hours=1), now + timedelta(minutes=1)))["sandbox"]["opened"] == 1
    incident_resolve(Incident.objects.get(), actor=person("olga", "operators"), reason="re_2 clawed back")
    assert reconcile(Window(now - timedelta(hours=3), now + timedelta(minutes=1)))["sandbox"]["opened"] == 0


def test_a_new_effect_under_a_key_whose_incident_is_still_open_is_added_to_it_and_alerted(stack):
    """A third refund of one order, read while the double's incident waited for a person, was
    dropped: the incident named only the first two, was resolved from them, and the schedule's
    later windows started past the third."""
    key = "refund:ORD-O:full:dec-1"
    incident, now = double_reported(key)
    later = now + timedelta(hours=2)
    planted(key, "re_3", later)

    report = reconcile(Window(later - timedelta(hours=1), later + timedelta(minutes=1)))["sandbox"]
    assert (report["opened"], report["added"]) == (0, 1)
    incident.refresh_from_db()
    assert (incident.status, incident.external_refs) == ("open", ["re_existing", "re_2", "re_3"])
    assert [e["external_ref"] for e in incident.evidence["effects"]][-1] == "re_3"
    assert audit_events(incident, "incident_effects_added").get().after == {
        "external_refs": ["re_existing", "re_2", "re_3"]}
    assert Alert.objects.filter(incident=incident).count() == 2
    # Read again, nothing more is added.
    assert reconcile(Window(now - timedelta(hours=1), later + timedelta(minutes=1)))["sandbox"]["added"] == 0


def test_the_provider_listing_a_succeeded_actions_own_effect_as_failed_is_a_failed_effect(db, jobs_to_test_redis):
    """A refund the ledger has as succeeded with re_1, which the provider lists as failed (it failed
    it after it succeeded: no money moved): a finding of its own. Another attempt's failed refund
    under the key is none (nothing was made by it)."""
    agent, _ = make_agent("billing")
    action = make_action(agent, "succeeded", key="refund:ORD-FE:full:dec-1", external_ref="re_1")
    now = timezone.now()
    failed = Record(action.operation_key, "re_1", Decimal("25.00"), "EUR", now, "refund", made=False)
    earlier = Record(action.operation_key, "re_0", Decimal("25.00"), "EUR", now, "refund", made=False)

    read, findings = findings_in(RepeatingConnector(), [earlier, failed])
    assert read == 2
    [finding] = findings
    assert (finding.kind, finding.operation_key, finding.external_refs) == (K.FAILED_EFFECT, action.operation_key, ["re_1"])
    assert finding.summary == (f"{action.operation_key}: repeating failed re_1, which the ledger says succeeded: no money "
                               "may have moved")
