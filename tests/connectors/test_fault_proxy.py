"""The fault proxy in front of a real HTTP server (a stdlib one in a thread, counting what it
is sent): each fault does what its name says, to the provider and to the caller."""

import json
import time
from http.server import BaseHTTPRequestHandler

import pytest

from ledger.connectors import http
from ledger.connectors.fault_proxy import FaultProxy
from ledger.connectors.sandbox import SandboxConnector
from ledger.connectors.signed_http import SignedHttpConnector
from ledger.connectors.stripe import StripeConnector
from tests.conftest import thread_server


class _Provider(BaseHTTPRequestHandler):
    """Commits every POST (appends it to the server's `committed`) and answers it with an id."""

    protocol_version = "HTTP/1.1"

    def _reply(self, status, payload):
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802 (http.server's name)
        self._reply(200, {"path": self.path, "host": self.headers["Host"], "committed": len(self.server.committed)})

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.committed.append((self.path, json.loads(body), self.headers.get("Idempotency-Key")))
        self._reply(201, {"id": f"obj_{len(self.server.committed)}"})

    def log_message(self, format, *args):  # noqa: A002
        pass


@pytest.fixture
def provider():
    with thread_server(_Provider) as server:
        server.committed = []
        yield server


@pytest.fixture
def proxy(provider):
    with FaultProxy(f"http://127.0.0.1:{provider.server_port}/api/v1", hold=4) as running:
        yield running


def _post(proxy, n=1):
    return http.call("POST", f"{proxy.url}/refunds", json={"n": n}, headers={"Idempotency-Key": f"k{n}"})


def test_it_forwards_unarmed_requests_with_their_path_and_the_providers_host(proxy, provider):
    assert proxy.url.endswith("/api/v1") and proxy.url != proxy.upstream
    assert _post(proxy) == {"id": "obj_1"}
    assert provider.committed == [("/api/v1/refunds", {"n": 1}, "k1")]
    answer = http.call("GET", f"{proxy.url}/refunds?x=1")
    assert answer == {"path": "/api/v1/refunds?x=1", "host": f"127.0.0.1:{provider.server_port}", "committed": 1}
    assert proxy.staged == []


def test_it_lets_the_provider_commit_then_withholds_the_answer_past_the_callers_deadline(proxy, provider, settings):
    settings.CONNECTOR_TIMEOUT = 1
    proxy.arm("timeout_after_commit")
    started = time.monotonic()
    with pytest.raises(http.OutcomeUnknown) as raised:
        _post(proxy)
    assert raised.value.code == "timeout" and 1 <= time.monotonic() - started < 3
    assert len(provider.committed) == 1
    assert proxy.staged == [{"fault": "timeout_after_commit", "method": "POST", "path": "/api/v1/refunds",
                             "upstream_status": 201, "upstream_body": '{"id": "obj_1"}'}]
    assert _post(proxy, 2) == {"id": "obj_2"}  # armed once: the next write goes through


def test_it_drops_a_lost_request_before_the_provider_sees_it(proxy, provider):
    proxy.arm("lost_before_provider")
    with pytest.raises(http.OutcomeUnknown) as raised:
        _post(proxy)
    assert raised.value.code == "connection_lost"
    assert provider.committed == []
    assert proxy.staged[0]["fault"] == "lost_before_provider" and proxy.staged[0]["upstream_status"] is None


def test_it_answers_500_after_or_before_the_provider_commits(proxy, provider):
    proxy.arm("error_500_after_commit")
    proxy.arm("error_500_before_commit")
    for _ in range(2):
        with pytest.raises(http.OutcomeUnknown) as raised:
            _post(proxy)
        assert raised.value.code == "http_500"
    assert len(provider.committed) == 1
    assert [(s["fault"], s["upstream_status"]) for s in proxy.staged] == [
        ("error_500_after_commit", 201), ("error_500_before_commit", None)]


def test_it_spares_reads_and_faults_only_as_many_writes_as_armed(proxy, provider):
    proxy.arm("error_500_before_commit", times=2)
    assert http.call("GET", f"{proxy.url}/refunds")["committed"] == 0
    for n in (1, 2):
        with pytest.raises(http.OutcomeUnknown):
            _post(proxy, n)
    assert _post(proxy, 3) == {"id": "obj_1"}
    assert len(proxy.staged) == 2


def test_it_answers_502_with_the_reason_when_the_provider_cannot_be_reached():
    with thread_server(_Provider) as gone:
        port = gone.server_port
    with FaultProxy(f"http://127.0.0.1:{port}") as proxy, pytest.raises(http.OutcomeUnknown) as raised:
        _post(proxy)
    assert raised.value.status == 502


def test_it_refuses_an_unknown_fault_and_an_upstream_that_is_no_url():
    with pytest.raises(ValueError, match="unknown fault"):
        FaultProxy("http://127.0.0.1:1").arm("slow")
    with pytest.raises(ValueError, match="base URL"):
        FaultProxy("127.0.0.1:1")


def test_each_http_connector_can_be_pointed_at_the_proxy_and_says_where_it_calls(settings):
    for connector in (SandboxConnector(), SignedHttpConnector(url="http://team.test/hook", secret="s"),
                      StripeConnector(api_key="sk_test_1", api_base="http://stripe.test")):
        moved = connector.through("http://127.0.0.1:9/x")
        assert (type(moved), moved.base_url) == (type(connector), "http://127.0.0.1:9/x")
        assert connector.base_url != moved.base_url
    assert SandboxConnector().base_url == settings.SANDBOX_BASE_URL
