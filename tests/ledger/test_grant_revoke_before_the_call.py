"""A revoke and a call under the grant are ordered (ledger.grants.grant_lapsed_now): a worker looks
at the grant once more right before its call, after its claim committed, and a revoke, once
committed, waits until no action under the grant is claimed with its lease running. A revoke
committed after an action was claimed, before its call, is seen there and nothing is sent; a revoke
made while a call is at the provider returns only after the call did, and a call claimed before the
revoke that would start meanwhile sees it. Two real transactions, in threads, on PostgreSQL; the
provider a real HTTP server."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler

import pytest
from django.db import connection

from ledger.actions import action_request
from ledger.executor import action_claim_next, action_run_claimed
from ledger.grants import agent_revoke, capability
from ledger.models import Action, ActionStatus, Capability
from tests.conftest import thread_server, wait_until
from tests.factories import audit_events

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("jobs_to_test_redis"),
]
REFUND = Capability.Kind.ACTION_TYPE, "refund"


class Provider:
    """The refunds the sandbox connector sends, as a real HTTP server receives them; while `held`,
    each answer waits until the test releases it (well inside CONNECTOR_TIMEOUT)."""

    def __init__(self):
        self.keys, self.answered_at = [], []
        self.held, self.release = threading.Event(), threading.Event()

    def handler(self):
        provider = self

        class Refunds(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                provider.keys.append(body["metadata"]["operation_key"])
                if provider.held.is_set():
                    provider.release.wait(10)
                answer = json.dumps({"id": f"re_{len(provider.keys)}", "status": "succeeded"}).encode()
                provider.answered_at.append(time.monotonic())
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


def claimed(agent, key):
    action, _ = action_request(agent=agent, operation_key=key, action_type="refund", target=f"ORD-{key}",
                               params={"amount": "5.00", "currency": "EUR"})
    claim = action_claim_next("tests:1", only=action.pk)
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


def test_a_revoke_committed_after_the_claim_stops_the_call(provider, agent):
    action = claimed(agent, "refund:ORD-1:dec-1")
    # The action is pending, its lease held: the claim's own check is behind the revoke, which
    # waits for the action to settle.
    revoking = InThread(revoke, agent)
    wait_until(lambda: audit_events(agent, "revoked").exists(), seconds=10, message="the revoke to commit")

    action_run_claimed(action)

    revoking.join(5)
    assert not revoking.is_alive() and revoking.failed is None, revoking.failed
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

    revoking = InThread(revoke, agent)
    wait_until(lambda: audit_events(agent, "revoked").exists(), seconds=10, message="the revoke to commit")
    # Claimed before the revoke, its call would start now: it sees the revoke and is cancelled.
    also_sending = InThread(action_run_claimed, second)
    also_sending.join(10)
    assert not also_sending.is_alive() and also_sending.failed is None, also_sending.failed
    assert provider.keys == [first.operation_key]
    time.sleep(0.5)
    assert revoking.is_alive(), "the revoke returned while a call under the grant was at the provider"

    provider.release.set()
    for thread in (sending, revoking):
        thread.join(15)
        assert not thread.is_alive() and thread.failed is None, thread.failed
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
