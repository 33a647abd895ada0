import hashlib
import hmac
import json

import httpx

from ledger.sandbox import webhooks


def test_it_signs_the_timestamp_and_raw_body():
    body = b'{"id": "evt_1"}'
    expected = hmac.new(b"whsec", b'1700000000.{"id": "evt_1"}', hashlib.sha256).hexdigest()
    assert webhooks.sign_webhook(body, "whsec", timestamp=1700000000) == f"t=1700000000,v1={expected}"


def test_it_signs_with_the_current_time_by_default(monkeypatch):
    monkeypatch.setattr(webhooks.time, "time", lambda: 1700000123.9)
    assert webhooks.sign_webhook(b"{}", "whsec").startswith("t=1700000123,v1=")


def test_it_posts_a_signed_event(settings, monkeypatch):
    settings.SANDBOX_WEBHOOK_SECRET = "whsec-test"
    settings.CONNECTOR_TIMEOUT = 3
    sent = {}

    def post(url, *, content, headers, timeout):
        sent.update(url=url, content=content, headers=headers, timeout=timeout)
        return httpx.Response(200)

    monkeypatch.setattr(webhooks.httpx, "post", post)
    response = webhooks.send_webhook("refund.succeeded", {"id": "re_1"}, "http://testserver/webhooks/sandbox/")

    assert response.status_code == 200
    event = json.loads(sent["content"])
    assert event["id"].startswith("evt_")
    assert (event["type"], event["data"]) == ("refund.succeeded", {"id": "re_1"})
    timestamp = sent["headers"]["Sandbox-Signature"].split(",")[0].removeprefix("t=")
    assert sent["headers"]["Sandbox-Signature"] == webhooks.sign_webhook(sent["content"], "whsec-test", int(timestamp))
    assert sent["timeout"] == 3
