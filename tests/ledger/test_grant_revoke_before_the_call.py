"""A revoke and a call under the grant are ordered (ledger.grants.grant_lapsed_now): a worker looks
at the grant once more right before its call, after its claim committed, and a revoke, once
committed, waits until no action under the grant is claimed with its lease running. A revoke
committed after an action was claimed, before its call, is seen there and nothing is sent; a revoke
made while a call is at the provider returns only after the call did, and a call claimed before the
revoke that would start meanwhile sees it; a wait the database cuts short leaves the revoke made and
answered. Two real transactions, in threads, on PostgreSQL; the provider a real HTTP server."""

import json
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler

import psycopg
import pytest
from django.db import connection, transaction
from django.urls import reverse
from django.utils import timezone

from ledger.actions import action_request, action_retry
from ledger.executor import action_claim_next, action_run_claimed
from ledger.grants import agent_revoke, capability, grant_state
from ledger.models import Action, ActionStatus, Agent, Capability
from tests.conftest import _database_url, thread_server, wait_until
from tests.factories import audit_events, confirmed_absent, host_clock_off_by, person

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("jobs_to_test_redis"),
]
REFUND = Capability.Kind.ACTION_TYPE, "refund"


class Provider:
    """The refunds the sandbox connector sends, as a real HTTP server receives them, and its looks
    for a refund by key (`looks`), each answered "none"; while `held`, each answer waits until the
    test releases it (well inside CONNECTOR_TIMEOUT)."""

    def __init__(self):
        self.keys, self.looks, self.answered_at = [], [], []
        self.held, self.release = threading.Event(), threading.Event()

    def wait_if_held(self):
        if self.held.is_set():
            self.release.wait(10)

    def handler(self):
        provider = self

        class Refunds(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                provider.looks.append(self.path)
                provider.wait_if_held()
                self.answer({"data": []})

            def do_POST(self):  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                provider.keys.append(body["metadata"]["operation_key"])
                provider.wait_if_held()
                provider.answered_at.append(time.monotonic())
                self.answer({"id": f"re_{len(provider.keys)}", "status": "succeeded"})

            def answer(self, body):
                answer = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format, *args):  # noqa: A002
                pass

        return Refunds


@pytest.fixture
def provider(settings):
    settings.CONNECTOR_TIMEOUT, settings.LEASE_SECONDS, settings.LEASE_MARGIN_SECONDS = 5, 30, 1
    found = Provider()
    with thread_server(found.handler()) as server:
        settings.SANDBOX_BASE_URL = f"{server.url}/sandbox/v1"
        yield found
        found.release.set()


def recorded(agent, key):
    return action_request(agent=agent, operation_key=key, action_type="refund", target=f"ORD-{key}",
                          params={"amount": "5.00", "currency": "EUR"})[0]


def claimed(agent, key):
    claim = action_claim_next("tests:1", only=recorded(agent, key).pk)
    assert claim.status == ActionStatus.PENDING
    return claim


def revoke(agent):
    agent_revoke(agent, capability(*REFUND), actor="system:tests", reason="the agent misbehaved")


class InThread(threading.Thread):
    """`call(*args)` on a thread of its own, with a database connection of its own; `done_at`, when
    it returned (time.monotonic), and what it raised, if anything, as `failed`."""

    def __init__(self, call, *args):
        super().__init__(daemon=True)
        self.call, self.args, self.done_at, self.failed = call, args, None, None
        self.start()

    def run(self):
        try:
            self.call(*self.args)
        except Exception as exc:  # noqa: BLE001 (the test reports it)
            self.failed = exc
        finally:
            self.done_at = time.monotonic()
            connection.close()


def revoke_committed(agent):
    """A revoke on a thread of its own, once it has committed (it may still be waiting)."""
    revoking = InThread(revoke, agent)
    committed(agent)
    return revoking


def committed(agent):
    wait_until(lambda: audit_events(agent, "revoked").exists(), seconds=10, message="the revoke to commit")


def still_waiting(thread, what="a call under the grant was at the provider"):
    time.sleep(0.5)
    assert thread.is_alive(), f"the revoke returned while {what}"


def joined(*threads, seconds=15):
    for thread in threads:
        thread.join(seconds)
        assert not thread.is_alive() and thread.failed is None, thread.failed


def test_a_revoke_committed_after_the_claim_stops_the_call(provider, agent):
    action = claimed(agent, "refund:ORD-1:dec-1")
    # The action is pending, its lease held: the claim's own check is behind the revoke, which
    # waits for the action to settle.
    revoking = revoke_committed(agent)

    action_run_claimed(action)

    joined(revoking, seconds=5)
    assert provider.keys == []
    row = Action.objects.get(pk=action.pk)
    assert (row.status, row.external_ref) == (ActionStatus.CANCELLED, "")
    assert audit_events(row, "cancelled").get().reason.startswith("grant revoked")
    assert "never sent" in audit_events(row, "requeued").get().reason


def test_a_revoke_waits_for_the_call_under_way_and_a_call_after_it_is_stopped(provider, agent):
    first, second = claimed(agent, "refund:ORD-1:dec-1"), claimed(agent, "refund:ORD-2:dec-2")
    provider.held.set()
    sending = InThread(action_run_claimed, first)
    wait_until(lambda: provider.keys, seconds=10, message="the first call to reach the provider")

    revoking = revoke_committed(agent)
    # Claimed before the revoke, its call would start now: it sees the revoke and is cancelled.
    also_sending = InThread(action_run_claimed, second)
    joined(also_sending, seconds=10)
    assert provider.keys == [first.operation_key]
    still_waiting(revoking)

    provider.release.set()
    joined(sending, revoking)
    assert revoking.done_at > provider.answered_at[0]  # the call returned first
    assert provider.keys == [first.operation_key]  # the second never reached it
    assert Action.objects.get(pk=first.pk).status == ActionStatus.SUCCEEDED
    row = Action.objects.get(pk=second.pk)
    assert row.status == ActionStatus.CANCELLED
    assert audit_events(row, "cancelled").get().reason.startswith("grant revoked")


def test_a_revoke_waits_for_a_dead_workers_claim_no_longer_than_its_lease(provider, agent, settings):
    """A worker that died after its claim may have sent the call: the revoke waits for its lease to
    run out (the action is then verified by whoever takes it over), and not a moment past it."""
    settings.LEASE_SECONDS = 2
    action = claimed(agent, "refund:ORD-1:dec-1")  # and its worker is never heard of again
    started = time.monotonic()

    revoke(agent)

    waited = time.monotonic() - started
    assert action.lease_left() <= 0 and waited < settings.LEASE_SECONDS + 2, waited
    assert Action.objects.get(pk=action.pk).status == ActionStatus.PENDING  # the sweeper's to verify


def test_a_revoke_in_a_callers_transaction_waits_at_its_commit_for_a_call_begun_meanwhile(provider, agent):
    """Made within a caller's transaction, the revoke is seen by no worker until that transaction
    commits: a call may pass its last look meanwhile. The wait is the commit's, which returns only
    once that call has."""
    action = claimed(agent, "refund:ORD-1:dec-1")
    revoked, commit = threading.Event(), threading.Event()

    def revoke_then_commit():
        with transaction.atomic():
            revoke(agent)
            revoked.set()
            commit.wait(10)

    committing = InThread(revoke_then_commit)
    assert revoked.wait(10)
    provider.held.set()
    sending = InThread(action_run_claimed, action)  # the revoke is not committed: the look passes
    wait_until(lambda: provider.keys, seconds=10, message="the call to reach the provider")
    commit.set()
    committed(agent)
    still_waiting(committing)  # the caller's commit

    provider.release.set()
    joined(sending, committing)
    assert committing.done_at > provider.answered_at[0]
    assert Action.objects.get(pk=action.pk).status == ActionStatus.SUCCEEDED


def test_a_retried_failure_is_stopped_by_a_revoke_committed_while_it_looks_first(provider, agent):
    """A failure tried again asks the provider first, within its claim (decision 59). A revoke
    committed during that look waits for the action, and the look at the grant comes after the look
    at the provider: the effect found absent, nothing is sent all the same."""
    failed = confirmed_absent(recorded(agent, "refund:ORD-1:dec-1"))
    retried = action_retry(failed, actor="system:tests", reason="the customer still waits")
    action = action_claim_next("tests:1", only=retried.pk)
    assert action.status == ActionStatus.PENDING and action.error  # it looks first
    provider.held.set()
    sending = InThread(action_run_claimed, action)
    wait_until(lambda: provider.looks, seconds=10, message="the look to reach the provider")

    revoking = revoke_committed(agent)
    still_waiting(revoking, "an action under the grant was being looked for")
    provider.release.set()

    joined(sending, revoking)
    assert provider.keys == []
    row = Action.objects.get(pk=action.pk)
    assert row.status == ActionStatus.CANCELLED
    assert audit_events(row, "cancelled").get().reason.startswith("grant revoked")
    assert row.evidence[-1]["looked_first"]["found"] is False


@pytest.mark.skipif(connection.vendor != "postgresql", reason="on SQLite the host's clock is the database's")
def test_a_revoke_on_a_host_whose_clock_runs_ahead_waits_for_the_call_all_the_same(provider, agent, monkeypatch):
    """The leases the revoke waits on are told by the database's clock (decision 57): on its own
    host's clock, a minute ahead, the lease of the call under way ended long ago."""
    action = claimed(agent, "refund:ORD-1:dec-1")
    provider.held.set()
    sending = InThread(action_run_claimed, action)
    wait_until(lambda: provider.keys, seconds=10, message="the call to reach the provider")
    host_clock_off_by(monkeypatch, 60)  # the revoking process's host
    assert timezone.now() > action.lease_expires_at

    revoking = revoke_committed(agent)
    still_waiting(revoking)

    provider.release.set()
    joined(sending, revoking)
    assert revoking.done_at > provider.answered_at[0]


def test_a_revoke_that_stops_waiting_on_a_longer_lease_says_so(provider, agent, settings, caplog):
    """Workers run with a longer LEASE_SECONDS than the revoking process: it waits its own lease's
    length, then returns, and the log says what it did not wait for."""
    action = claimed(agent, "refund:ORD-1:dec-1")  # a 30-second lease, its worker gone
    settings.LEASE_SECONDS, settings.LEASE_MARGIN_SECONDS = 0.5, 0.5

    with caplog.at_level("WARNING", logger="surety.grants"):
        revoke(agent)

    assert action.lease_left() > 0
    assert "actions still claimed" in caplog.text


@contextmanager
def the_wait_cut_off():
    """The database ends the connection of the revoke's wait at its first look for claimed actions
    (pg_terminate_backend, as a failover or a restarted pooler does): a real error, mid-wait.
    Yields the backend ended, once it is."""
    cut = []

    def end_the_connection_at_the_wait(execute, sql, params, many, context):
        if not cut and '"lease_expires_at" >' in sql:
            cut.append(context["connection"].connection.info.backend_pid)
            with psycopg.connect(_database_url(), autocommit=True) as other:
                other.execute("SELECT pg_terminate_backend(%s, 5000)", cut)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(end_the_connection_at_the_wait):
        yield cut


def revoked_and_said_so(agent, cut, log):
    assert cut, "the wait never looked"
    assert audit_events(agent, "revoked").exists()  # on a fresh connection
    assert grant_state(Agent.objects.get(pk=agent.pk), *REFUND) is None
    assert "the wait for the calls under the grant was cut short" in log and "the revoke is committed" in log


def test_a_revoke_whose_wait_the_database_cuts_short_returns_and_says_so(agent, caplog):
    """The revoke has committed when it waits: the database failing the wait made it raise, and its
    caller took the revoke for undone. It returns, and the log says what it did not wait for."""
    claimed(agent, "refund:ORD-1:dec-1")  # its lease running: the revoke waits
    started = time.monotonic()
    with caplog.at_level("WARNING", logger="surety.grants"), the_wait_cut_off() as cut:
        revoke(agent)

    assert time.monotonic() - started < 5  # not the lease's length
    revoked_and_said_so(agent, cut, caplog.text)


def test_the_agents_page_answers_a_revoke_whose_wait_the_database_cut_short(agent, client, caplog):
    """Before, the page answered 503 ("nothing was half-written, send it again") for a revoke that
    was made; the connection the wait lost is replaced for the rest of the request."""
    client.force_login(person("ada", "admins"))
    claimed(agent, "refund:ORD-1:dec-1")
    with caplog.at_level("WARNING", logger="surety.grants"), the_wait_cut_off() as cut:
        page = client.post(reverse("agent-change", args=[agent.pk, "revoke"]),
                           {"capability": "refund", "reason": "the agent misbehaved"}, follow=True)

    assert page.status_code == 200
    assert "revoke refund for billing: done." in page.content.decode()
    revoked_and_said_so(agent, cut, caplog.text)
