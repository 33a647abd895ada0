"""An alert's delivery when something around it fails: no channel to go to, the database lost
in the middle of a delivery, a receiver that keeps failing. (Delivery itself, by e-mail and
signed webhook, is in test_deadletter_entries.py.)"""

import logging
from datetime import timedelta
from http.server import BaseHTTPRequestHandler

import django_rq
import psycopg
import pytest
import redis
from django.core import mail
from django.db import OperationalError, connection, transaction
from django.utils import timezone
from rq.registry import ScheduledJobRegistry

from dlq.alerts import NOWHERE, RETRY_MAX, alert_deliver, alerts_redeliver_stale, retry_delay
from dlq.models import Alert, AlertDelivery, DeadLetter
from ledger.models import Task
from tests.conftest import REDIS_URL, free_port, thread_server
from tests.factories import make_agent

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _jobs_of_this_test_only(jobs_to_test_redis):
    """The run's Redis database empty: a try scheduled by an earlier test, for an alert whose id
    this test's reuses, is not taken for one of this test's."""
    redis.Redis.from_url(REDIS_URL).flushdb()


def an_alert(task_id, **fields):
    """A dead-letter entry's alert, not yet delivered (no owner to mail: operations only)."""
    agent, _ = make_agent(f"agent-{task_id}")
    task = Task.objects.create(task_id=task_id, fingerprint="x", workflow="refund", input={}, agent=agent,
                               max_attempts=3, state="dead_lettered", attempts=3)
    with transaction.atomic():
        entry = DeadLetter.objects.create(task=task, snapshot={}, last_error={"retryable": True}, attempts=3)
        return Alert.objects.create(kind=Alert.Kind.DEAD_LETTER, dead_letter=entry, subject=f"Dead letter: {task_id}",
                                    link=entry.get_absolute_url(), **fields)


def scheduled_tries(alert):
    """(job, when) of the alert's tries scheduled for later."""
    queue = django_rq.get_queue("default")
    registry = ScheduledJobRegistry(queue=queue)
    jobs = [queue.fetch_job(job_id) for job_id in registry.get_job_ids()]
    return [(job, registry.get_scheduled_time(job)) for job in jobs
            if job and job.func_name == "dlq.alerts.alert_deliver" and job.args == (alert.pk,)]


def test_an_alert_with_no_channel_to_operations_is_not_taken_as_delivered(settings, caplog):
    """ALERT_EMAILS emptied (to use the webhook alone) and ALERT_WEBHOOK_URL missing: the alert
    was stamped delivered, on no channel, and nothing said so anywhere."""
    settings.ALERT_EMAILS, settings.ALERT_WEBHOOK_URL = [], None
    alert = an_alert("refund-nowhere")
    caplog.set_level(logging.ERROR, logger="surety.alerts")

    alert_deliver(alert.pk)

    alert.refresh_from_db()
    assert alert.delivered_at is None
    [delivery] = alert.deliveries.all()
    assert (delivery.channel, delivery.attempt, delivery.ok) == (NOWHERE, 1, False)
    assert "ALERT_EMAILS" in delivery.detail and "ALERT_WEBHOOK_URL" in delivery.detail
    assert any("undelivered" in record.getMessage() and "ALERT_EMAILS" in record.getMessage()
               for record in caplog.records)
    assert len(scheduled_tries(alert)) == 1  # tried again, as any failed channel

    settings.ALERT_EMAILS = ["ops@surety.example"]  # the setting fixed: the next try delivers it
    alert_deliver(alert.pk)

    alert.refresh_from_db()
    assert alert.delivered_at is not None
    assert [message.to for message in mail.outbox] == [["ops@surety.example"]]


def test_the_database_lost_during_the_webhook_keeps_the_record_of_the_mail_sent_before_it(settings):
    """Both channels were recorded in one transaction: a failover (or a worker killed) while the
    webhook was posted rolled back the record of the e-mail already sent, and the retry mailed
    everyone again (with decision links the rollback had taken back)."""
    settings.ALERT_EMAILS = ["ops@surety.example"]
    alert = an_alert("refund-failover")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        [delivering] = cursor.fetchone()
    db = connection.settings_dict
    dsn = (f"host={db['HOST'] or '127.0.0.1'} port={db['PORT'] or 5432} user={db['USER'] or 'postgres'} "
           f"dbname={db['NAME']}")
    posts = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            self.rfile.read(int(self.headers["Content-Length"]))
            posts.append(self.path)
            if len(posts) == 1:  # the delivering connection ends while its post is answered
                with psycopg.connect(dsn, autocommit=True) as other:
                    other.execute("SELECT pg_terminate_backend(%s)", [delivering])
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    with thread_server(Receiver) as receiver:
        settings.ALERT_WEBHOOK_URL = f"{receiver.url}/hooks/surety"
        with pytest.raises(OperationalError):
            alert_deliver(alert.pk)
        connection.close()  # what the worker does after a job that lost its connection

        assert list(AlertDelivery.objects.values_list("channel", "attempt", "ok")) == [("email", 1, True)]
        alert_deliver(alert.pk)  # the sweeper's redelivery

    assert len(mail.outbox) == 1
    assert len(posts) == 2  # the post whose record was lost is sent again: the receiver dedupes on its id
    assert sorted(AlertDelivery.objects.values_list("channel", "attempt", "ok")) == [
        ("email", 1, True), ("webhook", 1, True)]
    alert.refresh_from_db()
    assert alert.delivered_at is not None


def test_a_channel_that_keeps_failing_is_tried_again_ever_more_slowly_up_to_once_an_hour(settings):
    """A receiver down for days: the job stopped after five tries and the sweeper queued every
    undelivered alert again every five minutes, for ever, each try costing a worker up to a
    timeout. Now each wait doubles, up to an hour, and the sweeper only takes up a try that is
    overdue."""
    settings.ALERT_EMAILS = []
    settings.ALERT_WEBHOOK_URL = f"http://127.0.0.1:{free_port()}/hooks/surety"  # nobody listens
    now = timezone.now()

    def failing_for(task_id, tries, last_try_ago):
        alert = an_alert(task_id, created_at=now - timedelta(days=2))
        AlertDelivery.objects.bulk_create(
            AlertDelivery(alert=alert, channel="webhook", attempt=n, ok=False, detail="NotSent",
                          at=now - last_try_ago - timedelta(minutes=tries - n)) for n in range(1, tries + 1))
        return alert

    sixth = failing_for("refund-sixth", 5, timedelta(seconds=40))
    alert_deliver(sixth.pk)
    assert sixth.deliveries.filter(attempt=6, ok=False).exists()
    [(_, due)] = scheduled_tries(sixth)  # the job goes on trying, after a longer wait
    expected = timezone.now() + retry_delay(6)
    assert expected - timedelta(seconds=2) <= due <= expected + timedelta(seconds=3)

    twentieth = failing_for("refund-twentieth", 20, timedelta(minutes=30))
    alert_deliver(twentieth.pk)
    [(_, due)] = scheduled_tries(twentieth)
    assert due >= timezone.now() + RETRY_MAX - timedelta(seconds=2)

    # The sweeper takes up only what is overdue: an hour and its grace after a 20th failure,
    # not five minutes.
    waiting = failing_for("refund-waiting", 20, timedelta(minutes=30))
    lost = failing_for("refund-lost", 20, RETRY_MAX + timedelta(minutes=6))
    early = failing_for("refund-early", 2, timedelta(minutes=6))  # its 4 s retry lost with Redis
    assert alerts_redeliver_stale() == 2
    queued = set(Alert.objects.filter(redelivery_queued_at__isnull=False).values_list("pk", flat=True))
    assert queued == {lost.pk, early.pk} and waiting.pk not in queued
