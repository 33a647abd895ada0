"""Two bulk redrives never go over the same connector at once: each keeps to the connector's
redrive limit only within itself, so together they would redrive at up to twice it. A start is
refused, naming the run in the way, while another run that calls any of the same connectors is
running or stopping (a double submit, or other entries of the same connector); nothing is
written, and once that run ended the refused one starts. Runs over other connectors both go,
and two starts at the very same moment cannot both win."""

import threading

import pytest
from django.db import connection
from guardian.shortcuts import assign_perm

from dlq import bulk
from dlq.bulk import RunInTheWay, bulk_redrive_work, bulk_start
from dlq.models import BulkRedrive, DeadLetter
from ledger.access import WORK_DLQ
from ledger.models import ActionStatus, Capability
from tests.dlq.test_bulk_redrive import (REASON, agent, dry_run, failed_refund_entry, lease_holder, olga,  # noqa: F401
                                         start)
from tests.factories import audit_events, dead_letter, new_action

pytestmark = pytest.mark.usefixtures("jobs_to_test_redis")


def refused_for(response, first):
    """The refusal's page: a 409 that names the run in the way and links to it."""
    assert response.status_code == 409, response.content[:500]
    html = response.content.decode()
    section = html[html.index('id="run-in-the-way"'):]
    assert f'href="{first.get_absolute_url()}"' in section[:section.index("</section>")]
    assert f"Not started: bulk redrive #{first.pk} is " in html
    return html


def nothing_written(run):
    run.refresh_from_db()
    assert run.status == "planned" and run.started_by is None and not audit_events(run).exists()


def failed_message_entry(agent, olga):
    """A message that ran out of attempts, with its open entry; olga may work message dead letters."""
    assign_perm(f"ledger.{WORK_DLQ}", olga.user, Capability.objects.get(kind="action_type", name="send_message"))
    action = new_action(agent, ActionStatus.FAILED, key="receipt:ada@example.com:dec-9", action_type="send_message",
                        target="ada@example.com", currency="",
                        params={"channel": "email", "message_type": "receipt", "body": "Thanks!"},
                        error={"code": "mailbox_busy", "message": "451", "retryable": True})
    action.amount = None  # a message has none
    action.save(force_insert=True)
    return DeadLetter.objects.open_for_action(action, actor="system:tests")


def test_a_double_submitted_run_is_refused_while_the_first_runs_or_stops_and_starts_once_it_ended(agent, olga):
    entries = [failed_refund_entry(agent, n) for n in range(2)]
    first, second = dry_run(olga), dry_run(olga)  # the same entries, twice
    assert start(olga, first, "6").status_code == 302

    html = refused_for(start(olga, second, "6"), first)
    assert 'is running over <span class="mono">refund</span>' in html
    nothing_written(second)

    assert olga.post(f"/dlq/redrives/{first.pk}/stop", {"reason": "the provider paged us"}).status_code == 302
    assert "is stopping over" in refused_for(start(olga, second, "6"), first)  # it may still be redriving one
    nothing_written(second)

    bulk_redrive_work(first.pk, lease_holder(first))  # its job sees the stop
    assert BulkRedrive.objects.get(pk=first.pk).status == "stopped"
    assert start(olga, second, "6").status_code == 302
    second.refresh_from_db()
    assert second.status == "running" and second.items.count() == len(entries)


def test_a_run_over_other_entries_of_the_same_connector_waits_until_the_first_finished(agent, olga):
    failed_refund_entry(agent, 1, code="provider_unavailable")
    failed_refund_entry(agent, 2, code="rate_limited")
    first, second = dry_run(olga, code="provider_unavailable"), dry_run(olga, code="rate_limited")
    assert start(olga, first, "60").status_code == 302

    refused_for(start(olga, second, "60"), first)
    nothing_written(second)

    bulk_redrive_work(first.pk, lease_holder(first))
    assert BulkRedrive.objects.get(pk=first.pk).status == "finished"
    assert start(olga, second, "60").status_code == 302
    assert BulkRedrive.objects.get(pk=second.pk).status == "running"


def test_runs_over_different_connectors_both_go_and_a_task_counts_as_calling_every_connector(agent, olga):
    failed_refund_entry(agent, 1)
    failed_message_entry(agent, olga)
    refunds, messages = dry_run(olga, code="provider_unavailable"), dry_run(olga, code="mailbox_busy")
    assert start(olga, refunds, "60").status_code == 302
    assert start(olga, messages, "60").status_code == 302
    assert set(BulkRedrive.objects.values_list("status", flat=True)) == {"running"}

    dead_letter(agent, "bulk-task-1")
    tasks = dry_run(olga, workflow="refund")
    assert "calls the same connector (refund)" in refused_for(start(olga, tasks, "6"), refunds)
    nothing_written(tasks)


def test_two_starts_at_the_same_moment_cannot_both_win(agent, olga, monkeypatch):
    failed_refund_entry(agent, 1, code="provider_unavailable")
    failed_refund_entry(agent, 2, code="rate_limited")
    runs = [dry_run(olga, code="provider_unavailable"), dry_run(olga, code="rate_limited")]
    # Both starts hold their own run's lock and have found no other run active before either goes on.
    both_looked = threading.Barrier(2, timeout=10)
    looked = bulk.selection_difference

    def look_then_wait(run, *, user):
        difference = looked(run, user=user)
        both_looked.wait()
        return difference

    monkeypatch.setattr(bulk, "selection_difference", look_then_wait)
    outcomes = {}

    def start_in_thread(run):
        try:
            bulk_start(run, user=olga.user, reason=REASON, rate=60)
            outcomes[run.pk] = "started"
        except RunInTheWay as exc:
            outcomes[run.pk] = exc.run.pk
        finally:
            connection.close()

    threads = [threading.Thread(target=start_in_thread, args=(run,)) for run in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)

    started = [pk for pk, outcome in outcomes.items() if outcome == "started"]
    assert len(outcomes) == 2 and len(started) == 1, outcomes
    [refused] = set(outcomes) - set(started)
    assert outcomes[refused] == started[0]  # refused, naming the run that won
    assert BulkRedrive.objects.filter(status="running").count() == 1
