"""One message per recipient, message type and decision holds for the mailbox the mail reaches
(decision 72): a recipient is recorded as Django's mail sends to it. Recorded as written, a full-width
domain, an internationalised one and its ASCII form, or a quoted part before the @ and the same
unquoted were two recipients, and a retry under another key sent the one e-mail twice, to one
mailbox. Through the API, sent by the e-mail connector to a real SMTP server run by the tests."""

import importlib

import pytest
from django.apps import apps as django_apps
from django.core.mail.message import sanitize_address

from ledger.executor import action_claim_next, action_run_claimed
from ledger.models import Action, Task, request_fingerprint
from ledger.recipients import email_recipient
from sharding.router import names
from tests.connectors.test_email import email_messages, mail_server  # noqa: F401 (fixtures)
from tests.factories import make_agent_on, post_action_in_process

# Two spellings of one mailbox each, the second as the mail is sent to it.
SPELLINGS = [
    pytest.param("ada@\uff25\uff38\uff21\uff2d\uff30\uff2c\uff25.com", "ada@example.com", id="full-width domain"),
    pytest.param("ada@b\u00fccher.example", "ada@xn--bcher-kva.example", id="internationalised domain, its ASCII form"),
    pytest.param('"ada"@example.com', "ada@example.com", id="quoted part before the @"),
]


def message(to):
    return {"action_type": "send_message", "target": to, "decision_id": "dec-77",
            "params": {"channel": "email", "message_type": "refund_confirmation", "body": "We refunded 25.00 EUR."}}


def send_all():
    """Every message due is claimed and sent, as a worker would, in this process."""
    while (claimed := action_claim_next("tests")) is not None:
        action_run_claimed(claimed)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("jobs_to_test_redis")
@pytest.mark.parametrize(("first", "second"), SPELLINGS)
def test_a_retry_under_another_key_with_the_address_spelled_otherwise_sends_one_message(client, email_messages,
                                                                                    first, second):
    make_agent_on(client)
    created = post_action_in_process(client, "first-key", message(first))
    send_all()
    again = post_action_in_process(client, "second-key", message(second))
    send_all()

    assert [str(m["To"]) for m in email_messages.accepted] == [second]  # one message, to the mailbox
    assert created.status_code == 201 and created.json()["target"] == second  # recorded as it is sent
    # docs/contract.md: another key, same decision's effect, same agent, same params: the first one.
    assert (again.status_code, again.headers.get("Idempotent-Replayed")) == (200, "true"), again.content
    assert again.json()["operation_key"] == "first-key"
    assert list(Action.objects.values_list("operation_key", "status")) == [("first-key", "succeeded")]


@pytest.mark.parametrize("address", ["ada@example.com", "Ada@Example.COM", "ada@\uff25\uff38\uff21.com",
                                     "ada@b\u00fccher.example", "ada@xn--bcher-kva.example", '"ada"@example.com',
                                     '"a b"@example.com', '"a\\"b"@example.com', "ada@[127.0.0.1]",
                                     "ada@stra\u00dfe.example"])
def test_the_recipient_is_the_address_django_sends_to_its_domain_in_lower_case(address):
    sent = sanitize_address(address, "utf-8")
    local, _, domain = sent.rpartition("@")
    assert email_recipient(address) == f"{local}@{domain.lower()}"
    assert email_recipient(email_recipient(address)) == email_recipient(address)


@pytest.mark.django_db
@pytest.mark.parametrize("target", ["a@[", '(@)"', "a@b@["])
def test_an_address_the_mail_library_cannot_read_is_refused_not_a_500(client, target):
    """The standard library's header parser, which reads an address before it is sent to, fails on
    some malformed ones with errors other than ValueError (AttributeError, IndexError): the
    request answered 500."""
    make_agent_on(client)
    answer = post_action_in_process(client, "key-1", message(target))
    assert answer.status_code == 400 and answer.json()["errors"]["target"] == ["Not an e-mail address."]
    assert not Action.objects.exists()


@pytest.mark.django_db
def test_an_address_whose_domain_the_mail_cannot_send_to_is_refused(client):
    """Django's rule takes a domain IDNA refuses (a label of Latin and Hebrew letters): its message
    failed at the provider's call, after it was recorded."""
    make_agent_on(client)
    answer = post_action_in_process(client, "key-1", message("ada@a\u05d0.example"))
    assert answer.status_code == 400 and answer.json()["errors"]["target"] == ["Not an e-mail address."]
    assert not Action.objects.exists()


@pytest.mark.django_db
@pytest.mark.usefixtures("jobs_to_test_redis")
def test_a_message_recorded_before_in_its_old_spelling_is_replayed_under_its_key(client):
    """docs/contract.md: a message recorded before keeps the spelling it was sent with, and its
    replay under its key, in either spelling, is still 200."""
    make_agent_on(client)
    assert post_action_in_process(client, "old-key", message("ada@b\u00fccher.example")).status_code == 201
    old = message("ada@b\u00fccher.example")  # as the rule before this one recorded it
    Action.objects.update(target=old["target"], fingerprint=request_fingerprint("send_message", old["target"],
                                                                                old["params"], ""))

    for spelling in ("ada@b\u00fccher.example", "ada@B\u00fccher.example", "ada@xn--bcher-kva.example"):
        again = post_action_in_process(client, "old-key", message(spelling))
        assert again.status_code == 200, (spelling, again.content)
    assert Action.objects.get().target == "ada@b\u00fccher.example"


def test_the_router_places_a_message_by_its_recipient_as_the_shard_records_it():
    for spelling in ('"ada"@example.com', "ada@\uff25\uff38\uff21\uff2d\uff30\uff2c\uff25.com"):
        assert names("action", "key-1", message(spelling))[1] == ["target:ada@example.com"]
    body = {"workflow": "refund", "input": {"order_id": "ORD-1", "customer": "C-1", "notify": "ada@b\u00fccher.example"}}
    assert names("task", "task-1", body)[1] == ["customer:C-1", "target:ORD-1", "target:ada@xn--bcher-kva.example"]


@pytest.mark.django_db
@pytest.mark.usefixtures("jobs_to_test_redis")
def test_the_migration_gives_a_task_recorded_before_its_print_over_the_address_as_sent(client):
    reprint = importlib.import_module("ledger.migrations.0059_refund_task_notify_as_sent")
    one_spelling = reprint.before
    make_agent_on(client)

    def post_task(notify):
        body = {"workflow": "refund", "input": {"order_id": "ORD-1", "amount": "25.00", "currency": "EUR",
                                                "customer": "CUST-1", "notify": notify}}
        return client.post("/api/v1/tasks", body, content_type="application/json",
                           headers={"Idempotency-Key": "task-n1"})

    assert post_task("ada@B\u00fccher.example").status_code == 201
    assert Task.objects.get().input["notify"] == "ada@xn--bcher-kva.example"
    # As the rule before recorded it: its notify with the domain in lower case, its print over that.
    written = {**Task.objects.get().input, "notify": "ada@b\u00fccher.example"}
    Task.objects.update(input=written, fingerprint=one_spelling.hashed("workflow:refund", "task-n1",
                                                                       one_spelling.canonical(written)))
    assert post_task("ada@B\u00fccher.example").status_code == 422

    reprint.forwards(django_apps, None)

    for spelling in ("ada@B\u00fccher.example", "ada@b\u00fccher.example", "ada@xn--bcher-kva.example"):
        assert post_task(spelling).status_code == 200, spelling
    assert Task.objects.get().input == written  # what was recorded stays as it was
    reprint.backwards(django_apps, None)
    assert Task.objects.get().fingerprint == one_spelling.hashed("workflow:refund", "task-n1",
                                                                 one_spelling.canonical(written))
