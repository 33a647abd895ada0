"""The signed-HTTP connector against a real HTTP server: the receiving service of
`examples/receiver/`, run here on a free port, so the example a team copies is the one tested."""

import io
import json
import os
import sqlite3
import subprocess
import threading
import time
from collections import Counter

import httpx
import pytest

from examples.receiver.receiver import PATH, make_app, serve
from ledger.actions import action_request
from ledger.connectors.signed_http import SignedHttpConnector
from ledger.executor import action_claim_next, action_run_claimed
from ledger.models import Action
from ledger.webhooks import sign_webhook
from tests.conftest import PYTHON, ROOT, wait_until
from tests.factories import api_client, make_agent, post_action, refund_body, send_together

SECRET = "whsec-team-service"


class Receiver:
    """The example service in a thread of this process. A test can make its next POST stall
    (answer only after `seconds`, the effect already stored) or answer garbage instead."""

    def __init__(self, database):
        self.database = str(database)
        self.app = make_app(SECRET, self.database)
        self.script = []  # what the next POSTs do: ("stall", seconds) or ("garble", (status, body))
        self.server = serve(self._scripted)
        self.url = f"http://127.0.0.1:{self.server.server_port}{PATH}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _scripted(self, environ, start_response):
        if environ["REQUEST_METHOD"] != "POST" or not self.script:
            return self.app(environ, start_response)
        what, value = self.script.pop(0)
        if what == "garble":
            self.app(environ, lambda *args: None)
            status, body = value
            start_response(status, [("Content-Type", "text/html")])
            return [body.encode()]
        answer = self.app(environ, start_response)
        time.sleep(value)
        return answer

    def effects(self):
        with sqlite3.connect(self.database) as db:
            return [key for (key,) in db.execute("SELECT operation_key FROM effects")]

    def options(self, secret=SECRET):
        return {"url": self.url, "secret": secret}

    def worker_env(self, action_type):
        prefix = f"CONNECTOR_{action_type.upper()}"
        return {prefix: "http", f"{prefix}_URL": self.url, f"{prefix}_SECRET": SECRET}

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver(tmp_path):
    service = Receiver(tmp_path / "effects.sqlite3")
    yield service
    service.stop()


@pytest.fixture
def http_refunds(settings, receiver):
    """Refunds go to the team's service in this process (for tests that run the executor here)."""
    settings.SURETY_CONNECTORS = {**settings.SURETY_CONNECTORS, "refund": {
        "class": "ledger.connectors.signed_http.SignedHttpConnector", "options": receiver.options()}}
    return receiver


def signed_post(client, url, key, body):
    raw = json.dumps(body).encode()
    return client.post(url, content=raw, headers={
        "Idempotency-Key": key, "Surety-Signature": sign_webhook(raw, SECRET), "Content-Type": "application/json"})


def settled(client, key, seconds=30):
    return wait_until(
        lambda: (a := client.get(f"/api/v1/actions/{key}").json())["status"] not in {"queued", "pending", "unknown"} and a,
        seconds=seconds, message=f"{key} to settle",
    )


# --- The example service on its own ----------------------------------------------------------


def test_the_example_service_carries_out_twenty_identical_signed_posts_once(receiver):
    key = "refund:ORD-1:full:dec-1"
    body = {"operation_key": key, "action_type": "refund", "target": "ORD-1", "customer": "",
            "params": {"amount": "25.00", "currency": "EUR"}, "decision_id": "dec-1"}
    barrier = threading.Barrier(20)

    def post(i, answers):
        with httpx.Client(timeout=30) as client:
            barrier.wait(30)
            answers[i] = signed_post(client, receiver.url, key, body)

    answers = [None] * 20
    threads = [threading.Thread(target=post, args=(i, answers)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    assert Counter(a.status_code for a in answers) == {201: 1, 200: 19}
    assert {a.json()["id"] for a in answers} == {answers[0].json()["id"]}
    assert receiver.effects() == [key]


def test_the_example_service_refuses_a_bad_signature_and_stores_nothing(receiver):
    raw = json.dumps({"operation_key": "k-1"}).encode()
    stale = sign_webhook(raw, SECRET, timestamp=time.time() - 600)
    huge = "t=1" + "0" * 400 + ",v1=00"  # past a float's range
    for signature in ("", sign_webhook(raw, "another secret"), stale, huge):
        answer = httpx.post(receiver.url, content=raw, headers={"Idempotency-Key": "k-1", "Surety-Signature": signature})
        assert answer.status_code == 401
        assert answer.json()["error"]["code"] == "bad_signature"
    assert receiver.effects() == []


def test_the_example_service_takes_any_one_of_several_signatures(receiver):
    """A sender rolling its secret signs with the old and the new one: the right one second holds."""
    raw = json.dumps({"operation_key": "k-2"}).encode()
    signed = sign_webhook(raw, SECRET)
    stamp, right = signed.split(",")
    for signature in (f"{stamp},v1={'0' * 64},{right}", f"{stamp},{right},v1={'0' * 64}"):
        answer = httpx.post(receiver.url, content=raw, headers={"Idempotency-Key": "k-2", "Surety-Signature": signature})
        assert answer.status_code in (200, 201), answer.text
    assert receiver.effects() == ["k-2"]


# --- Through Surety's API and workers --------------------------------------------------------


def test_twenty_identical_posts_to_the_api_make_one_effect_at_the_teams_service(stack, receiver):
    _, token = make_agent("billing")
    key = "refund:ORD-20:full:dec-20"
    stack.start_worker(**receiver.worker_env("refund"))
    stack.start_worker(**receiver.worker_env("refund"))

    responses = send_together(stack.url, token, [lambda client: post_action(client, key, refund_body("ORD-20"))] * 20)

    assert Counter(r.status_code for r in responses) == {201: 1, 200: 19}
    done = settled(api_client(stack.url, token), key)
    assert done["status"] == "succeeded", done
    assert done["attempts"] == 1
    assert receiver.effects() == [key]
    assert done["external_ref"] == httpx.get(f"{receiver.url}/{key}").json()["id"]


def test_a_timeout_after_the_service_stored_the_effect_is_verified_by_key_not_sent_again(stack, receiver):
    _, token = make_agent("billing")
    key = "refund:ORD-21:full:dec-21"
    receiver.script.append(("stall", 4))  # beyond the workers' CONNECTOR_TIMEOUT of 2 s
    stack.start_worker(**receiver.worker_env("refund"))

    client = api_client(stack.url, token)
    assert post_action(client, key, refund_body("ORD-21")).status_code == 201
    done = settled(client, key)

    assert done["status"] == "succeeded", done
    assert done["attempts"] == 1
    assert receiver.effects() == [key]
    evidence = Action.objects.get(operation_key=key).evidence
    assert evidence[0]["code"] == "timeout"  # it went unknown first
    assert evidence[-1]["found"] is True
    assert evidence[-1]["verification"]["lookup"] == f"GET {receiver.url}/{key.replace(':', '%3A')}"


# --- Verification by key ---------------------------------------------------------------------


@pytest.mark.parametrize("key", ["refund:ORD/7?x=1#frag%20:dec-7", ".", ".."])
def test_verification_finds_an_effect_by_its_key_even_with_a_slash_in_it_or_dots_alone(receiver, key):
    """A "." or ".." left as it is was removed by the HTTP client as a dot segment: the look-up
    went to the service's collection or its parent."""
    with httpx.Client() as client:
        stored = signed_post(client, receiver.url, key, {"operation_key": key}).json()
    connector = SignedHttpConnector(**receiver.options())

    found = connector.find_effect(Action(operation_key=key))
    absent = connector.find_effect(Action(operation_key="refund:ORD/8:dec-8"))

    assert (found.found, found.external_ref) == (True, stored["id"])
    assert absent.found is False


def test_only_the_services_own_not_found_proves_an_effect_absent(receiver):
    # A route the service lacks answers 404 too (here the example's "no_such_route"), as
    # would a proxy's error page: that proves nothing, and neither does a service that is down.
    wrong_route = SignedHttpConnector(url=receiver.url.removesuffix(PATH) + "/elsewhere", secret=SECRET)
    down = SignedHttpConnector(url="http://127.0.0.1:9/effects", secret=SECRET)

    for connector in (wrong_route, down):
        lookup = connector.find_effect(Action(operation_key="k-1"))
        assert lookup.found is None
        assert lookup.evidence["answer"]["error"] in {"Rejected", "NotSent"}


# --- Faults, in this process -----------------------------------------------------------------


def run_once(action):
    claimed = wait_until(lambda: action_claim_next("tests", only=action.pk), seconds=10, message="a claim")
    action_run_claimed(claimed)
    return Action.objects.get(pk=action.pk)


def request_refund(key, order):
    return action_request(agent=make_agent(f"agent-{order}")[0], operation_key=key, action_type="refund", target=order,
                          params={"amount": "25.00", "currency": "EUR"})[0]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("jobs_to_test_redis")
@pytest.mark.parametrize(("status", "garbage", "code", "kept"), [
    ("200 OK", "<html><body>502 Bad Gateway</body></html>", "unreadable_answer", "502 Bad Gateway"),
    ("200 OK", '{"id": "eff_1", "opera', "unreadable_answer", "eff_1"),  # JSON cut short
    ("502 Bad Gateway", "<html><body>502 Bad Gateway</body></html>", "http_502", "HTTP 502"),  # a proxy's page
    # The IETF Idempotency-Key draft's answer while the first request under the key is being processed:
    ("409 Conflict", '{"error": {"code": "in_progress", "message": "the key is in use"}}', "in_progress",
     "the key is in use"),
    ("408 Request Timeout", "<html><body>408</body></html>", "http_408", "HTTP 408"),  # a proxy gave up waiting
    ("303 See Other", "", "http_303", "HTTP 303"),  # done, see there
])
def test_an_answer_that_cannot_be_read_leaves_the_outcome_unknown_with_the_evidence(http_refunds, settings, status,
                                                                                    garbage, code, kept):
    # Verification waits this long after an unknown outcome; long enough that a loaded machine
    # still reads the garbled answer rather than timing out first.
    settings.CONNECTOR_TIMEOUT = 1
    http_refunds.script.append(("garble", (status, garbage)))
    action = request_refund("refund:ORD-30:full:dec-30", "ORD-30")

    action = run_once(action)

    assert action.status == "unknown"
    assert action.evidence[-1]["code"] == code
    assert kept in action.evidence[-1]["message"]
    action = run_once(action)  # verification by key finds the effect the garbled answer hid
    assert action.status == "succeeded"
    assert action.external_ref == httpx.get(f"{http_refunds.url}/{action.operation_key}").json()["id"]
    assert http_refunds.effects() == [action.operation_key]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("jobs_to_test_redis")
def test_an_answer_postgresql_cannot_store_is_recorded_mended_once_the_effect_is_made(http_refunds):
    """A NUL, a lone surrogate and an infinity in the service's 2xx: the effect is made, so it
    is recorded, mended to what the columns take. Stored as it came, the settle failed after the
    effect, and every verification after it the same way: the action never settled."""
    http_refunds.script.append(("garble", ("200 OK", '{"id": "eff_\\u0000", "note": "a\\ud800b", "n": 1e400}')))
    action = run_once(request_refund("refund:ORD-32:full:dec-32", "ORD-32"))

    assert action.status == "succeeded"
    assert (action.external_ref, action.result) == ("eff_\ufffd", {"id": "eff_\ufffd", "note": "a\ufffdb", "n": "inf"})
    assert http_refunds.effects() == [action.operation_key]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("jobs_to_test_redis")
def test_a_wrong_secret_fails_the_action_for_good_and_the_service_stores_nothing(http_refunds, settings):
    settings.SURETY_CONNECTORS = {**settings.SURETY_CONNECTORS, "refund": {
        "class": "ledger.connectors.signed_http.SignedHttpConnector", "options": http_refunds.options("wrong")}}
    action = run_once(request_refund("refund:ORD-31:full:dec-31", "ORD-31"))

    assert action.status == "failed"
    assert action.error["code"] == "bad_signature" and action.error["retryable"] is False
    assert http_refunds.effects() == []


# --- Configuration ---------------------------------------------------------------------------


def test_a_url_that_is_not_http_or_a_missing_secret_is_named_by_the_check():
    assert SignedHttpConnector(url="https://team.example/effects", secret="s").check() == []
    problems = SignedHttpConnector(url="ftp://team.example/effects", secret="").check()
    assert len(problems) == 2
    assert "not an http(s) address" in problems[0] and "secret" in problems[1]


def test_the_start_stops_with_a_clear_message_when_the_url_and_secret_are_missing():
    env = {"PATH": "/usr/bin:/bin", "CONNECTOR_REFUND": "http", "CONNECTOR_REFUND_URL": "team.example/effects",
           "SECRET_KEY": os.environ["SECRET_KEY"]}  # the tests' own (tests/settings.py): DEBUG is off
    checked = subprocess.run([PYTHON, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=60)

    assert checked.returncode != 0
    assert "surety.E003" in checked.stderr
    assert "http connector for 'refund': url 'team.example/effects' is not an http(s) address" in checked.stderr
    assert "http connector for 'refund': no signing secret (CONNECTOR_<TYPE>_SECRET)" in checked.stderr


@pytest.mark.parametrize("fault", [
    {"target": "a", "fault": ["timeout_after_commit"], "times": 1}, {"target": "a", "fault": "melt", "times": 1},
    {"target": "a", "fault": "timeout_after_commit", "times": 10**22},
    {"target": "a", "fault": "timeout_after_commit", "times": True}, {"target": 5, "fault": "timeout_after_commit"},
    {"target": "a", "fault": "timeout_after_commit", "times": 0},
])
def test_the_example_services_test_mode_refuses_a_bad_fault_and_arms_nothing(tmp_path, fault):
    database = str(tmp_path / "effects.sqlite3")
    app = make_app(SECRET, database, test_mode=True)
    raw = json.dumps(fault).encode()
    answered = []
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": PATH + "/faults", "CONTENT_LENGTH": str(len(raw)),
               "wsgi.input": io.BytesIO(raw), "HTTP_SURETY_SIGNATURE": sign_webhook(raw, SECRET)}
    body = app(environ, lambda status, headers: answered.append(status))
    assert answered[0].startswith("400") and json.loads(b"".join(body))["error"]["code"] == "invalid"
    with sqlite3.connect(database) as db:
        assert db.execute("SELECT count(*) FROM faults").fetchone() == (0,)


def test_the_example_service_refuses_a_content_length_that_is_not_a_number(tmp_path):
    app = make_app(SECRET, str(tmp_path / "effects.sqlite3"))
    answered = []
    app({"REQUEST_METHOD": "POST", "PATH_INFO": PATH, "CONTENT_LENGTH": "ten", "wsgi.input": io.BytesIO(b"{}")},
        lambda status, headers: answered.append(status))
    assert answered[0].startswith("400")
