"""A bulk redrive from the dead-letter queue, through the real stack (the gunicorn server with
its sandbox provider, RQ workers, PostgreSQL): the dry run lists every selected entry and what it
would do, and changes nothing; a run goes at the rate the person set (measured between
redrives), stops on a provider error spike (the sandbox's faults) or when a person stops it,
leaves the rest open and a report that says why; a run whose selection changed since its dry
run is refused with the difference; bad rates and missing permissions are refused; and an
entry redriven that fails again gets a new entry, the earlier one keeping its error."""

import re
import sys
import time
from datetime import timedelta
from types import SimpleNamespace
from decimal import Decimal
from urllib.parse import urljoin

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.test import Client
from django.utils import timezone
from guardian.shortcuts import assign_perm, remove_perm

from approvals.models import Limit
from console.sweeper import sweep_once
from dlq.bulk import LEASE_SECONDS, _failure_since, bulk_redrive_work, bulk_redrives_resume, lease
from dlq.entries import deadletter_redrive, deadletter_resolve
from dlq.models import BulkRedrive, BulkRedriveItem, DeadLetter, EntryStatus
from ledger import audit as ledger_audit
from ledger.access import WORK_DLQ
from ledger.locks import StepLease, lead
from ledger.models import Action, ActionStatus, AuditEvent, Capability
from tests.conftest import wait_until
from tests.factories import (agent_api, audit_events, dead_letter, failed_task_entry, make_action, make_agent, person,
                             sandbox, sandbox_list)

REASON = "the provider is back (INC-4411); the runbook says redrive"
User = get_user_model()


@pytest.fixture
def olga(stack, client):
    """An operator (the dead-letter permission on every workflow), granted it on refunds too."""
    call_command("setup_roles", verbosity=0)
    user = User.objects.create_user(username="olga", password=None)
    user.groups.add(Group.objects.get(name="operators"))
    assign_perm(f"ledger.{WORK_DLQ}", user, Capability.objects.get(kind="action_type", name="refund"))
    client.force_login(user)
    client.user = user
    return client


@pytest.fixture
def agent(stack):
    return make_agent("billing")[0]


@pytest.fixture
def provider(stack):
    client = agent_api(stack.url, "provider-client")
    yield client
    client.close()


@pytest.fixture
def fast_limit(settings):
    settings.CONNECTOR_REDRIVE_RATES = {**settings.CONNECTOR_REDRIVE_RATES, "refund": 600}


def failed_refund_entry(agent, n, *, retryable=True, code="provider_unavailable"):
    """A standalone refund out of attempts (or refused for good), with its open entry."""
    order = f"ORD-BR-{n}"
    action = make_action(agent, ActionStatus.FAILED, key=f"refund:{order}:full:dec-{n}", target=order,
                         customer=f"CUST-BR-{n}", attempts=3,
                         error={"code": code, "message": f"{code} on attempt 3", "retryable": retryable})
    return DeadLetter.objects.open_for_action(action, actor="system:tests")


def dry_run(client, **filters):
    response = client.post("/dlq/bulk", {"op": "redrive", **filters})
    assert response.status_code == 302, response.content[:500]
    return BulkRedrive.objects.get(pk=response.url.rstrip("/").rsplit("/", 1)[1])


def start(client, run, rate, reason=REASON):
    return client.post(f"/dlq/redrives/{run.pk}/start", {"rate": rate, "reason": reason})


def lease_holder(run):
    """The token of the job whose lease the run is under."""
    return StepLease.objects.get(step=lease(run)).holder


def lapse(run):
    """The run's lease runs out (its job was lost, or stalled past it)."""
    StepLease.objects.filter(step=lease(run)).update(expires_at=timezone.now() - timedelta(seconds=1))


def ended(run, seconds=60):
    def check():
        bulk_redrives_resume()  # as the sweeper would
        row = BulkRedrive.objects.get(pk=run.pk)
        return row.status in ("finished", "stopped") and row
    return wait_until(check, seconds=seconds, interval=0.2, message=f"{run} to end")


def test_the_dry_run_lists_every_entry_with_what_it_would_do_and_changes_nothing(agent, olga):
    resumes = dead_letter(agent, "dry-1", done={"lookup_order": {"order_id": "ORD-dry-1"}})
    retried = failed_refund_entry(agent, 1)
    by_person = failed_refund_entry(agent, 2, retryable=False, code="declined")
    final = failed_task_entry(agent, "dry-2")
    before = AuditEvent.objects.count()

    run = dry_run(olga)
    page = olga.get(run.get_absolute_url())
    assert page.status_code == 200
    plans = {item.entry_id: (item.plan, item.plan_detail) for item in run.items.all()}
    assert plans == {
        resumes.pk: ("task_resume", "resumes at step 2, call_refund_api (fresh budget of 3 attempts)"),
        retried.pk: ("action_retry", plans[retried.pk][1]),
        by_person.pk: ("action_retry_by_person", "its failure (declined) was marked permanent: retried on your word "
                                                 "and reason"),
        final.pk: ("skip", "a failed task is final (its error is one no retry will change): resolve or discard it"),
    }
    html = page.content.decode()
    for entry in (resumes, retried, by_person, final):
        assert f'data-entry="{entry.pk}"' in html
    assert "resumes at step 2, call_refund_api" in html and "a failed task is final" in html
    # Nothing moved: every entry open, no event written.
    assert set(DeadLetter.objects.values_list("status", flat=True)) == {EntryStatus.OPEN}
    assert AuditEvent.objects.count() == before


def test_an_entry_you_may_not_work_is_listed_as_skipped_and_a_long_list_is_paged(agent, client, stack):
    call_command("setup_roles", verbosity=0)
    user = User.objects.create_user(username="wendy", password=None)
    user.groups.add(Group.objects.get(name="auditors"))
    capability, _ = Capability.objects.get_or_create(kind=Capability.Kind.WORKFLOW, name="refund")
    assign_perm(f"ledger.{WORK_DLQ}", user, capability)
    client.force_login(user)
    tasks = [dead_letter(agent, f"page-{n}") for n in range(52)]
    action = failed_refund_entry(agent, 9)

    run = dry_run(client)
    assert run.items.count() == 53
    skipped = run.items.get(entry=action)
    assert (skipped.plan, skipped.plan_detail) == ("skip", "not yours to work: you may not work refund dead letters")
    first, second = client.get(run.get_absolute_url()), client.get(f"{run.get_absolute_url()}?page=2")
    assert first.content.decode().count('class="run-item"') == 50
    assert second.content.decode().count('class="run-item"') == 3
    assert f'data-entry="{action.pk}"' in second.content.decode() and tasks


def test_a_run_goes_at_the_rate_set_and_leaves_a_report(agent, olga, provider, fast_limit, stack):
    entries = [failed_refund_entry(agent, n) for n in range(5)]
    run = dry_run(olga)
    stack.start_worker()
    stack.start_worker()  # one works the run, the other drains what it redrives

    response = start(olga, run, "120")  # one every 0.5 s
    assert response.status_code == 302
    run = ended(run)

    assert run.status == "finished" and run.stop_reason == ""
    assert run.started_by == olga.user and run.note == REASON and run.rate == Decimal("120")
    assert run.started_at <= run.finished_at
    items = list(run.items.order_by("position"))
    assert [item.outcome for item in items] == ["redriven"] * 5
    times = [item.redriven_at for item in items]
    gaps = [(b - a).total_seconds() for a, b in zip(times, times[1:])]
    assert min(gaps) >= 0.5, gaps  # never faster than the rate
    assert max(gaps) < 3, gaps  # and not stalled either
    for entry in entries:
        entry.refresh_from_db()
        assert entry.status == EntryStatus.REDRIVEN and entry.note == REASON and entry.decided_by == "user:olga"
        [event] = audit_events(entry, "redriven")
        assert event.reason == REASON
        action = wait_until(lambda: Action.objects.filter(pk=entry.action_id, status="succeeded").first(), 30)
        assert [r["operation_key"] for r in sandbox_list(provider, "refunds", order_id=action.target)] == [
            action.operation_key]
    assert [e.verb for e in audit_events(run)] == ["bulk_redrive_started", "bulk_redrive_finished"]
    assert audit_events(run)[0].actor == "user:olga" and audit_events(run)[0].reason == REASON

    report = olga.get(run.get_absolute_url()).content.decode()
    assert report.count('data-plan="action_retry" data-outcome="redriven"') == 5 and "120.00 per minute" in report
    assert "Report" in report and REASON in report
    assert f'href="/dlq/redrives/{run.pk}/"' in olga.get("/dlq/redrives/").content.decode()
    assert 'href="/dlq/redrives/"' in olga.get("/dlq/").content.decode()


def test_a_provider_error_spike_stops_the_run_and_a_redrive_that_fails_again_gets_a_new_entry(
        agent, olga, provider, fast_limit, stack):
    entries = [failed_refund_entry(agent, n) for n in range(8)]
    for entry in entries:  # the provider fails every refund call now
        armed = sandbox(provider, "POST", "faults", json={"target": entry.action.target, "fault": "error_500",
                                                          "times": 5})
        assert armed.status_code == 201, armed.text
    run = dry_run(olga)
    for _ in range(2):
        stack.start_worker(REDRIVE_SPIKE_FAILURES=2, REDRIVE_SPIKE_WINDOW=3)

    assert start(olga, run, "60").status_code == 302  # one a second: the failures are seen in time
    run = ended(run)

    assert run.status == "stopped"
    assert run.stop_reason.startswith("provider error spike: 2 of the last ")
    assert "failed again at the provider" in run.stop_reason
    counts = run.counts()
    assert counts["redriven"] >= 2 and counts["left_open"] >= 3, counts
    assert counts["redriven"] + counts["left_open"] == 8
    for item in run.items.filter(outcome="left_open"):
        item.entry.refresh_from_db()
        assert item.entry.status == EntryStatus.OPEN  # the rest stays in the queue, untouched
        assert item.outcome_detail == f"left open: the run stopped ({run.stop_reason})"
        assert Action.objects.get(pk=item.entry.action_id).status == ActionStatus.FAILED
    failed_again = [item for item in run.items.filter(outcome="redriven") if item.failed_again]
    assert len(failed_again) >= 2
    assert failed_again[0].failed_again.startswith("outcome_unknown")
    [stopped] = audit_events(run, "bulk_redrive_stopped")
    assert stopped.actor == "system:bulk-redrive" and stopped.reason == run.stop_reason

    # The redriven action failed again for good: a new entry, the first one kept as it was.
    first = failed_again[0].entry
    second = wait_until(lambda: DeadLetter.objects.filter(action=first.action, status="open").first(), 30,
                        message="the action's second entry")
    first.refresh_from_db()
    assert first.status == EntryStatus.REDRIVEN and first.last_error["code"] == "provider_unavailable"
    assert second.pk != first.pk and second.last_error["code"] == "attempts_exhausted"
    page = olga.get(f"/dlq/{second.pk}/").content.decode()
    attempts = page[page.index('id="entry-attempts"'):]
    assert f'data-id="{first.pk}"' in attempts and f'data-id="{second.pk}"' in attempts
    assert "provider_unavailable" in attempts and "attempts_exhausted" in attempts
    assert f"bulk redrive #{run.pk}" in attempts
    report = olga.get(run.get_absolute_url()).content.decode()
    assert "provider error spike" in report and "failed again at the provider: outcome_unknown" in report


def test_a_person_stops_a_running_redrive(agent, olga, stack):
    entries = [failed_refund_entry(agent, n) for n in range(3)]
    run = dry_run(olga)
    stack.start_worker()
    stack.start_worker()
    assert start(olga, run, "6").status_code == 302  # one every 10 s
    wait_until(lambda: run.items.filter(outcome="redriven").exists(), 20, message="the first redrive")

    assert olga.post(f"/dlq/redrives/{run.pk}/stop", {"reason": ""}).status_code == 302  # refused: no reason
    assert BulkRedrive.objects.get(pk=run.pk).status == "running"
    assert olga.post(f"/dlq/redrives/{run.pk}/stop", {"reason": "the provider paged us"}).status_code == 302
    run = ended(run, seconds=15)

    assert run.status == "stopped" and run.stop_reason == "stopped by user:olga: the provider paged us"
    assert [item.outcome for item in run.items.order_by("position")] == ["redriven", "left_open", "left_open"]
    assert DeadLetter.objects.filter(pk__in=[e.pk for e in entries[1:]], status="open").count() == 2
    assert [e.verb for e in audit_events(run)] == ["bulk_redrive_started", "bulk_redrive_stop_asked",
                                                   "bulk_redrive_stopped"]


def test_a_run_whose_selection_changed_is_refused_with_the_difference(agent, olga):
    kept, decided, gone_quietly = (failed_refund_entry(agent, n) for n in range(3))
    run = dry_run(olga)
    deadletter_resolve(decided, actor="user:alice", note="refunded by hand, ticket 8812")
    # Another would now do something else: its failure was made permanent meanwhile.
    Action.objects.filter(pk=gone_quietly.action_id).update(
        error={"code": "declined", "message": "no", "retryable": False})
    appeared = failed_refund_entry(agent, 7)

    response = start(olga, run, "30")
    assert response.status_code == 409
    html = response.content.decode()
    section = html[html.index('id="selection-difference"'):]
    appeared_list = section[section.index('id="appeared"'):section.index("</ul>")]
    assert f'data-id="{appeared.pk}"' in appeared_list and f'data-id="{kept.pk}"' not in appeared_list
    disappeared = section[section.index('id="disappeared"'):]
    assert f'data-id="{decided.pk}"' in disappeared[:disappeared.index("</ul>")]
    assert "resolved by user:alice" in disappeared
    changed = section[section.index('id="changed"'):]
    assert f'data-id="{gone_quietly.pk}"' in changed[:changed.index("</ul>")]
    assert "the selection changed since the dry run" in html
    # Nothing started, nothing moved.
    run.refresh_from_db()
    assert run.status == "planned" and run.started_by is None
    assert DeadLetter.objects.filter(status="open").count() == 3
    assert not audit_events(run).exists()



def test_a_stale_dry_run_shows_stale_with_its_start_button_disabled_and_is_refused(agent, olga):
    failed_refund_entry(agent, 1)
    run = dry_run(olga)
    BulkRedrive.objects.filter(pk=run.pk).update(planned_at=run.planned_at - timedelta(hours=2))

    page = olga.get(f"/dlq/redrives/{run.pk}/").content.decode()
    assert 'badge badge--stale" id="run-status"' in page and 'id="stale-help"' in page
    button = page[page.index('id="start-run"'):page.index(">", page.index('id="start-run"'))]
    assert "disabled" in button
    assert 'badge badge--stale"' in olga.get("/dlq/redrives/").content.decode()

    answer = olga.post(f"/dlq/redrives/{run.pk}/start", {"rate": "30", "reason": REASON}, follow=True)
    assert "Not started: this dry run is stale" in answer.content.decode()
    run.refresh_from_db()
    assert run.status == "planned" and run.started_by is None
    assert DeadLetter.objects.filter(status="open").count() == 1


@pytest.mark.parametrize(("rate", "message"), [
    ("0", "The rate must be above 0 entries per minute."),
    ("-5", "The rate must be above 0 entries per minute."),
    ("fast", "The rate is a number of entries per minute, e.g. 30."),
    ("NaN", "The rate is a number of entries per minute, e.g. 30."),
    ("60.01", "At most 60.00 entries per minute: the redrive limit of the connectors these entries call."),
    ("", "This field is required."),
])
def test_a_rate_that_is_not_a_positive_number_within_the_limit_is_refused(agent, olga, rate, message):
    failed_refund_entry(agent, 1)
    run = dry_run(olga)
    assert run.ceiling == Decimal("60")

    response = start(olga, run, rate)
    assert response.status_code == 200  # the page again, with the error at the field
    assert message in response.content.decode()
    run.refresh_from_db()
    assert run.status == "planned" and not audit_events(run).exists()


def test_a_reason_is_required_and_a_run_starts_once(agent, olga, jobs_to_test_redis):
    failed_refund_entry(agent, 1)
    run = dry_run(olga)
    refused = start(olga, run, "30", reason="  ")
    assert refused.status_code == 200 and "A reason is required to redrive." in refused.content.decode()
    assert start(olga, run, "30").status_code == 302
    again = start(olga, run, "30")
    assert again.status_code == 302
    assert "already started" in olga.get(again.url).content.decode()
    assert audit_events(run, "bulk_redrive_started").count() == 1


def test_a_start_refused_for_its_form_polls_and_pages_the_run_page_not_the_start_url(agent, olga,
                                                                                    jobs_to_test_redis):
    """The refusal is the run's page answered to the POST: the browser stays at .../start, which
    only takes a POST, so its progress polls and its pager go to the run's own page."""
    for n in range(52):
        dead_letter(agent, f"pg-{n}")
    run = dry_run(olga)
    here = f"http://testserver/dlq/redrives/{run.pk}/start"

    refused = start(olga, run, "100000").content.decode()
    assert "At most " in refused
    following = olga.get(urljoin(here, re.search(r'href="([^"]*\?page=2)" rel="next"', refused).group(1)))
    assert following.status_code == 200 and following.content.decode().count('class="run-item"') == 2

    assert start(olga, run, "1").status_code == 302  # started meanwhile, from another tab or by another person
    refused = start(olga, run, "1", reason="").content.decode()
    polled = olga.get(urljoin(here, re.search(r'hx-get="([^"]+)" hx-trigger="every 2s"', refused).group(1)),
                      HTTP_HX_REQUEST="true")
    assert polled.status_code == 200 and 'id="run-progress"' in polled.content.decode()


def test_without_the_permission_each_step_is_forbidden(agent, olga, jobs_to_test_redis):
    failed_refund_entry(agent, 1)
    run = dry_run(olga)
    aldo = User.objects.create_user(username="aldo", password=None)
    aldo.groups.add(Group.objects.get(name="auditors"))
    client = Client()
    client.force_login(aldo)

    assert client.get(run.get_absolute_url()).status_code == 200  # an auditor reads it
    assert client.post("/dlq/bulk", {"op": "redrive"}).status_code == 403
    assert start(client, run, "30").status_code == 403
    assert client.post(f"/dlq/redrives/{run.pk}/stop", {"reason": "no"}).status_code == 403
    assert BulkRedrive.objects.count() == 1 and BulkRedrive.objects.get().status == "planned"


def test_a_lost_job_is_taken_over_and_a_second_job_for_the_run_does_nothing(agent, olga, jobs_to_test_redis):
    entries = [failed_refund_entry(agent, n) for n in range(2)]
    run = dry_run(olga)
    assert start(olga, run, "60").status_code == 302
    run.refresh_from_db()
    bulk_redrive_work(run.pk, "not-the-token")  # a stray job: the run is handed to another
    assert not run.items.filter(outcome="redriven").exists()

    lapse(run)  # its job was lost
    assert bulk_redrives_resume() == 1
    token = lease_holder(run)
    bulk_redrive_work(run.pk, token)  # the sweeper's job, run here
    run.refresh_from_db()
    assert run.status == "finished", list(run.items.values_list("outcome", "outcome_detail"))
    assert {e.status for e in DeadLetter.objects.filter(pk__in=[e.pk for e in entries])} == {EntryStatus.REDRIVEN}


def test_a_lapsed_lease_is_taken_over_and_the_job_that_held_it_redrives_no_more(agent, olga, jobs_to_test_redis):
    entries = [failed_refund_entry(agent, n) for n in range(2)]
    run = dry_run(olga)
    assert start(olga, run, "60").status_code == 302
    first = lease_holder(run)
    assert bulk_redrives_resume() == 0  # its job holds the lease: nothing to take over
    assert StepLease.objects.get(step=lease(run)).expires_at > timezone.now()

    lapse(run)  # the job stalled past its lease
    assert bulk_redrives_resume() == 1
    second = lease_holder(run)
    assert second != first
    bulk_redrive_work(run.pk, first)  # the stalled job wakes up: the run is not its own any more
    assert not run.items.filter(outcome="redriven").exists() and lease_holder(run) == second

    bulk_redrive_work(run.pk, second)
    run.refresh_from_db()
    assert run.status == "finished" and run.counts()["redriven"] == 2
    assert {e.status for e in DeadLetter.objects.filter(pk__in=[e.pk for e in entries])} == {EntryStatus.REDRIVEN}
    assert not StepLease.objects.filter(step=lease(run)).exists()  # an ended run's lease goes with it


@pytest.mark.django_db
def test_without_workers_the_request_returns_at_once_and_the_sweeper_works_the_run_a_short_slice_a_pass(
        settings, client):
    settings.RQ_ASYNC = False  # the embedded default: no Redis, no workers
    call_command("setup_roles", verbosity=0)
    user = User.objects.create_user(username="olga", password=None)
    user.groups.add(Group.objects.get(name="operators"))
    assign_perm(f"ledger.{WORK_DLQ}", user, Capability.objects.get(kind="action_type", name="refund"))
    client.force_login(user)
    agent = make_agent("billing")[0]
    entries = [failed_refund_entry(agent, n) for n in range(2)]
    run = dry_run(client)

    # One every 10 s: a slice worked inside the request, or by a sweeper's pass, takes 10 s for the
    # two (a whole slice 15 s), far above the 5 s a loaded machine may take for the rest.
    began = time.monotonic()
    assert start(client, run, "6").status_code == 302
    assert time.monotonic() - began < 5  # not a whole slice inside the request
    assert not run.items.filter(outcome="redriven").exists()

    began = time.monotonic()
    assert sweep_once()["bulk_redrives_resumed"] == 1  # one sweeper pass works it a little
    assert time.monotonic() - began < 5  # and returns to its other steps
    run.refresh_from_db()
    assert run.status == "running" and run.counts()["redriven"] == 1
    passes = 1
    while run.status == "running" and passes < 20:  # the sweeper's next passes
        began = time.monotonic()
        assert bulk_redrives_resume() == 1
        assert time.monotonic() - began < 5
        passes += 1
        run.refresh_from_db()
    assert run.status == "finished" and run.counts()["redriven"] == 2 and passes > 2
    assert {e.status for e in DeadLetter.objects.filter(pk__in=[e.pk for e in entries])} == {EntryStatus.REDRIVEN}


def test_a_limit_lowered_since_the_dry_run_holds(agent, olga, settings, jobs_to_test_redis):
    failed_refund_entry(agent, 1)
    settings.CONNECTOR_REDRIVE_RATES = {**settings.CONNECTOR_REDRIVE_RATES, "refund": 600}
    run = dry_run(olga)
    settings.CONNECTOR_REDRIVE_RATES = {**settings.CONNECTOR_REDRIVE_RATES, "refund": 30}

    refused = start(olga, run, "120")
    assert "at most 30.00 entries per minute now" in olga.get(refused.url).content.decode()
    run.refresh_from_db()
    assert run.status == "planned" and not audit_events(run).exists()
    assert start(olga, run, "30").status_code == 302
    run.refresh_from_db()
    assert run.status == "running" and run.ceiling == Decimal("30") and run.rate == Decimal("30")


@pytest.mark.parametrize("meanwhile", ["a person stops the run", "another job takes the run over"])
def test_no_entry_is_redriven_after_a_stop_or_a_takeover_that_came_while_the_job_waited_for_its_slot(
        agent, olga, jobs_to_test_redis, monkeypatch, meanwhile):
    entries = [failed_refund_entry(agent, n) for n in range(2)]
    run = dry_run(olga)
    assert start(olga, run, "60").status_code == 302
    token = lease_holder(run)
    sleep, asked = time.sleep, []

    def wait_for_the_slot(seconds):
        """The job's wait just before it redrives an entry: the moment the race is about."""
        if sys._getframe(1).f_code.co_name == "_redrive_one" and not asked:
            if meanwhile == "a person stops the run":
                asked.append(olga.post(f"/dlq/redrives/{run.pk}/stop", {"reason": "the provider paged us"}))
            else:  # its lease lapsed (the job looked lost) and another job took the run
                lapse(run)
                asked.append(lead(lease(run), "another-job", LEASE_SECONDS))
        sleep(seconds)

    monkeypatch.setattr(time, "sleep", wait_for_the_slot)
    bulk_redrive_work(run.pk, token)

    assert asked, "the job never waited for a slot"
    assert DeadLetter.objects.filter(pk__in=[e.pk for e in entries], status="open").count() == 2
    assert not any(audit_events(entry, "redriven").exists() for entry in entries)
    run.refresh_from_db()
    if meanwhile == "a person stops the run":
        assert run.status == "stopped" and run.stop_reason == "stopped by user:olga: the provider paged us"
        assert run.counts()["left_open"] == 2
    else:  # the run is the other job's to go on with, untouched
        assert run.status == "running" and lease_holder(run) == "another-job" and run.counts()["planned"] == 2


def test_an_entry_the_job_could_not_redrive_is_audited_with_why(agent, olga, jobs_to_test_redis):
    refund, task = failed_refund_entry(agent, 1), dead_letter(agent, "decided-1")
    run = dry_run(olga)
    assert start(olga, run, "60").status_code == 302
    # After the start: olga loses the refund permission, and alice settles the task by hand.
    refunds = Capability.objects.get(kind="action_type", name="refund")
    for holder in (olga.user, Group.objects.get(name="operators")):
        remove_perm(f"ledger.{WORK_DLQ}", holder, refunds)
    deadletter_resolve(task, actor="user:alice", note="refunded by hand, ticket 8812")

    bulk_redrive_work(run.pk, lease_holder(run))

    failed, skipped = (BulkRedriveItem.objects.get(run=run, entry=entry) for entry in (refund, task))
    assert (failed.outcome, failed.outcome_detail) == ("failed", "olga may no longer work refund dead letters")
    assert (skipped.outcome, skipped.outcome_detail) == ("skipped", "already resolved by user:alice")
    for item in (failed, skipped):
        [event] = audit_events(item)
        assert event.verb == f"bulk_redrive_item_{item.outcome}" and event.actor == "system:bulk-redrive"
        assert event.reason == item.outcome_detail
        assert event.before == {"outcome": "planned"}
        assert event.after == {"outcome": item.outcome, "entry": item.entry_id}
    refund.refresh_from_db()
    assert refund.status == EntryStatus.OPEN and Action.objects.get(pk=refund.action_id).status == ActionStatus.FAILED
    assert BulkRedrive.objects.get(pk=run.pk).status == "finished"


def test_a_failure_for_good_over_its_limit_now_is_reported_as_waiting_for_an_approver(agent, olga, fast_limit,
                                                                                    jobs_to_test_redis):
    """Retried on the run's word, a refund refused for good is asked of the limits again: over them
    (750 EUR above 500), it waits for an approver, and the report says so, not "retried"."""
    Limit.limit_set(actor="system:tests", reason="the tests' policy", action_type="refund", currency="EUR",
                    max_amount=Decimal("500.00"))
    entry = failed_refund_entry(agent, 1, retryable=False, code="declined")
    Action.objects.filter(pk=entry.action_id).update(amount=Decimal("750.00"),
                                                     params={"amount": "750.00", "currency": "EUR"})
    run = dry_run(olga)
    assert start(olga, run, "600").status_code == 302
    bulk_redrive_work(run.pk, lease_holder(run))  # the run's job, run here
    [item] = BulkRedriveItem.objects.filter(run=run)
    assert (item.outcome, item.outcome_detail) == ("redriven", "waits for an approver: failed for good, it is over "
                                                               "its limit now")
    assert Action.objects.get(pk=entry.action_id).status == ActionStatus.AWAITING_APPROVAL


def test_a_failure_again_stamped_by_a_host_whose_clock_is_behind_still_counts(agent, jobs_to_test_redis,
                                                                              monkeypatch):
    """The spike brake compared the redrive's time on the bulk job's host with the failure's on the
    worker's: a worker 3 s behind failed the redriven work 0.5 s later, and the failure seemed older
    than the redrive, so a run into a failing provider never stopped. Ordered by the audit trail."""
    entry = failed_refund_entry(agent, 1)
    deadletter_redrive(entry, actor=person("olga", "operators"), reason="the provider is back")
    behind = SimpleNamespace(now=lambda: timezone.now() - timedelta(seconds=3))
    monkeypatch.setattr(ledger_audit, "timezone", behind)  # the worker's host writes the events now
    claimed = Action.objects.get(pk=entry.action_id).claim(owner="worker-behind:1")
    claimed.mark_failed(actor="system:executor", claim=claimed.fence, code="provider_unavailable", message="down",
                        retryable=True)
    monkeypatch.undo()
    event = _failure_since(DeadLetter.objects.get(pk=entry.pk))
    assert event is not None and event.verb == "failed"
