"""A worker's own thread through a database blip: the jobs RQ runs there (an alert's delivery, a
reconciliation's finish, a bulk redrive, a replay run; the drain jobs run in lanes of their own)
keep one persistent connection between jobs. Every connection to the test database terminated
(what a failover or a restarted pooler does) after such a job: the next ones must still run.
Before, the first job after the blip met the dead connection and failed; one whose first
statement ran outside a transaction (a reconciliation's finish) left it broken and unclosed, and
every job on that thread failed with it until the worker was restarted."""

from datetime import timedelta
from http.server import BaseHTTPRequestHandler

from django.utils import timezone

import pytest
from django.db import connection, transaction

from dlq.incidents import ReconciliationRun
from dlq.models import Alert, DeadLetter
from dlq.reconcile import run_finish
from ledger.jobs import enqueue
from ledger.models import Task
from tests.conftest import thread_server, wait_until
from tests.factories import make_agent

pytestmark = pytest.mark.chaos


def raised(name):
    """A dead-letter entry's alert (operations only), delivered by a job once committed."""
    agent, _ = make_agent(f"agent-{name}")
    task = Task.objects.create(task_id=name, fingerprint="x", workflow="refund", input={}, agent=agent,
                               max_attempts=3, state="dead_lettered", attempts=3)
    with transaction.atomic():
        entry = DeadLetter.objects.create(task=task, snapshot={}, last_error={"retryable": True}, attempts=3)
        return Alert.objects.raise_for(entry)


def delivered(alerts):
    return Alert.objects.filter(pk__in=[alert.pk for alert in alerts], delivered_at__isnull=False).count()


def test_jobs_on_the_workers_own_thread_run_again_after_every_connection_was_terminated(stack, tmp_path):
    posts = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            self.rfile.read(int(self.headers["Content-Length"]))
            posts.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    log = tmp_path / "worker.log"
    with thread_server(Receiver) as receiver:
        worker = stack.start_worker(log=log, ALERT_WEBHOOK_URL=f"{receiver.url}/hooks/surety", ALERT_EMAILS="")
        before = [raised("before-the-blip")]
        wait_until(lambda: delivered(before), seconds=30, message="the first alert to be delivered")

        with connection.cursor() as cursor:
            cursor.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                           "WHERE datname = current_database() AND pid <> pg_backend_pid()")
            assert cursor.fetchone()[0] > 0

        # A finished run's finish (the sweeper's second job for it) only reads the run, outside a transaction.
        now = timezone.now()
        enqueue(run_finish, ReconciliationRun.objects.create(since=now - timedelta(hours=1), until=now, finished_at=now,
                                                             complete=True).pk)
        after = [raised(f"after-the-blip-{i}") for i in range(2)]
        wait_until(lambda: delivered(after) == len(after), seconds=30,
                   message=f"the alerts raised after the blip to be delivered; the worker's log:\n{log.read_text()[-3000:]}")
    assert len(posts) == 3
    assert worker.poll() is None
