"""/metrics: who may read it, and that its figures match the ledger.

The database figures are scraped in-process (Django's test client) against rows made here.
The counted figures (API replays and reused keys, connector calls) are scraped from a
gunicorn with two workers and an RQ worker sharing one PROMETHEUS_MULTIPROC_DIR, as in
production: the figures must add up across processes.
"""

import ast
import json
import os
import signal
import subprocess
from datetime import timedelta
from http.server import BaseHTTPRequestHandler

import httpx
import pytest
from django.db import transaction
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from approvals.models import ReviewItem, ReviewKind
from ledger.connectors.base import COUNTED_CODES, write_permit
from ledger.connectors.http import Rejected
from ledger.connectors.signed_http import SignedHttpConnector
from ledger.models import Action, ActionStatus
from tests.conftest import PYTHON, ROOT, _wait_for_http, free_port, thread_server, wait_until
from tests.factories import api_client, dead_letter, make_action, make_agent, post_action, refund_body, sandbox

S = ActionStatus


def figures(text):
    """{(sample name, ((label, value), ...)): value} of a scrape."""
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def scrape(client, **headers):
    response = client.get("/metrics", headers=headers)
    assert response.status_code == 200, response.content
    return figures(response.content.decode())


# --- Who may read it -------------------------------------------------------------------------

@pytest.mark.django_db
def test_it_is_open_on_loopback_in_development_without_configuration(client, settings):
    settings.PRODUCTION, settings.METRICS_TOKEN, settings.METRICS_ALLOWED_IPS = False, None, []

    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="203.0.113.9").status_code == 403


@pytest.mark.django_db
def test_it_is_closed_in_production_without_a_token_or_an_allow_list(client, settings):
    settings.PRODUCTION, settings.METRICS_TOKEN, settings.METRICS_ALLOWED_IPS = True, None, []

    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 403


@pytest.mark.django_db
def test_it_opens_to_the_token_only_once_one_is_set(client, settings):
    settings.PRODUCTION, settings.METRICS_TOKEN, settings.METRICS_ALLOWED_IPS = True, "s3cret-scrape", []

    assert client.get("/metrics", headers={"Authorization": "Bearer s3cret-scrape"},
                      REMOTE_ADDR="203.0.113.9").status_code == 200
    assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 403
    # The scheme's name in any case (RFC 9110), as the API takes it; the token as it is.
    assert client.get("/metrics", headers={"Authorization": "bearer s3cret-scrape"}).status_code == 200
    assert client.get("/metrics", headers={"Authorization": "Bearer S3CRET-SCRAPE"}).status_code == 403
    settings.PRODUCTION = False
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 403  # loopback no longer enough


@pytest.mark.django_db
def test_it_opens_to_an_allowed_network(client, settings):
    settings.PRODUCTION, settings.METRICS_TOKEN, settings.METRICS_ALLOWED_IPS = True, None, ["10.0.0.0/8"]

    assert client.get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="11.1.2.3").status_code == 403


@pytest.mark.django_db
def test_an_ipv4_client_of_a_dual_stack_listener_is_its_ipv4_address(client, settings):
    """gunicorn listening on [::] gives an IPv4 peer as IPv4-mapped (::ffff:10.0.0.5): it was
    compared as an IPv6 address, so no IPv4 entry of the allow-list, nor loopback, ever matched."""
    settings.PRODUCTION, settings.METRICS_TOKEN = True, None
    settings.METRICS_ALLOWED_IPS = ["10.0.0.0/8", "192.0.2.7/32", "::ffff:198.51.100.0/120"]

    assert client.get("/metrics", REMOTE_ADDR="::ffff:10.0.0.5").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="::ffff:192.0.2.7").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="::ffff:11.0.0.5").status_code == 403
    # An entry written mapped matches as it did.
    assert client.get("/metrics", REMOTE_ADDR="::ffff:198.51.100.9").status_code == 200

    settings.PRODUCTION, settings.METRICS_ALLOWED_IPS = False, []
    assert client.get("/metrics", REMOTE_ADDR="::ffff:127.0.0.1").status_code == 200  # loopback, in development
    assert client.get("/metrics", REMOTE_ADDR="::ffff:203.0.113.9").status_code == 403


# --- What it shows from the database ---------------------------------------------------------

WAITING = {S.QUEUED: {"next_attempt_at": timezone.now()}, S.UNKNOWN: {"next_attempt_at": timezone.now()},
           S.PENDING: {"lease_expires_at": timezone.now() + timedelta(seconds=30)},
           S.SUCCEEDED: {"external_ref": "re_1"}}


def action_in(agent, status, n, **fields):
    """A row made straight in `status`, on a target and customer of its own (so none is held)."""
    return Action.objects.create(
        operation_key=f"refund:ORD-M{n}:full:dec-1", fingerprint="f" * 64, action_type="refund",
        target=f"ORD-M{n}", customer=f"CUST-M{n}", params={"amount": "25.00", "currency": "EUR"},
        amount="25.00", currency="EUR", agent=agent, status=status, **{**WAITING.get(status, {}), **fields},
    )


@pytest.mark.django_db
def test_it_counts_actions_per_status_and_the_stale_ones(client, settings):
    settings.METRICS_STALE_SECONDS = 300
    agent, _ = make_agent("metrics-bot")
    long_ago = timezone.now() - timedelta(seconds=301)
    made = [(S.QUEUED, {}), (S.QUEUED, {}), (S.SUCCEEDED, {}), (S.AWAITING_APPROVAL, {}),
            (S.PENDING, {"updated_at": long_ago}), (S.PENDING, {}), (S.UNKNOWN, {"updated_at": long_ago})]
    for n, (status, fields) in enumerate(made):
        action_in(agent, status, n, **fields)

    seen = scrape(client)

    expected = {S.QUEUED: 2, S.SUCCEEDED: 1, S.AWAITING_APPROVAL: 1, S.PENDING: 2, S.UNKNOWN: 1}
    assert {status: seen[("surety_actions", (("status", status),))] for status in S.values} == {
        status: expected.get(status, 0) for status in S.values}
    assert seen[("surety_actions_stale", (("status", "pending"),))] == 1
    assert seen[("surety_actions_stale", (("status", "unknown"),))] == 1


@pytest.mark.django_db
def test_it_counts_open_review_items_and_those_past_their_deadline(client):
    agent, _ = make_agent("metrics-bot")
    now = timezone.now()
    for n, (kind, deadline) in enumerate([(ReviewKind.APPROVAL, now - timedelta(minutes=1)),
                                          (ReviewKind.APPROVAL, now + timedelta(hours=1)),
                                          (ReviewKind.UNKNOWN_OUTCOME, now - timedelta(hours=2))]):
        ReviewItem.objects.create(kind=kind, action=action_in(agent, S.AWAITING_APPROVAL, n), deadline=deadline)

    seen = scrape(client)

    assert seen[("surety_review_items_open", (("kind", "approval"),))] == 2
    assert seen[("surety_review_items_overdue", (("kind", "approval"),))] == 1
    assert seen[("surety_review_items_overdue", (("kind", "unknown_outcome"),))] == 1
    assert seen[("surety_review_items_overdue", (("kind", "held"),))] == 0


@pytest.mark.django_db
def test_it_counts_open_dead_letter_entries(client, jobs_to_test_redis):
    agent, _ = make_agent("metrics-bot")
    dead_letter(agent, "refund-m1")

    assert scrape(client)[("surety_deadletter_entries_open", ())] == 1
    dead_letter(agent, "refund-m2")
    assert scrape(client)[("surety_deadletter_entries_open", ())] == 2


@pytest.mark.django_db
def test_it_counts_open_incidents(client):
    """What reconciliation found waits for people too: the comment said it would be counted."""
    from dlq.incidents import Incident
    from dlq.models import Alert

    assert scrape(client)[("surety_incidents_open", ())] == 0
    for n, status in enumerate(["open", "open", "resolved"]):
        with transaction.atomic():  # the database holds that every incident has its alert
            incident = Incident.objects.create(kind="orphan_effect", connector="sandbox", subject=f"re_{n}",
                                               status=status, resolution="clawed back" if status == "resolved" else "")
            Alert.objects.create(kind=Alert.Kind.INCIDENT, incident=incident, subject="x", body="x", link="/")
    assert scrape(client)[("surety_incidents_open", ())] == 2


@pytest.mark.django_db
def test_it_counts_undelivered_alerts_and_how_long_the_oldest_has_waited(client, jobs_to_test_redis):
    """A receiver down, or no channel set: nothing but each alert's own page said that alerts
    were not getting out."""
    from dlq.models import Alert

    agent, _ = make_agent("metrics-bot")
    assert scrape(client)[("surety_alerts_undelivered", ())] == 0
    assert scrape(client)[("surety_alerts_undelivered_oldest_seconds", ())] == 0
    first = dead_letter(agent, "refund-a1").alerts.get()
    second = dead_letter(agent, "refund-a2").alerts.get()
    Alert.objects.filter(pk=first.pk).update(created_at=timezone.now() - timedelta(minutes=20))

    seen = scrape(client)
    assert seen[("surety_alerts_undelivered", ())] == 2
    assert 20 * 60 <= seen[("surety_alerts_undelivered_oldest_seconds", ())] < 21 * 60

    Alert.objects.filter(pk=first.pk).update(delivered_at=timezone.now())  # delivered at last: it goes down
    seen = scrape(client)
    assert seen[("surety_alerts_undelivered", ())] == 1
    assert seen[("surety_alerts_undelivered_oldest_seconds", ())] < 60
    Alert.objects.filter(pk=second.pk).update(delivered_at=timezone.now())
    assert scrape(client)[("surety_alerts_undelivered", ())] == 0


# --- What a provider's answer may put in a label ----------------------------------------------

def refusing(codes):
    """A provider (for `thread_server`) that refuses every request with 400 and the next of `codes`."""
    codes = iter(codes)

    class Refuse(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = json.dumps({"error": {"code": next(codes), "message": "refused"}}).encode()
            self.send_response(400)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format, *args):  # noqa: A002
            pass

    return Refuse


def code_series(client):
    """{code: calls} of the http connector's refused writes, as /metrics shows them."""
    return {dict(labels)["code"]: value for (name, labels), value in scrape(client).items()
            if name == "surety_connector_calls_total" and ("connector", "http") in labels
            and ("outcome", "rejected") in labels}


@pytest.mark.django_db
def test_codes_a_provider_makes_up_are_counted_in_one_series(client):
    """A provider's refusal names its own code, which became the `code` label as it came: a
    provider (or anything answering in its place) decided how many series /metrics has, one per
    code it made up. Codes the product knows keep their own."""
    made_up = [f"made_up_{n}" for n in range(50)]
    agent, _ = make_agent("metrics-bot")
    action = make_action(agent, S.QUEUED, key="refund:ORD-MU1:full:dec-1", target="ORD-MU1").claim(owner="host:tests")
    before = code_series(client)

    with thread_server(refusing([*made_up, "declined"])) as provider, write_permit(action):
        connector = SignedHttpConnector(url=provider.url, secret="s" * 32)
        for _ in range(len(made_up) + 1):
            with pytest.raises(Rejected):
                connector.perform(action)

    after = code_series(client)
    assert set(after) - set(before) <= {"other", "declined"}, sorted(set(after) - set(before))
    assert after["other"] - before.get("other", 0) == len(made_up)
    assert after["declined"] - before.get("declined", 0) == 1


def test_every_code_the_connectors_name_is_counted_by_name():
    """The known codes are listed in one place: a code a connector names that the list forgot
    would be counted as "other"."""
    named = {node.value.value for path in sorted((ROOT / "ledger" / "connectors").glob("*.py"))
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.keyword) and node.arg == "code" and isinstance(node.value, ast.Constant)}
    assert {"deadline_passed", "timeout", "smtp_login_refused", "currency_mismatch"} <= named  # the scan sees them
    assert named - COUNTED_CODES == set()


# --- What is counted where it happens, added up across processes ------------------------------

@pytest.fixture(scope="module")
def counted(server, tmp_path_factory):
    """A gunicorn with two workers sharing a PROMETHEUS_MULTIPROC_DIR (emptied before the
    start, as the deployment must); RQ workers get the same directory from the test."""
    directory = str(tmp_path_factory.mktemp("prometheus"))
    port = free_port()
    env = {**server.env, "PROMETHEUS_MULTIPROC_DIR": directory}
    process = subprocess.Popen(
        [PYTHON, "-m", "gunicorn", "config.wsgi", "--preload", "-b", f"127.0.0.1:{port}", "-k", "gthread",
         "-w", "2", "--threads", "4", "--log-level", "warning"],
        cwd=ROOT, env=env, start_new_session=True,
    )
    try:
        _wait_for_http(f"http://127.0.0.1:{port}/api/v1/schema")
        yield f"http://127.0.0.1:{port}", directory
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(10)


def test_replays_and_reused_keys_are_counted_per_agent_across_web_processes(stack, counted):
    url, _ = counted
    _, token = make_agent("replaying-bot")
    _, other_token = make_agent("other-bot")
    key = "refund:ORD-MC1:full:dec-1"
    with api_client(url, token) as first:
        assert post_action(first, key, refund_body("ORD-MC1")).status_code == 201
    for _ in range(5):  # a connection each: gunicorn hands them to either worker
        with api_client(url, token) as again:
            assert post_action(again, key, refund_body("ORD-MC1")).status_code == 200
    for amount in ("26.00", "27.00"):
        with api_client(url, token) as changed:
            assert post_action(changed, key, refund_body("ORD-MC1", amount=amount)).status_code == 422
    with api_client(url, other_token) as other:
        assert post_action(other, key, refund_body("ORD-MC1")).status_code == 422

    with httpx.Client(base_url=url) as client:
        seen = scrape(client)

    assert seen[("surety_api_replays_total", (("agent", "replaying-bot"),))] == 5
    assert seen[("surety_api_key_reused_total", (("agent", "replaying-bot"),))] == 2
    assert seen[("surety_api_key_reused_total", (("agent", "other-bot"),))] == 1


def test_connector_calls_are_counted_by_outcome_with_their_latency(stack, counted):
    url, directory = counted
    _, token = make_agent("paying-bot")
    with api_client(url, token) as agent:
        # A 500 (nothing committed): outcome unknown, verified absent, then done on the next attempt.
        sandbox(agent, "POST", "faults", json={"target": "ORD-MC2", "fault": "error_500", "times": 1})
        sandbox(agent, "POST", "faults", json={"target": "ORD-MC3", "fault": "decline", "times": 1})
        post_action(agent, "refund:ORD-MC2:full:dec-1", refund_body("ORD-MC2", customer="CUST-MC2"))
        post_action(agent, "refund:ORD-MC3:full:dec-1", refund_body("ORD-MC3", customer="CUST-MC3"))
        stack.start_worker(PROMETHEUS_MULTIPROC_DIR=directory)
        settled = {S.SUCCEEDED, S.FAILED}
        wait_until(lambda: set(Action.objects.values_list("status", flat=True)) <= settled, 30, message="settled")

        seen = scrape(agent)

    def calls(operation, outcome, code=""):
        labels = (("code", code), ("connector", "sandbox"), ("operation", operation), ("outcome", outcome))
        return seen.get(("surety_connector_calls_total", labels), 0)

    assert calls("perform", "ok") == 1
    assert calls("perform", "outcome_unknown", "http_500") == 1
    assert calls("perform", "rejected", "declined") == 1
    assert calls("find_effect", "absent") == 1
    timed = (("connector", "sandbox"), ("operation", "perform"))
    assert seen[("surety_connector_call_seconds_count", timed)] == 3
    assert 0 < seen[("surety_connector_call_seconds_sum", timed)] < 3 * 2  # each within CONNECTOR_TIMEOUT
