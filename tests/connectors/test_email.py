"""The e-mail connector against a real SMTP server (aiosmtpd) run by the tests: one message per
operation key under retries, and a message whose fate SMTP cannot tell goes to a person."""

import asyncio
import email
import email.policy
import hashlib
import time

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult

from console.sweeper import sweep_once
from ledger.actions import action_request
from ledger.connectors.email import EmailConnector
from ledger.executor import action_claim_next, action_run_claimed
from ledger.models import Action
from tests.conftest import free_port, wait_until
from tests.factories import api_client, make_agent, post_action, send_timed, send_together

SMTP_BACKEND = "django.core.mail.backends.smtp.EmailBackend"


class MailServer:
    """An SMTP server that keeps every message it accepted, and counts every message body it
    was sent. `script` says how the next RCPT or DATA commands are answered (None: as usual): a reply such as
    "451 4.3.0 Try again later", "drop" (close the connection without a word once the whole
    message has arrived) or a number of seconds to wait before accepting it (for MAIL, RCPT and
    QUIT, before answering as usual)."""

    def __init__(self, **smtp_options):
        self.port = free_port()
        self.accepted = []  # the messages, as email.message.Message
        self.bodies_received = 0
        self.script = {"MAIL": [], "RCPT": [], "DATA": [], "QUIT": []}
        self.controller = Controller(self, hostname="127.0.0.1", port=self.port, **smtp_options)

    async def handle_MAIL(self, server, session, envelope, address, mail_options):
        if self.script["MAIL"]:  # only a slow answer (seconds), then as usual
            await asyncio.sleep(self.script["MAIL"].pop(0))
        envelope.mail_from = address
        envelope.mail_options.extend(mail_options)
        return "250 OK"

    async def handle_QUIT(self, server, session, envelope):
        if self.script["QUIT"]:  # only a slow answer (seconds)
            await asyncio.sleep(self.script["QUIT"].pop(0))
        return "221 Bye"

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        reply = self.script["RCPT"].pop(0) if self.script["RCPT"] else None
        if isinstance(reply, float):  # a slow answer, then as usual
            await asyncio.sleep(reply)
        elif reply is not None:
            return reply
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        self.bodies_received += 1
        reply = self.script["DATA"].pop(0) if self.script["DATA"] else "250 Message accepted for delivery"
        if reply == "drop":
            server.transport.abort()
            return "421 never sent"
        if isinstance(reply, float):
            # The message is queued for delivery; only the answer comes late (if the client
            # is still there to hear it).
            self._keep(envelope)
            await asyncio.sleep(reply)
            return "250 Accepted late"
        if reply.startswith("250"):
            self._keep(envelope)
        return reply

    def _keep(self, envelope):
        self.accepted.append(email.message_from_bytes(envelope.original_content, policy=email.policy.default))

    def message_ids(self):
        return [str(message["Message-ID"]).strip() for message in self.accepted]

    def worker_env(self):
        return {"CONNECTOR_SEND_MESSAGE": "email", "EMAIL_BACKEND": SMTP_BACKEND,
                "EMAIL_HOST": "127.0.0.1", "EMAIL_PORT": str(self.port)}


@pytest.fixture
def mail_server():
    server = MailServer()
    server.controller.start()
    yield server
    server.controller.stop()


@pytest.fixture
def email_messages(settings, mail_server):
    """Messages go through the e-mail connector to the test's SMTP server, in this process."""
    settings.SURETY_CONNECTORS = {**settings.SURETY_CONNECTORS, "send_message": {
        "class": "ledger.connectors.email.EmailConnector", "options": {}}}
    settings.EMAIL_BACKEND = SMTP_BACKEND
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", mail_server.port
    settings.BACKOFF_BASE_SECONDS = settings.BACKOFF_MAX_SECONDS = 0.01
    return mail_server


def message_body(recipient, channel="email"):
    return {"action_type": "send_message", "target": recipient, "decision_id": "dec-1",
            "params": {"channel": channel, "message_type": "refund_confirmation", "body": "We refunded 25.00 EUR."}}


def expected_message_id(key):
    return f"<{hashlib.sha256(key.encode()).hexdigest()}@surety.example>"


def settled(client, key, seconds=30):
    return wait_until(
        lambda: (a := client.get(f"/api/v1/actions/{key}").json())["status"] not in {"queued", "pending", "unknown"} and a,
        seconds=seconds, message=f"{key} to settle",
    )


# --- Through Surety's API and workers --------------------------------------------------------


def test_twenty_identical_posts_and_later_replays_send_one_message_whose_id_comes_from_the_key(stack, mail_server):
    _, token = make_agent("notifier")
    key = "msg:ann@customers.example:refund_confirmation:dec-1"
    body = message_body("ann@customers.example")
    stack.start_worker(**mail_server.worker_env())
    stack.start_worker(**mail_server.worker_env())

    answers = send_together(stack.url, token, [lambda client: post_action(client, key, body)] * 20)
    client = api_client(stack.url, token)
    done = settled(client, key)
    replayed = post_action(client, key, body)
    sweep_once()  # rings the doorbell once more: nothing is left to send
    time.sleep(1)

    assert sorted(a.status_code for a in answers) == [200] * 19 + [201]
    assert replayed.status_code == 200 and replayed.headers["Idempotent-Replayed"] == "true"
    assert done["status"] == "succeeded", done
    assert done["external_ref"] == expected_message_id(key)
    assert mail_server.message_ids() == [expected_message_id(key)]
    assert mail_server.bodies_received == 1
    message = mail_server.accepted[0]
    assert (message["To"], message["Subject"]) == ("ann@customers.example", "Refund confirmation")
    assert message.get_content().strip() == "We refunded 25.00 EUR."


def test_a_connection_dropped_after_data_goes_to_a_person_and_is_not_sent_again(stack, mail_server):
    _, token = make_agent("notifier")
    key = "msg:bob@customers.example:refund_confirmation:dec-2"
    mail_server.script["DATA"].append("drop")
    stack.start_worker(**mail_server.worker_env())

    client = api_client(stack.url, token)
    assert post_action(client, key, message_body("bob@customers.example")).status_code == 201
    done = settled(client, key)
    sweep_once()
    time.sleep(1)

    assert done["status"] == "needs_review", done
    assert mail_server.bodies_received == 1  # it arrived; Surety cannot know, and does not send it again
    evidence = Action.objects.get(operation_key=key).evidence
    assert evidence[0]["code"] == "smtp_connection_lost"
    assert expected_message_id(key) in evidence[0]["message"]
    assert evidence[-1]["found"] is None
    assert evidence[-1]["verification"]["message_id"] == expected_message_id(key)


def test_a_worker_killed_while_the_server_holds_its_answer_is_not_rerun_into_a_second_message(stack, mail_server,
                                                                                              settings):
    _, token = make_agent("notifier")
    key = "msg:gus@customers.example:refund_confirmation:dec-3"
    mail_server.script["DATA"].append(3.0)  # the message is queued; the answer comes after 3 s
    doomed = stack.start_worker(**mail_server.worker_env(), CONNECTOR_TIMEOUT=6, LEASE_SECONDS=8)

    client = api_client(stack.url, token)
    assert post_action(client, key, message_body("gus@customers.example")).status_code == 201
    wait_until(lambda: mail_server.bodies_received, seconds=20, interval=0.02, message="the message to arrive")
    stack.kill_worker(doomed)  # inside the wait: the worker never hears the answer
    settings.CONNECTOR_TIMEOUT, settings.LEASE_SECONDS = 6, 8
    stack.start_worker(**mail_server.worker_env())

    def swept_and_settled():
        sweep_once()
        action = Action.objects.get(operation_key=key)
        return action.status not in ("pending", "unknown") and action

    action = wait_until(swept_and_settled, seconds=40, interval=0.25, message="the sweeper to settle the action")

    assert action.status == "needs_review"
    assert action.attempts == 1
    assert "lease_expired" in action.evidence[0]
    assert action.evidence[-1]["found"] is None
    assert mail_server.bodies_received == len(mail_server.accepted) == 1


# --- Replies and faults, in this process -----------------------------------------------------


def run_once(action):
    claimed = wait_until(lambda: action_claim_next("tests", only=action.pk), seconds=10, message="a claim")
    action_run_claimed(claimed)
    return Action.objects.get(pk=action.pk)


def run_timed(action, monkeypatch):
    """Runs the action once; also answers how long the connector's send took."""
    with send_timed(monkeypatch, EmailConnector) as took:
        action = run_once(action)
    return action, took[0]


def request_message(key, recipient, channel="email"):
    body = message_body(recipient, channel)
    return action_request(agent=make_agent("notifier")[0], operation_key=key, action_type="send_message",
                          target=recipient, params=body["params"])[0]


db = pytest.mark.django_db(transaction=True)
pytestmark = pytest.mark.usefixtures("jobs_to_test_redis")


@db
@pytest.mark.parametrize("command", ["RCPT", "DATA"])
def test_a_deferred_message_is_sent_again_under_the_same_key_and_arrives_once(email_messages, command):
    email_messages.script[command].append("451 4.3.0 Try again later")
    action = request_message(f"msg:deferred-{command}", "cy@customers.example")

    action = run_once(action)
    assert action.status == "queued"
    assert action.evidence[-1]["code"] == "smtp_451"
    action = run_once(action)

    assert action.status == "succeeded"
    assert action.attempts == 2
    assert email_messages.message_ids() == [expected_message_id(action.operation_key)]


@db
def test_a_message_accepted_after_the_timeout_goes_to_a_person_and_is_not_sent_again(email_messages, settings):
    settings.CONNECTOR_TIMEOUT = 0.5
    email_messages.script["DATA"].append(2.0)
    action = run_once(request_message("msg:late", "fay@customers.example"))

    assert action.status == "unknown"
    assert action.evidence[-1]["code"] == "smtp_connection_lost"
    assert "once DATA was sent" in action.evidence[-1]["message"]  # cut off at the call's deadline
    action = run_once(action)  # verification: SMTP cannot be asked
    assert action.status == "needs_review"
    assert email_messages.bodies_received == len(email_messages.accepted) == 1


@db
def test_a_server_that_drips_its_answers_never_gets_the_message_after_the_deadline(email_messages, settings,
                                                                                    monkeypatch):
    """Each step waited up to CONNECTOR_TIMEOUT of its own: a server slow at RCPT took the message
    in after the call's deadline, when the sweeper may already have given the action to a person.
    The conversation is held to one deadline: at it the session is cut, before DATA, and nothing
    was sent, so the message is sent again under the same key, once."""
    settings.CONNECTOR_TIMEOUT = 2.0  # within the tests' lease (the call's deadline never outlives it)
    email_messages.script["MAIL"].append(1.8)  # each step within the timeout, the two past it
    email_messages.script["RCPT"].append(1.8)
    action, took = run_timed(request_message("msg:dripped", "gil@customers.example"), monkeypatch)

    # Waited out, the two slow steps take 3.6 s; a loaded machine's cut-off may come a little late.
    assert took < settings.CONNECTOR_TIMEOUT + 1.0
    assert action.status == "queued" and action.evidence[-1]["code"] == "smtp_connection_lost"
    time.sleep(2)  # the server's slow answer comes (3.6 s after the call began): the message never follows it
    assert email_messages.bodies_received == 0
    action = run_once(action)
    assert action.status == "succeeded" and email_messages.message_ids() == [expected_message_id(action.operation_key)]


@db
def test_a_server_slow_to_say_goodbye_after_taking_the_message_keeps_no_call_past_its_deadline(email_messages,
                                                                                             settings, monkeypatch):
    """The message was taken in; the QUIT after it was answered late. The session's end is held to
    the deadline too (the call settled after it would be refused as a late write, and the message,
    sent, would go to a person): the message counts as sent, once, in time."""
    settings.CONNECTOR_TIMEOUT = 1.0
    email_messages.script["DATA"].append(0.5)  # taken in, its answer half the deadline later
    email_messages.script["QUIT"].append(3.0)
    action, took = run_timed(request_message("msg:slow-bye", "hal@customers.example"), monkeypatch)

    # The whole session as answered: 3.5 s; a loaded machine's cut-off may come a little late.
    assert took < settings.CONNECTOR_TIMEOUT + 1.0
    assert action.status == "succeeded" and email_messages.message_ids() == [expected_message_id(action.operation_key)]


@db
@pytest.mark.parametrize("command", ["RCPT", "DATA"])
def test_a_message_the_server_refuses_fails_for_good(email_messages, command):
    email_messages.script[command].append("550 5.1.1 No such mailbox")
    action = run_once(request_message(f"msg:refused-{command}", "nobody@customers.example"))

    assert action.status == "failed"
    assert action.error["code"] == "smtp_550" and action.error["retryable"] is False
    assert email_messages.accepted == []


@db
def test_no_mail_server_means_the_message_was_not_sent(email_messages, settings):
    settings.EMAIL_PORT = free_port()  # nothing listens there
    action = run_once(request_message("msg:no-server", "dee@customers.example"))

    assert action.status == "queued"  # a new attempt, as nothing was offered
    assert action.evidence[-1]["code"] == "smtp_connect_failed"


@db
def test_a_login_the_mail_server_refuses_is_named_in_the_evidence(email_messages, settings):
    # This server asks for a login (over plain SMTP, as nothing here has a certificate).
    refusing = MailServer(auth_require_tls=False,
                          authenticator=lambda *args: AuthResult(success=False, handled=False))
    refusing.controller.start()
    try:
        settings.EMAIL_PORT = refusing.port
        settings.EMAIL_HOST_USER, settings.EMAIL_HOST_PASSWORD = "surety", "wrong"
        action = run_once(request_message("msg:wrong-login", "eve@customers.example"))
    finally:
        refusing.controller.stop()

    assert action.status == "queued"
    assert action.evidence[-1]["code"] == "smtp_login_refused", action.evidence[-1]["message"]
    assert "EMAIL_HOST_PASSWORD" in action.evidence[-1]["message"]
    assert refusing.bodies_received == 0


@db
def test_a_message_on_another_channel_is_refused_with_a_clear_code(email_messages):
    action = run_once(request_message("msg:sms", "+4930123456", channel="sms"))

    assert action.status == "failed"
    assert action.error["code"] == "channel_not_supported"
    assert email_messages.bodies_received == 0


# --- Configuration ---------------------------------------------------------------------------


def test_the_check_names_a_login_without_password_and_an_undelivering_backend_in_production(settings):
    assert EmailConnector().check() == []
    settings.EMAIL_HOST_USER, settings.EMAIL_HOST_PASSWORD = "surety", ""
    settings.PRODUCTION, settings.EMAIL_BACKEND = True, "django.core.mail.backends.console.EmailBackend"
    settings.DEFAULT_FROM_EMAIL = "Surety"

    assert EmailConnector().check() == [
        "DEFAULT_FROM_EMAIL 'Surety' is not an address with a domain",
        "EMAIL_HOST_USER is set without EMAIL_HOST_PASSWORD",
        "EMAIL_BACKEND django.core.mail.backends.console.EmailBackend delivers no mail",
    ]
