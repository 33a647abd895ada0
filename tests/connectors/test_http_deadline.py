"""No byte of a request leaves for the provider after its call's deadline (ledger.connectors.http):
real sockets, servers in threads of this process on free ports, no mock of httpx. A provider
that takes a request's body slowly never gets it whole once the deadline passed, and a
connection that a slow resolver made late carries nothing; calls made inside one deadline
share it, and a connector's write never outlasts its claim's lease."""

import socket
import threading
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from ledger.connectors import http
from ledger.connectors.base import write_permit
from ledger.connectors.sandbox import SandboxConnector
from ledger.models import ActionStatus
from tests.factories import make_action, make_agent

# What the call may take past its deadline: the cut-off's grace (http._CUT_OFF_GRACE) and a
# loaded test machine's scheduling.
MARGIN = 0.35


def _read_head(conn):
    head = b""
    while b"\r\n\r\n" not in head:
        data = conn.recv(65536)
        if not data:
            return head, b""
        head += data
    head, _, rest = head.partition(b"\r\n\r\n")
    return head, rest


def _content_length(head):
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


class SlowReader:
    """A provider that reads a request's body 4 KiB every 20 ms (each read well inside any
    per-write timeout), through a receive buffer kept small, and answers 200 only once it has
    the whole body. `seen` holds, per connection, how much of the body came and whether all."""

    def __init__(self):
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)  # inherited by accept()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen()
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.seen = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        conn, _ = self.listener.accept()
        with conn:
            head, body = _read_head(conn)
            length, received = _content_length(head), len(body)
            try:
                while received < length:
                    time.sleep(0.02)
                    data = conn.recv(4096)
                    if not data:
                        break
                    received += len(data)
            except OSError:  # reset: the caller cut its call off
                pass
            self.seen.append({"received": received, "whole": received >= length > 0})
            if received >= length:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")

    def close(self):
        self.listener.close()


class Listener:
    """A raw TCP server on a free port: each connection is handed to `handle` on a thread of its own."""

    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self.handle, args=(conn,), daemon=True).start()

    def close(self):
        self.listener.close()


class Recorder(Listener):
    """A provider that keeps every byte each connection brings, and answers nothing."""

    def __init__(self):
        self.received = []
        super().__init__()

    def handle(self, conn):
        conn.settimeout(5)
        with conn:
            while True:
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                self.received.append(data)


class Holder(Listener):
    """A provider that answers every request 200, `hold` seconds after it came; `requests`
    counts those that came whole."""

    def __init__(self, hold):
        self.hold = hold
        self.requests = 0
        super().__init__()

    def handle(self, conn):
        with conn:
            try:
                while True:
                    head, body = _read_head(conn)
                    if not head:
                        return
                    length = _content_length(head)
                    while len(body) < length:
                        body += conn.recv(65536)
                    self.requests += 1
                    time.sleep(self.hold)
                    conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n'
                                 b'{"id": "x1"}')
            except OSError:
                return


@pytest.fixture
def slow_reader():
    provider = SlowReader()
    yield provider
    provider.close()


@pytest.fixture
def recorder():
    provider = Recorder()
    yield provider
    provider.close()


@pytest.fixture
def holder():
    provider = Holder(hold=0.6)
    yield provider
    provider.close()


def test_a_body_the_provider_reads_slowly_is_cut_off_at_the_deadline_and_never_arrives_whole(settings, slow_reader):
    # 400 KiB at 4 KiB per 20 ms takes the provider some 2 s: httpx's write timeout, which holds
    # per write, never fires, and before the fix the body went on arriving long after the caller
    # gave up (the whole of it, from the kernel's send buffer, even once httpx had closed).
    settings.CONNECTOR_TIMEOUT = 0.5
    started = time.monotonic()
    with pytest.raises(http.OutcomeUnknown) as caught:
        http.call("POST", f"{slow_reader.url}/refunds", content=b"x" * 400 * 1024,
                  headers={"Content-Type": "application/octet-stream"})
    assert time.monotonic() - started < settings.CONNECTOR_TIMEOUT + MARGIN
    assert caught.value.code == "timeout"  # some of it was sent: the outcome is unknown
    slow_reader.thread.join(10)  # the provider has read all it will ever get
    [seen] = slow_reader.seen
    assert not seen["whole"], seen
    assert seen["received"] < 400 * 1024


def test_a_connection_a_slow_resolver_made_after_the_deadline_carries_nothing(settings, recorder, monkeypatch):
    # The resolver has no timeout at all: before the fix, the call's thread connected when it
    # answered, after the caller had given up, and sent the whole request.
    resolve = socket.getaddrinfo

    def slow_resolver(host, port, *args, **kwargs):
        if host == "slow-resolver.test":
            time.sleep(0.8)
            host = "127.0.0.1"
        return resolve(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", slow_resolver)
    settings.CONNECTOR_TIMEOUT = 0.5
    started = time.monotonic()
    with pytest.raises(http.ProviderError) as caught:
        http.call("POST", f"http://slow-resolver.test:{recorder.port}/refunds", json={"amount": "1.00"})
    assert time.monotonic() - started < settings.CONNECTOR_TIMEOUT + MARGIN
    time.sleep(max(0.0, started + 1.8 - time.monotonic()))  # well past the resolver's answer
    assert b"".join(recorder.received) == b""
    # Provably never sent, so safe to try again.
    assert (type(caught.value), caught.value.code) == (http.NotSent, "connect_failed")


def test_calls_made_inside_one_deadline_share_it(settings, holder):
    settings.CONNECTOR_TIMEOUT = 5
    started = time.monotonic()
    with http.deadline(1.0), pytest.raises(http.OutcomeUnknown) as caught:
        assert http.call("GET", f"{holder.url}/charges/ch_1") == {"id": "x1"}  # 0.6 s
        http.call("POST", f"{holder.url}/refunds", json={"amount": "1.00"})  # sent at 0.6 s, cut off at 1 s
    assert 1.0 <= time.monotonic() - started < 1.0 + MARGIN
    assert caught.value.code == "timeout"
    with http.deadline(1.0):  # an enclosing deadline that is sooner wins
        with http.deadline(30), pytest.raises(http.OutcomeUnknown):
            http.call("GET", f"{holder.url}/charges/ch_1")
            http.call("GET", f"{holder.url}/charges/ch_1")
    with http.deadline(0), pytest.raises(http.NotSent) as passed:  # nothing is started once it passed
        http.call("POST", f"{holder.url}/refunds", json={"amount": "1.00"})
    assert passed.value.code == "deadline_passed"
    assert holder.requests == 4


@pytest.mark.django_db
def test_a_write_never_outlasts_its_claims_lease(settings, holder):
    # A worker that stalled after the executor's look at its lease gets only what is left of it:
    # 1.5 s, time enough to send the request on a loaded machine (with 0.4 s it at times ended
    # NotSent, unconnected); a call held to CONNECTOR_TIMEOUT instead takes the provider's 3 s.
    settings.CONNECTOR_TIMEOUT = 5
    holder.hold = 3
    agent, _ = make_agent("billing", grants=())
    action = make_action(agent, ActionStatus.QUEUED, key="refund:ORD-D1:full:dec-1", target="ORD-D1")
    action = action.claim(owner="host:tests")
    action.lease_expires_at = timezone.now() + timedelta(seconds=1.5)
    started = time.monotonic()
    with write_permit(action), pytest.raises(http.OutcomeUnknown):
        SandboxConnector(base_url=holder.url).perform(action)
    assert time.monotonic() - started < 1.5 + MARGIN
