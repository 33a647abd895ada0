"""A provider that answers 429 is asked again only after the wait it names (`Retry-After`, in
seconds or as an HTTP-date), or a minute if it names none: tried again after a second or two, a
rate-limited provider got more load, and three 429s in a few seconds dead-lettered the action and
alerted people about a limit that lifts by itself."""

import contextlib
import json
import time
from http.server import BaseHTTPRequestHandler
from urllib.parse import unquote

import httpx
import pytest

from dlq.entries import deadletter_redrive
from dlq.models import DeadLetter
from ledger import clock
from ledger.actions import action_request
from ledger.connectors import http
from ledger.connectors.fault_proxy import FaultProxy
from ledger.executor import action_claim_next, action_run_claimed
from ledger.models import Action, Task
from ledger.runner import task_run
from ledger.tasks import task_claim_next, task_request
from tests.conftest import thread_server, wait_until
from tests.connectors.test_stripe_failures import run_once, scripted, stripe_error  # noqa: F401
from tests.factories import confirmed_absent, make_agent, person, refund_input
from tests.ledger.test_metrics import scrape

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("jobs_to_test_redis")]


def rate_limiting(retry_after):
    """A team's service that answers every POST with 429 (and `Retry-After: retry_after`, unless
    None)."""

    class RateLimited(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = b'{"error": {"code": "rate_limited", "message": "slow down"}}'
            self.send_response(429)
            if retry_after is not None:
                self.send_header("Retry-After", retry_after)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    return RateLimited


def run_against(url, settings, order):
    """Request a refund from the team's service at `url` and run its first attempt."""
    settings.SURETY_CONNECTORS = {**settings.SURETY_CONNECTORS, "refund": {
        "class": "ledger.connectors.signed_http.SignedHttpConnector",
        "options": {"url": f"{url}/refunds", "secret": "s3cret"}}}
    action = action_request(agent=make_agent(f"rl-{order}")[0], operation_key=f"refund:{order}:dec-1",
                            action_type="refund", target=order, params={"amount": "25.00", "currency": "EUR"})[0]
    claimed = wait_until(lambda: action_claim_next("tests", only=action.pk), seconds=15, message="a claim")
    action_run_claimed(claimed)
    return Action.objects.get(pk=action.pk)


def seconds_until_due(action):
    return (action.next_attempt_at - clock.now()).total_seconds()


def test_a_429_with_retry_after_is_not_tried_again_before_it(settings):
    """The service asks for two minutes: the action waits at least that long in the queue, not
    the backoff's second or two."""
    with thread_server(rate_limiting("120")) as service:
        action = run_against(service.url, settings, "ORD-429")
    assert action.status == "queued" and seconds_until_due(action) >= 115
    assert (action.evidence[-1]["code"], action.evidence[-1]["retry_after"]) == ("rate_limited", 120)


def test_a_429_that_names_no_wait_still_waits_a_minute(settings):
    """No Retry-After (or one that cannot be read): a rate limit lifts in its own time, which the
    backoff's seconds are not; a per-minute quota has rolled over after a minute."""
    with thread_server(rate_limiting(None)) as service:
        action = run_against(service.url, settings, "ORD-429-none")
    assert action.status == "queued" and seconds_until_due(action) >= 55


def test_stripes_rate_limit_waits_its_retry_after_too(scripted):  # noqa: F811
    """The SDK keeps the answer's headers on its RateLimitError: a Retry-After there is honoured
    as a team's service's is."""
    scripted.script.append((*stripe_error(429, "invalid_request_error", "Too many requests hit the API too quickly.",
                                          code="rate_limit"), {"Retry-After": "90"}))
    action = run_once("refund:ch_rl:full", "ch_rl")
    assert action.status == "queued" and seconds_until_due(action) >= 85
    assert (action.evidence[-1]["code"], action.evidence[-1]["retry_after"]) == ("rate_limited", 90)


@pytest.mark.parametrize(("headers", "seconds"), [
    ({"Retry-After": "120"}, 120),
    # A date is counted from the answer's own Date: the provider's clock against itself.
    ({"Retry-After": "Wed, 21 Oct 2015 07:33:00 GMT", "Date": "Wed, 21 Oct 2015 07:28:00 GMT"}, 300),
    ({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT", "Date": "Wed, 21 Oct 2015 07:33:00 GMT"}, 0),
    ({"Retry-After": "86400"}, 3600),  # at most an hour
    ({"Retry-After": "soon"}, 60),  # unreadable: as if it named none
    ({}, 60),
])
def test_retry_after_is_read_as_seconds_or_a_date_and_capped(headers, seconds):
    assert http.retry_after(httpx.Headers(headers)) == seconds


def test_a_task_whose_refund_spent_its_attempts_on_429s_waits_the_providers_wait_too(settings):
    """The refund's own attempts all answered 429 (its failure is retryable): the task's next run,
    which retries it, comes no sooner than the provider's wait, not after the task's short backoff,
    which would send the rate-limited provider the same refund again within seconds."""
    settings.MAX_ATTEMPTS = 1
    with thread_server(rate_limiting("120")) as service:
        settings.SURETY_CONNECTORS = {**settings.SURETY_CONNECTORS, "refund": {
            "class": "ledger.connectors.signed_http.SignedHttpConnector",
            "options": {"url": f"{service.url}/refunds", "secret": "s3cret"}}}
        task, _ = task_request(agent=make_agent("rl-task", grants=("refund",))[0], task_id="refund-429",
                               workflow="refund", input=refund_input("ORD-429-task", "CUST-429"))
        Task.objects.filter(pk=task.pk).update(max_attempts=3)  # the refund one attempt, the task three
        task_run(wait_until(lambda: task_claim_next("tests", only=task.pk), seconds=15, message="a claim"))
    task = Task.objects.get(pk=task.pk)
    [action] = task.actions.all()
    assert (action.status, action.error["retryable"], action.error["retry_after"]) == ("failed", True, 120)
    assert task.state == "queued" and task.last_error["code"] == "rate_limited", task.last_error
    assert seconds_until_due(task) >= 115


def keeping_refunds(limited_looks, retry_after, limited_posts=0):
    """A team's service that keeps its refunds by key and answers the first `limited_looks`
    look-ups (GET), and the first `limited_posts` refunds asked (POST), with 429 and
    `Retry-After: retry_after`, noting when each look and each refund asked came."""

    class Service(BaseHTTPRequestHandler):
        def _reply(self, status, payload, headers=()):
            body = json.dumps(payload).encode()
            self.send_response(status)
            for header in (*headers, ("Content-Type", "application/json")):
                self.send_header(*header)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):  # noqa: N802 (http.server's name)
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.server.posts.append(time.monotonic())
            if len(self.server.posts) <= limited_posts:
                return self._reply(429, {"error": {"code": "rate_limited"}}, [("Retry-After", retry_after)])
            self.server.refunds.setdefault(self.headers["Idempotency-Key"], f"re_{len(self.server.refunds) + 1}")
            self._reply(201, {"id": self.server.refunds[self.headers["Idempotency-Key"]]})

        def do_GET(self):  # noqa: N802
            self.server.looks.append(time.monotonic())
            if len(self.server.looks) <= limited_looks:
                return self._reply(429, {"error": {"code": "rate_limited"}}, [("Retry-After", retry_after)])
            found = self.server.refunds.get(unquote(self.path.rsplit("/", 1)[1]))
            return self._reply(200, {"id": found}) if found else self._reply(404, {"error": {"code": "not_found"}})

        def log_message(self, *args):
            pass

    return Service


@contextlib.contextmanager
def unknown_refund(settings, order, *, limited_looks, retry_after):
    """A refund the service made whose answer never came (the fault proxy withholds it past the
    deadline), so its outcome is unknown; its look-ups then answered as `keeping_refunds` says."""
    settings.CONNECTOR_TIMEOUT, settings.MAX_ATTEMPTS, settings.BACKOFF_BASE_SECONDS = 1, 3, 0.1
    with thread_server(keeping_refunds(limited_looks, retry_after)) as service, \
            FaultProxy(service.url) as proxy:
        service.refunds, service.looks, service.posts = {}, [], []
        proxy.arm("timeout_after_commit")
        action = run_against(proxy.url, settings, order)
        assert action.status == "unknown" and len(service.refunds) == 1, action.evidence
        yield action, service


def verified(action):
    """Claim the unknown action once its verification is due, and verify it."""
    action_run_claimed(wait_until(lambda: action_claim_next("tests", only=action.pk), seconds=15,
                                  message="its verification due"))
    return Action.objects.get(pk=action.pk)


def test_a_rate_limited_look_is_asked_again_after_its_wait_and_settles_without_a_person(settings):
    with unknown_refund(settings, "ORD-429-look", limited_looks=2, retry_after="1") as (action, service):
        for _ in range(2):
            action = verified(action)
            assert action.status == "unknown" and action.evidence[-1]["retry_after"] == 1, action.evidence[-1]
        action = verified(action)
    assert (action.status, action.external_ref) == ("succeeded", service.refunds[action.operation_key])
    first, second, third = service.looks
    assert second - first >= 1 and third - second >= 1  # never before the provider's wait


def test_a_look_always_rate_limited_reaches_a_person_after_max_attempts_looks(settings):
    with unknown_refund(settings, "ORD-429-always", limited_looks=99, retry_after="1") as (action, service):
        while action.status == "unknown":
            action = verified(action)
        assert len(service.looks) == settings.MAX_ATTEMPTS
    assert action.status == "needs_review"
    assert action.evidence[-1]["verification"]["answer"]["code"] == "rate_limited"


def test_a_rate_limited_look_is_not_asked_again_before_its_retry_after(settings):
    with unknown_refund(settings, "ORD-429-wait", limited_looks=1, retry_after="120") as (action, service):
        action = verified(action)
        assert action.status == "unknown" and seconds_until_due(action) >= 115
        assert action_claim_next("tests", only=action.pk) is None and len(service.looks) == 1
        # Once the wait has passed, the look is answered and settles it.
        Action.objects.filter(pk=action.pk).update(next_attempt_at=clock.now())
        assert verified(action).status == "succeeded"


def test_a_rate_limited_look_is_counted_as_rate_limited_on_metrics(settings, client):
    """Counted as a look that cannot tell, a rate limit looked like a provider that cannot say
    what it did, the one kind of look that leaves an action to a person."""
    settings.PRODUCTION, settings.METRICS_TOKEN, settings.METRICS_ALLOWED_IPS = False, None, []

    def looks():
        return {dict(labels)["outcome"]: value for (name, labels), value in scrape(client).items()
                if name == "surety_connector_calls_total"
                and {("connector", "http"), ("operation", "find_effect")} <= set(labels)}

    before = looks()
    with unknown_refund(settings, "ORD-429-counted", limited_looks=1, retry_after="120") as (action, service):
        assert verified(action).status == "unknown"
    after = looks()
    assert after.get("rate_limited", 0) - before.get("rate_limited", 0) == 1, after
    assert after.get("inconclusive", 0) == before.get("inconclusive", 0), after


@contextlib.contextmanager
def redriven_refund(settings, order, **service):
    """A refund whose first attempt's outcome was unknown and which a person then marked failed
    ("confirmed absent"), redriven from the dead-letter queue: a failure tried again, which asks
    the team's service (`keeping_refunds(**service)`) first (decision 59)."""
    settings.MAX_ATTEMPTS, settings.BACKOFF_BASE_SECONDS = 3, 0.1
    with thread_server(keeping_refunds(**service)) as provider:
        provider.refunds, provider.looks, provider.posts = {}, [], []
        settings.SURETY_CONNECTORS = {**settings.SURETY_CONNECTORS, "refund": {
            "class": "ledger.connectors.signed_http.SignedHttpConnector",
            "options": {"url": f"{provider.url}/refunds", "secret": "s3cret"}}}
        action = confirmed_absent(action_request(
            agent=make_agent(f"rl-{order}")[0], operation_key=f"refund:{order}:dec-1", action_type="refund",
            target=order, params={"amount": "25.00", "currency": "EUR"})[0])
        deadletter_redrive(DeadLetter.objects.get(action=action, status="open"),
                           actor=person("olga", "operators"), reason="the customer still waits")
        yield Action.objects.get(pk=action.pk), provider


def attempted(action):
    """Claim the queued action once its attempt is due, and run it."""
    action_run_claimed(wait_until(lambda: action_claim_next("tests", only=action.pk), seconds=15,
                                  message="its attempt due"))
    return Action.objects.get(pk=action.pk)


def test_a_retried_failure_whose_look_first_is_rate_limited_waits_unsent_and_spends_no_attempt(settings):
    """The look before the call of a failure tried again is answered 429: nothing is sent, and the
    action waits in the queue for the provider's wait. Its claim made no attempt: the provider
    only asked to be left alone (the rate-limited looks in a row are counted, and bounded, apart)."""
    with redriven_refund(settings, "ORD-429-retried", limited_looks=1, retry_after="120") as (action, provider):
        attempts = action.attempts
        action = attempted(action)
        assert (len(provider.looks), provider.posts) == (1, [])
    assert action.status == "queued" and seconds_until_due(action) >= 115
    assert (action.evidence[-1]["rate_limited_looks"], action.evidence[-1]["retry_after"]) == (1, 120)
    assert action.attempts == attempts


def test_a_retried_failures_rate_limited_looks_leave_its_call_its_retries(settings):
    """Two looks rate-limited, then the call rate-limited too: that call, the only one made, is
    tried again after the provider's wait as a first call would be, not dead-lettered (with an
    alert to people) as out of attempts that the looks spent."""
    with redriven_refund(settings, "ORD-429-spent", limited_looks=2, limited_posts=1,
                         retry_after="1") as (action, provider):
        for _ in range(3):
            action = attempted(action)
            assert action.status == "queued", (action.status, action.error, action.evidence[-1])
        assert (len(provider.looks), len(provider.posts), provider.refunds) == (3, 1, {})
        action = attempted(action)
        assert (action.status, action.external_ref) == ("succeeded", provider.refunds[action.operation_key])
    assert not DeadLetter.objects.filter(action=action, status="open").exists()
