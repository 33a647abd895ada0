import hashlib
import hmac
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sandbox import webhooks
from ledger.webhooks import signature_valid


def test_it_signs_the_timestamp_and_raw_body():
    body = b'{"id": "evt_1"}'
    expected = hmac.new(b"whsec", b'1700000000.{"id": "evt_1"}', hashlib.sha256).hexdigest()
    assert webhooks.sign_webhook(body, "whsec", timestamp=1700000000) == f"t=1700000000,v1={expected}"


def test_it_signs_with_the_current_time_by_default(monkeypatch):
    monkeypatch.setattr(time, "time", lambda: 1700000123.9)
    assert webhooks.sign_webhook(b"{}", "whsec").startswith("t=1700000123,v1=")


@pytest.fixture
def receiver():
    """A real HTTP server on 127.0.0.1 (random port) that records every request it gets."""
    received = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            received.append({"path": self.path, "headers": dict(self.headers), "body": body})
            self.send_response(202)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_it_posts_a_signed_event(settings, receiver):
    settings.SANDBOX_WEBHOOK_SECRET = "whsec-test"
    settings.CONNECTOR_TIMEOUT = 3
    url, received = receiver

    response = webhooks.send_webhook("refund.succeeded", {"id": "re_1"}, f"{url}/webhooks/sandbox/")

    assert response.status_code == 202  # the receiver's own answer, handed back to the caller
    assert len(received) == 1
    request = received[0]
    assert request["path"] == "/webhooks/sandbox/"
    assert request["headers"]["Content-Type"] == "application/json"
    event = json.loads(request["body"])
    assert event["id"].startswith("evt_")
    assert (event["type"], event["data"]) == ("refund.succeeded", {"id": "re_1"})
    signature = request["headers"]["Sandbox-Signature"]
    # The receiving side's own check accepts it over the exact bytes that crossed the wire...
    assert signature_valid(signature, request["body"], "whsec-test")
    # ...and refuses it under another secret or over a changed body.
    assert not signature_valid(signature, request["body"], "whsec-other")
    assert not signature_valid(signature, request["body"] + b" ", "whsec-test")


def test_each_event_gets_its_own_id(settings, receiver):
    settings.SANDBOX_WEBHOOK_SECRET = "whsec-test"
    url, received = receiver
    webhooks.send_webhook("message.sent", {}, url)
    webhooks.send_webhook("message.sent", {}, url)
    ids = {json.loads(r["body"])["id"] for r in received}
    assert len(ids) == 2


def test_it_gives_up_after_the_connector_timeout(settings):
    """A receiver that never answers: the call fails within CONNECTOR_TIMEOUT, not forever."""
    import socket
    import time

    import httpx

    settings.CONNECTOR_TIMEOUT = 0.3
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)  # accepts the connection at the kernel level, never replies
        started = time.monotonic()
        with pytest.raises(httpx.TimeoutException):
            webhooks.send_webhook("refund.succeeded", {}, f"http://127.0.0.1:{listener.getsockname()[1]}/")
        assert time.monotonic() - started < 3
