"""The one pooled HTTP client (ledger.connectors.http) serves every agent's and every connector's
calls, so it keeps no cookie: a session a provider set in answer to one call must not ride along
on the next, which may carry another credential; nor does a replay run's fault proxy, so that the
replay calls as production does. A real HTTP server (the standard library's) sets cookies and
records what each request brought."""

import contextlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ledger.connectors import http
from ledger.connectors.fault_proxy import FaultProxy


class CookieSetter(BaseHTTPRequestHandler):
    """Answers every request 200 with a session cookie (and a load balancer's pin), and records
    the Cookie header each request came with."""

    protocol_version = "HTTP/1.1"  # keep-alive: the calls share one pooled connection, as in production
    seen = []

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.seen.append(self.headers.get("Cookie"))
        body = b'{"id": "re_1"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Set-Cookie", f"session=for-call-{len(self.seen)}; Path=/; HttpOnly")
        self.send_header("Set-Cookie", "lb_pin=node-7; Path=/")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def provider():
    CookieSetter.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), CookieSetter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("through_the_fault_proxy", [False, True])
def test_a_cookie_a_provider_sets_is_never_sent_back(provider, through_the_fault_proxy):
    with FaultProxy(provider) if through_the_fault_proxy else contextlib.nullcontext() as proxy:
        base = proxy.url if proxy else provider
        for key in ("refund-a", "refund-b", "refund-c"):
            assert http.call("POST", f"{base}/v1/refunds", json={"key": key}) == {"id": "re_1"}

    assert CookieSetter.seen == [None, None, None]
    assert not http._client().cookies  # nothing kept for a later call either
