"""The Stripe connector's write (read the charge, then create the refund) and its look-up are held
to one deadline, CONNECTOR_TIMEOUT, and nothing of them is sent after it (ledger.connectors.base,
ledger.connectors.http). Against the Stripe-compatible servers written by others
(tests/connectors/stripe_servers.py), behind a proxy of this file that slows their answers; the
executor runs here, in this process, as in test_stripe_failures.py."""

import socket
import threading
import time

import pytest

from ledger.actions import action_request
from ledger.connectors.stripe import StripeConnector
from ledger.executor import action_claim_next, action_run_claimed
from ledger.models import Action
from tests.conftest import wait_until
from tests.connectors.stripe_servers import stripe_provider  # noqa: F401 (fixture)
from tests.connectors.stripe_stack import API_KEY
from tests.factories import make_agent, send_timed

# What a call may take past its deadline: the cut-off's grace (http._CUT_OFF_GRACE) and a
# loaded test machine's scheduling.
MARGIN = 0.35

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("jobs_to_test_redis")]


class SlowAnswers:
    """A TCP proxy in front of `upstream` (host, port): requests pass at once; each answer is
    held `hold` seconds, then passed on `chunk` bytes every `every` seconds (so that no single
    read waits long: only a deadline for the whole call can end it). `idle()` says whether no
    answer has been on its way for half a second."""

    def __init__(self, upstream, *, hold=0.0, chunk=1 << 20, every=0.0):
        self.upstream, self.hold, self.chunk, self.every = upstream, hold, chunk, every
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self._busy, self._last = 0, time.monotonic()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def idle(self):
        with self._lock:
            return self._busy == 0 and time.monotonic() - self._last > 0.5

    def _mark(self, delta):
        with self._lock:
            self._busy += delta
            self._last = time.monotonic()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client):
        upstream = socket.create_connection(self.upstream)
        asked = threading.Event()  # a request passed whose answer has not started back yet
        threading.Thread(target=self._requests, args=(client, upstream, asked), daemon=True).start()
        try:
            while data := upstream.recv(65536):
                self._mark(+1)
                try:
                    if asked.is_set():
                        asked.clear()
                        time.sleep(self.hold)
                    for start in range(0, len(data), self.chunk):
                        time.sleep(self.every)
                        client.sendall(data[start:start + self.chunk])
                finally:
                    self._mark(-1)
        except OSError:
            pass
        finally:
            client.close()
            upstream.close()

    @staticmethod
    def _requests(client, upstream, asked):
        try:
            while data := client.recv(65536):
                asked.set()
                upstream.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (client, upstream):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.listener.close()


@pytest.fixture
def slowed(settings, stripe_provider):  # noqa: F811
    """Makes a proxy that slows `stripe_provider`'s answers, and the refund connector Stripe's through it."""
    proxies = []

    def slowed(**slowness):
        proxy = SlowAnswers(("127.0.0.1", int(stripe_provider.url.rsplit(":", 1)[1])), **slowness)
        proxies.append(proxy)
        settings.SURETY_CONNECTORS = {**settings.SURETY_CONNECTORS, "refund": {
            "class": "ledger.connectors.stripe.StripeConnector",
            "options": {"api_key": API_KEY, "api_base": proxy.url}}}
        return proxy

    yield slowed
    for proxy in proxies:
        proxy.close()


def claim(action):
    return wait_until(lambda: action_claim_next("tests", only=action.pk), seconds=10, message="a claim")


def run_timed(action, monkeypatch):
    """Runs the claimed action; answers how long the connector's send took."""
    with send_timed(monkeypatch, StripeConnector) as took:
        action_run_claimed(action)
    return took[0]


def refund_of(charge, key):
    agent = make_agent(f"billing-{key.rsplit('-', 1)[1]}")[0]
    return action_request(agent=agent, operation_key=key, action_type="refund", target=charge,
                          params={"amount": "25.00", "currency": "EUR"})[0]


def test_a_charge_read_stripe_answers_a_little_at_a_time_ends_the_write_at_the_deadline_and_no_refund_is_sent(
        settings, stripe_provider, slowed, monkeypatch):  # noqa: F811
    # The reviewer's case: each read of the answer comes well inside the SDK client's per-read
    # timeout, and the read took 2.7 s with CONNECTOR_TIMEOUT at 0.5; the refund went after it.
    settings.CONNECTOR_TIMEOUT = 0.5
    charge = stripe_provider.charge(10000, "eur")
    proxy = slowed(chunk=100, every=0.1)  # a charge of a few KiB: some seconds
    action = claim(refund_of(charge, f"refund:{charge}:full:dec-1"))
    took = run_timed(action, monkeypatch)
    wait_until(proxy.idle, seconds=20, message="the proxy passing on no answer")
    assert stripe_provider.refunds(charge) == []
    assert took < settings.CONNECTOR_TIMEOUT + MARGIN
    action = Action.objects.get(pk=action.pk)
    # Only the read was under way: nothing was written, so it is tried again later.
    assert (action.status, action.evidence[-1]["code"]) == ("queued", "timeout")


def test_the_charge_read_and_the_refund_share_one_deadline(settings, stripe_provider, slowed,  # noqa: F811
                                                            monkeypatch):
    # Each answer alone comes well inside CONNECTOR_TIMEOUT; the two together do not.
    settings.CONNECTOR_TIMEOUT = 1.0
    charge = stripe_provider.charge(10000, "eur")
    slowed(hold=0.7)
    key = f"refund:{charge}:full:dec-2"
    action = claim(refund_of(charge, key))
    assert run_timed(action, monkeypatch) < settings.CONNECTOR_TIMEOUT + MARGIN  # a deadline a call: 1.4 s
    action = Action.objects.get(pk=action.pk)
    # The refund went out at 0.7 s, inside the deadline, and its answer was cut off: the outcome
    # is unknown, and the look-up, CONNECTOR_TIMEOUT later, finds the one refund it made.
    assert (action.status, action.evidence[-1]["code"]) == ("unknown", "timeout")
    action_run_claimed(claim(action))
    action = Action.objects.get(pk=action.pk)
    assert action.evidence[-1]["found"] is True
    [refund] = stripe_provider.refunds(charge)
    assert refund["metadata"]["operation_key"] == key
