"""Bodies sent chunked (`Transfer-Encoding: chunked`, no Content-Length), as clients that stream
send them (httpx with an iterator, Node's fetch with a stream, Go with an unknown length), over a
real gunicorn, which de-chunks them: read whole, up to the limits a body with a Content-Length
has, and refused above them with the same problem, never read whole into memory."""

import http.client
import io
import json
import re
import time
from contextlib import contextmanager
from urllib.parse import urlsplit

import httpx
import pytest
from django.conf import settings
from django.test import Client

from config.wsgi import application, uploads_max_bytes
from console.evidence_views import EVIDENCE_FILE_MAX_BYTES
from ledger.models import Action, WebhookEvent
from ledger.webhooks import sign_webhook
from tests.factories import agent_api, make_agent_on, refund_body

ACTIONS = "/api/v1/actions"
WEBHOOKS = "/webhooks/sandbox/"
KEY = "refund:ORD-8841:dec-77"


def send(client, path, body, headers, *, chunked):
    """POST `body` chunked (an iterator: httpx sends no Content-Length) or with its Content-Length."""
    content = iter([body[i:i + 16_384] for i in range(0, len(body), 16_384)]) if chunked else body
    request = client.build_request("POST", path, content=content, headers=headers)
    assert ("content-length" not in request.headers) == chunked
    assert (request.headers.get("transfer-encoding") == "chunked") == chunked
    return client.send(request)


def signed(body):
    return {"Content-Type": "application/json",
            "Sandbox-Signature": sign_webhook(body, settings.SANDBOX_WEBHOOK_SECRET, time.time())}


def event(event_id, padding=""):
    return {"id": event_id, "type": "refund.created", "data": {"id": "re_c1", "padding": padding}}


def padded_to(size, event_id):
    """An event whose JSON is exactly `size` bytes."""
    short = json.dumps(event(event_id)).encode()
    return json.dumps(event(event_id, "x" * (size - len(short)))).encode()


def test_an_action_posted_chunked_is_recorded_as_the_same_request_with_a_length(stack):
    body = json.dumps(refund_body()).encode()
    with agent_api(stack.url) as api:
        headers = {"Content-Type": "application/json", "Idempotency-Key": KEY}
        created = send(api, ACTIONS, body, headers, chunked=True)
        assert created.status_code == 201, created.text
        assert Action.objects.get(operation_key=KEY).params == {"amount": "25.00", "currency": "EUR"}
        # Its fingerprint is the one the same body with a Content-Length has: a replay, not a reuse.
        again = send(api, ACTIONS, body, headers, chunked=False)
        assert (again.status_code, again.headers["Idempotent-Replayed"]) == (200, "true"), again.text


@pytest.mark.parametrize("size", [100, settings.DATA_UPLOAD_MAX_MEMORY_SIZE])
def test_a_signed_webhook_sent_chunked_is_verified_and_stored_up_to_the_upload_limit(stack, size):
    body = padded_to(size, f"evt_chunked_{size}")
    with agent_api(stack.url) as api:
        answer = send(api, WEBHOOKS, body, signed(body), chunked=True)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"received": True, "outcome": "ignored"}
    assert WebhookEvent.objects.get(event_id=f"evt_chunked_{size}").payload == json.loads(body)


def refused_chunked_early(url, path, headers, body, limit=settings.DATA_UPLOAD_MAX_MEMORY_SIZE):
    """POST `body` chunked to the live server and read the answer once it may have refused it:
    after the body's first `limit` bytes and 64 KiB (all of it, if shorter; the server reads a
    little ahead), the rest never sent, as a streaming client reads an early answer. Returns
    (status, content type, JSON)."""
    head = body[:limit + 65_536]
    address = urlsplit(url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=10)
    try:
        connection.putrequest("POST", path)
        for name, value in {**headers, "Transfer-Encoding": "chunked"}.items():
            connection.putheader(name, value)
        connection.endheaders()
        try:
            for start in range(0, len(head), 65_536):
                part = head[start:start + 65_536]
                connection.send(b"%x\r\n%s\r\n" % (len(part), part))
            if head == body:
                connection.send(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # it answered and closed before reading this far: the answer says what it read
        answer = connection.getresponse()
        return answer.status, answer.getheader("Content-Type"), json.loads(answer.read())
    finally:
        connection.close()


@pytest.mark.parametrize(("path", "size", "status"), [
    (ACTIONS, settings.API_MAX_BODY_BYTES + 1, 400),
    (ACTIONS, 3 * 1024 * 1024, 400),
    (WEBHOOKS, settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1, 413),
    (WEBHOOKS, 3 * 1024 * 1024, 413),
])
def test_a_chunked_body_above_its_limit_is_refused_as_one_with_a_length_before_its_end_arrives(
        stack, client, path, size, status):
    """The same problem Django answers the same body with its Content-Length (the test client's);
    a 3 MiB one is answered with its first MiB or so, the rest never sent, so never read."""
    make_agent_on(client)
    body = padded_to(size, "evt_too_large")
    headers = {**signed(body), "Idempotency-Key": KEY, "Authorization": client.defaults["HTTP_AUTHORIZATION"]}
    with_length = client.generic("POST", path, body, content_type="application/json",
                                 headers={name: value for name, value in headers.items() if name != "Content-Type"})
    assert with_length.status_code == status, with_length.content
    assert with_length["Content-Type"] == "application/problem+json"

    chunked = refused_chunked_early(stack.url, path, headers, body)

    assert chunked == (status, "application/problem+json", with_length.json())
    assert not Action.objects.exists() and not WebhookEvent.objects.exists()


class Unreadable(io.RawIOBase):
    def read(self, size=-1):
        raise AssertionError("read an input its server did not say ends with the body")


def test_a_chunked_body_on_a_server_that_does_not_de_chunk_it_is_not_read():
    """runserver (wsgiref) hands the application the raw socket without wsgi.input_terminated:
    read there, the input could run past the body or wait for bytes that never come. Such a body
    stays unread, as Django leaves any body without a Content-Length (refused here for its
    signature, which no empty body carries)."""
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": WEBHOOKS, "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "80",
               "wsgi.url_scheme": "http", "wsgi.input": Unreadable(), "wsgi.errors": io.StringIO(),
               "CONTENT_TYPE": "application/json", "HTTP_TRANSFER_ENCODING": "chunked",
               "HTTP_SANDBOX_SIGNATURE": signed(b"{}")["Sandbox-Signature"]}
    answered = []
    body = b"".join(application(environ, lambda status, headers, exc_info=None: answered.append(status)))
    assert answered == ["400 Bad Request"]
    assert json.loads(body)["code"] == "webhook_refused"


def test_a_chunked_body_read_into_a_temporary_file_is_closed_with_its_response(db):
    """A form past the memory's bound goes to a temporary file in place of the server's input,
    which nothing closed: unlinked, it held its descriptor and its disk until collected. (The
    application called as a server calls it, with the input a de-chunking server gives.)"""
    form = b"--b\r\nContent-Disposition: form-data; name=\"f\"; filename=\"e.json\"\r\n\r\n" + b"x" * (
        2 * 1024 * 1024) + b"\r\n--b--\r\n"
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": UPLOAD, "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "80",
               "wsgi.url_scheme": "http", "wsgi.input": io.BytesIO(form), "wsgi.errors": io.StringIO(),
               "wsgi.input_terminated": True, "CONTENT_TYPE": "multipart/form-data; boundary=b"}
    response = application(environ, lambda status, headers, exc_info=None: None)
    b"".join(response)
    response.close()
    body = environ["wsgi.input"]
    assert body._rolled and body.closed  # it went to disk, and is closed with the response


def test_a_malformed_chunk_is_a_problem_not_the_servers_page(stack):
    """A chunk size that is no hexadecimal number: gunicorn cannot de-chunk the body, and the client
    is told so as every refused body is, in problem+json (it was gunicorn's own HTML page)."""
    address = urlsplit(stack.url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=10)
    try:
        connection.putrequest("POST", WEBHOOKS)
        connection.putheader("Transfer-Encoding", "chunked")
        connection.putheader("Content-Type", "application/json")
        connection.endheaders()
        connection.send(b"zz\r\n{}\r\n0\r\n\r\n")
        answer = connection.getresponse()
        assert (answer.status, answer.getheader("Content-Type")) == (400, "application/problem+json")
        assert json.loads(answer.read())["code"] == "invalid"
    finally:
        connection.close()
    assert not WebhookEvent.objects.exists()


UPLOAD = "/audit/verify-evidence"


@contextmanager
def dashboard_on(url, user):
    """An httpx client on the live server signed in as `user` (a session Django's test client
    makes, in the database the server reads), with the CSRF cookie a page sets."""
    session = Client()
    session.force_login(user)
    with httpx.Client(base_url=url, timeout=30, follow_redirects=True,
                      cookies={"sessionid": session.cookies["sessionid"].value}) as browser:
        assert browser.get("/audit/").status_code == 200
        yield browser


def evidence_upload(browser, size):
    """The audit page's evidence form with an `evidence.json` of `size` bytes (a JSON object, not
    a record: each problem found in it is named), as a browser encodes it: (body, headers)."""
    record = json.dumps({"audit": {"events": []}, "integrity": {}, "padding": ""}).encode()
    content = record[:-2] + b"x" * (size - len(record)) + record[-2:]
    form = browser.build_request("POST", UPLOAD, data={"csrfmiddlewaretoken": browser.cookies["csrftoken"]},
                                 files={"evidence": ("evidence.json", content, "application/json")})
    return form.read(), {"Content-Type": form.headers["Content-Type"]}


def told(page):
    """The dashboard's message on `page` (the audit log a form's answer returns to)."""
    return re.search(r'<div id="messages"[^>]*>(.*?)</div>', page.text, re.S)[1].strip()


@pytest.mark.parametrize("size", [2 * 1024 * 1024, EVIDENCE_FILE_MAX_BYTES + 1])
def test_a_file_uploaded_chunked_is_checked_as_the_same_upload_with_a_length(stack, auditor, size):
    """A form with a file past DATA_UPLOAD_MAX_MEMORY_SIZE (which Django applies to its fields,
    never its files): read whole, as with its length, not cut at 1 MiB and its file lost; one just
    past the file's own bound reaches the view, which says so, as with its length."""
    with dashboard_on(stack.url, auditor) as browser:
        body, headers = evidence_upload(browser, size)
        with_length = send(browser, UPLOAD, body, headers, chunked=False)
        chunked = send(browser, UPLOAD, body, headers, chunked=True)
    assert (with_length.status_code, chunked.status_code) == (200, 200)
    assert told(with_length).startswith('<p class="message message--error">evidence.json: '), told(with_length)
    assert told(chunked) == told(with_length)


def test_a_form_sent_chunked_past_the_largest_upload_is_refused_413_before_its_end_arrives(stack, auditor):
    with dashboard_on(stack.url, auditor) as browser:
        body, headers = evidence_upload(browser, uploads_max_bytes() + 1024 * 1024)
        headers["Cookie"] = "; ".join(f"{name}={value}" for name, value in browser.cookies.items())

    status, content_type, problem = refused_chunked_early(stack.url, UPLOAD, headers, body, limit=uploads_max_bytes())

    assert (status, content_type, problem["code"]) == (413, "application/problem+json", "invalid")
    assert str(uploads_max_bytes()) in problem["detail"]
