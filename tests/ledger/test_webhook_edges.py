"""The edges of /webhooks/{connector}/: a body too large to read and a connector segment that is no
name are answered as the contract's webhook refusals are, a problem (application/problem+json), not
Django's HTML pages; a body too large is `413`, which tells the provider that sending it again as it
is will not help, where a `400` reads as the event refused."""

import json
import logging
import time

import pytest

from ledger.models import WebhookEvent
from sandbox.webhooks import sign_webhook

SECRET = "whsec-edges"
URL = "/webhooks/sandbox/"
pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def webhook_secret(settings):
    settings.SANDBOX_ENABLED = True
    settings.SANDBOX_WEBHOOK_SECRET = SECRET


def assert_problem(answer, status, code):
    assert answer.status_code == status, answer.content
    assert answer["Content-Type"] == "application/problem+json"
    assert answer.json()["code"] == code, answer.json()


def test_a_signed_body_above_the_upload_limit_is_refused_as_too_large_and_logged(client, settings, caplog):
    event = {"id": "evt_big", "type": "refund.succeeded", "data": {"id": "re_1", "padding": "x" * 3_000_000}}
    body = json.dumps(event).encode()
    assert len(body) > settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    with caplog.at_level(logging.WARNING, logger="surety.webhooks"):
        answer = client.generic("POST", URL, body, content_type="application/json",
                                headers={"Sandbox-Signature": sign_webhook(body, SECRET, time.time())})
    assert_problem(answer, 413, "invalid")
    assert str(settings.DATA_UPLOAD_MAX_MEMORY_SIZE) in answer.json()["detail"]
    assert "webhook refused (413)" in caplog.text
    assert not WebhookEvent.objects.exists()


def test_a_content_length_above_the_upload_limit_is_refused_without_reading_the_body(client, settings):
    body = b'{"id": "evt_small", "type": "refund.created", "data": {}}'
    answer = client.generic("POST", URL, body, content_type="application/json",
                            CONTENT_LENGTH=str(3 * 1024 * 1024),
                            headers={"Sandbox-Signature": sign_webhook(body, SECRET, time.time())})
    assert_problem(answer, 413, "invalid")
    assert not WebhookEvent.objects.exists()


@pytest.mark.parametrize("path", ["/webhooks/%C3%A9/", "/webhooks/a.b/", "/webhooks/", "/webhooks/sandbox/x/"])
def test_a_webhook_url_it_does_not_serve_is_a_problem_not_a_page(client, path):
    assert_problem(client.post(path, b"{}", content_type="application/json"), 404, "not_found")
