"""The first of two approvals tells the people the item now waits for, each with a decision link
of their own, as its overdue alert does (dlq.alerts.review_alert_second_approval, delivered by
`_send`): not who gave it, nor their delegate, nor an address nobody here has. Through a real
SMTP server (aiosmtpd) and the job the approval queued in this run's Redis, which exists only
once the approval committed; an approval refused, rolled back or posted twice tells nobody a
second time. They learnt of it only from the dashboard before. An item that no longer waits when
its mail is to go (decided meanwhile, or between the tries of a mail server down) is mailed to
nobody: its e-mail is recorded done, with why, and never tried again."""

import json
import re
import threading
from datetime import timedelta
from functools import partial
from decimal import Decimal

import django_rq
import pytest
import redis
from django.db import transaction
from django.test import Client
from django.utils import timezone

from approvals.delegation import delegation_name
from approvals.models import DecisionLink, Limit, ReviewItem, ReviewKind, ReviewStatus
from approvals.reviews import approval_expire_due
from dlq.alerts import alert_deliver
from dlq.models import Alert
from dlq.overdue import review_alert_overdue
from ledger import clock
from ledger.actions import action_request
from tests.conftest import REDIS_URL
from tests.connectors.test_email import SMTP_BACKEND, MailServer
from tests.dlq.test_alert_delivery import scheduled_tries
from tests.dlq.test_deadletter_entries import receiver  # noqa: F401 (a fixture)
from tests.factories import in_threads, make_agent, person

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("jobs_to_test_redis")]

LINK = re.compile(r"http://[^\s]+/decide/([A-Za-z0-9_-]+)")
TIER = ("alice", "bob", "carol")


@pytest.fixture
def mail_server(settings):
    redis.Redis.from_url(REDIS_URL).flushdb()  # no job an earlier test left for an alert of the same id
    server = MailServer()
    server.controller.start()
    settings.EMAIL_BACKEND = SMTP_BACKEND
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", server.port
    settings.SITE_URL = "http://testserver"
    yield server
    server.controller.stop()


@pytest.fixture
def people():
    """alice, bob and carol approve, and are the limit's first tier with a desk nobody here has;
    olga, an operator, decides only as alice's delegate."""
    users = {name: person(name, "approvers") for name in TIER}
    users["olga"] = person("olga", "operators")
    for user in users.values():
        user.email = f"{user.username}@surety.example"
        user.save(update_fields=["email"])
    Limit.limit_set(actor="system:tests", reason="the tests' policy", action_type="refund", currency="EUR",
                    max_amount=Decimal("500.00"), dual_approval_above=Decimal("5000.00"),
                    approval_expires_after_hours=24,
                    first_tier=", ".join(f"{name}@surety.example" for name in (*TIER, "desk")))
    return users


def asked(amount="6000.00"):
    agent = make_agent("billing-bot")[0]
    action, _ = action_request(agent=agent, operation_key="refund:ORD-1:dec-1", action_type="refund",
                               target="ORD-1", customer="CUST-1", params={"amount": amount, "currency": "EUR"})
    return ReviewItem.objects.get(action=action)


def signed_in(user):
    client = Client()
    client.force_login(user)
    return client


def approve(client, item, reason="the order shows the damage"):
    """Approved from the item's page, on the params it shows."""
    return decide(client, item, "approve", reason)


def decide(client, item, decision, reason):
    return client.post(f"/review/{item.pk}/decide", {"decision": decision, "reason": reason,
                                                      "fingerprint": item.action.params_fingerprint()})


def approve_by_link(client, token, item, reason="from the mail"):
    return client.post(f"/decide/{token}", {"decision": "approve", "reason": reason,
                                            "fingerprint": item.action.params_fingerprint()})


def queued(alert):
    """The delivery jobs of `alert` waiting in this run's Redis."""
    return [job for job in django_rq.get_queue("default").get_jobs()
            if job.func_name == "dlq.alerts.alert_deliver" and job.args == (alert.pk,)]


def second_approval_alerts(item):
    return list(Alert.objects.filter(review_item=item, kind=Alert.Kind.SECOND_APPROVAL).order_by("id"))


def delivered(alert, mail_server):
    """Its queued job run as a worker runs it: recipient -> the body of each message it sent."""
    [job] = queued(alert)
    job.perform()
    return mails(mail_server)


def mails(mail_server):
    return [(str(message["To"]), message.get_content()) for message in mail_server.accepted]


def token_in(body):
    return LINK.search(body).group(1)


def test_the_first_of_two_approvals_mails_the_others_it_waits_for_a_link_of_their_own(people, mail_server):
    item = asked()
    assert approve(signed_in(people["alice"]), item).status_code == 302

    [alert] = second_approval_alerts(item)
    assert alert.recipients == ["bob@surety.example", "carol@surety.example"]
    sent = dict(delivered(alert, mail_server))
    assert sorted(sent) == ["bob@surety.example", "carol@surety.example"]  # not alice, nor the desk
    assert "Approved by alice" in sent["bob@surety.example"]
    assert "the order shows the damage" in sent["bob@surety.example"]
    assert [link.user.username for link in DecisionLink.objects.order_by("user__username")] == ["bob", "carol"]

    bob = signed_in(people["bob"])
    page = bob.get(f"/decide/{token_in(sent['bob@surety.example'])}")
    assert page.status_code == 200 and b'id="approve-button"' in page.content
    assert approve_by_link(bob, token_in(sent["bob@surety.example"]), item).status_code == 302
    item.refresh_from_db()
    assert item.status == ReviewStatus.APPROVED and item.approvals.count() == 2
    assert len(second_approval_alerts(item)) == 1  # the second approval tells nobody


def test_an_approval_through_the_first_mails_link_tells_the_others_and_the_link_is_refused_after(people,
                                                                                                 mail_server):
    item = asked()
    assert review_alert_overdue(now=item.deadline + timedelta(minutes=1)) == 1
    alert_deliver(Alert.objects.get(review_item=item).pk)
    first = dict(mails(mail_server))
    alice = signed_in(people["alice"])
    assert approve_by_link(alice, token_in(first["alice@surety.example"]), item).status_code == 302

    [alert] = second_approval_alerts(item)
    second = delivered(alert, mail_server)[len(first):]
    assert sorted(to for to, _ in second) == ["bob@surety.example", "carol@surety.example"]

    again = alice.post(f"/decide/{token_in(first['alice@surety.example'])}",
                       {"decision": "approve", "reason": "again", "fingerprint": item.action.params_fingerprint()})
    assert again.status_code == 410 and b"works once" in again.content
    assert ReviewItem.objects.get(pk=item.pk).status == ReviewStatus.OPEN
    assert len(second_approval_alerts(item)) == 1


def test_a_first_mails_link_used_by_the_first_approver_after_approving_from_the_page_decides_nothing(
        people, mail_server):
    item = asked()
    assert review_alert_overdue(now=item.deadline + timedelta(minutes=1)) == 1
    alert_deliver(Alert.objects.get(review_item=item).pk)
    token = token_in(dict(mails(mail_server))["alice@surety.example"])
    alice = signed_in(people["alice"])
    assert approve(alice, item).status_code == 302

    page = alice.get(f"/decide/{token}")
    assert b'id="approved-by-me"' in page.content and b'id="approve-button"' not in page.content
    posted = approve_by_link(alice, token, item)
    assert posted.status_code == 303 and "four eyes" in alice.get(posted["Location"]).content.decode()
    assert ReviewItem.objects.get(pk=item.pk).approvals.count() == 1
    assert DecisionLink.objects.get(user=people["alice"]).used_at is None
    assert len(second_approval_alerts(item)) == 1  # alice's own approval's, none for the refusal


@pytest.mark.parametrize("by", ["alice", "olga"], ids=["by herself", "by her delegate"])
def test_neither_the_first_approver_nor_their_delegate_is_mailed(people, mail_server, by):
    now = timezone.now()
    delegation_name(person=people["alice"], delegate=people["olga"], starts_at=now - timedelta(hours=1),
                    ends_at=now + timedelta(hours=24), reason="on leave")
    item = asked()
    assert approve(signed_in(people[by]), item).status_code == 302

    [alert] = second_approval_alerts(item)
    assert sorted(to for to, _ in delivered(alert, mail_server)) == ["bob@surety.example", "carol@surety.example"]
    assert sorted(link.user.username for link in DecisionLink.objects.all()) == ["bob", "carol"]


def test_an_edit_down_still_above_two_approvals_tells_the_others_of_its_version(people, mail_server):
    item = asked("9000.00")
    edited = signed_in(people["bob"]).post(f"/review/{item.pk}/edit", {
        "param_amount": "6000.00", "reason": "only the damaged part",
        "fingerprint": item.action.params_fingerprint()})
    assert edited.status_code == 302
    version = ReviewItem.objects.get(action__supersedes=item.action, kind=ReviewKind.APPROVAL)
    assert version.status == ReviewStatus.OPEN and version.approvals.get().user == people["bob"]

    assert not second_approval_alerts(item)
    [alert] = second_approval_alerts(version)
    assert sorted(to for to, _ in delivered(alert, mail_server)) == ["alice@surety.example", "carol@surety.example"]


def test_the_mail_goes_after_commit_and_not_at_all_when_the_approval_is_rolled_back(people, mail_server):
    item = asked()
    alice = signed_in(people["alice"])
    with pytest.raises(RuntimeError), transaction.atomic():
        assert approve(alice, item).status_code == 302
        [alert] = second_approval_alerts(item)
        assert not queued(alert)  # not before the commit
        raise RuntimeError("the transaction around it ends in a rollback")
    assert not second_approval_alerts(item) and not queued(alert)
    assert ReviewItem.objects.get(pk=item.pk).approvals.count() == 0

    with transaction.atomic():
        assert approve(alice, item).status_code == 302
        [alert] = second_approval_alerts(item)
        assert not queued(alert)
    assert len(queued(alert)) == 1
    assert sorted(to for to, _ in delivered(alert, mail_server)) == ["bob@surety.example", "carol@surety.example"]


def test_a_double_post_and_a_retried_delivery_mail_each_person_once(people, mail_server):
    item = asked()
    clients = [signed_in(people["alice"]) for _ in range(2)]
    start = threading.Barrier(2)

    def post(client):
        start.wait(30)
        return approve(client, item).status_code

    answers = in_threads(*(partial(post, client) for client in clients))
    assert sorted(answers) == [302, 303]  # the second refused: four eyes, the approval is hers already
    assert approve(clients[0], item).status_code == 303  # posted again later: refused as well

    [alert] = second_approval_alerts(item)
    delivered(alert, mail_server)
    alert_deliver(alert.pk)  # the sweeper's redelivery of a job it took for lost
    assert sorted(to for to, _ in mails(mail_server)) == ["bob@surety.example", "carol@surety.example"]
    assert DecisionLink.objects.count() == 2


def test_no_mail_when_the_item_waits_for_nobody_its_tier_names(people, mail_server, settings):
    """A limit without a first tier alerts the operations group, whose mailbox is nobody's here."""
    Limit.limit_set(actor="system:tests", reason="no tier", action_type="refund", currency="EUR", first_tier="")
    settings.ALERT_EMAILS = ["operations@surety.example"]
    item = asked()
    assert approve(signed_in(people["alice"]), item).status_code == 302
    assert not second_approval_alerts(item) and not Alert.objects.exists()


@pytest.fixture
def webhook(settings, receiver):
    """The operations webhook's receiver: the bodies it was posted."""
    settings.ALERT_WEBHOOK_URL = receiver.url
    return receiver


def email_attempts(alert):
    attempts = alert.deliveries.filter(channel="email").order_by("attempt")
    return list(attempts.values_list("attempt", "ok", "detail", "reached"))


def ended(item, people, how):
    """The item no longer waits for anyone, `how`: bob's second approval or his rejection, its
    window closed (nobody decides it, before the sweeper's pass) or the sweeper's expiry."""
    if how in ("approved", "rejected"):
        decision = {"approved": "approve", "rejected": "reject"}[how]
        assert decide(signed_in(people["bob"]), item, decision, "seen it").status_code == 302
    else:
        ReviewItem.objects.filter(pk=item.pk).update(expires_at=clock.now() - timedelta(seconds=1))
        if how == "expired":
            assert approval_expire_due() == 1


@pytest.mark.parametrize("how, why", [
    ("approved", "approved by user:bob"), ("rejected", "rejected by user:bob"),
    ("window closed", "its approval window closed"), ("expired", "expired")])
def test_an_item_that_no_longer_waits_when_the_mail_is_to_go_is_mailed_to_nobody(people, mail_server, webhook,
                                                                                  how, why):
    """Bob decided (or the window ended) while the first approval's alert waited for a worker: bob
    and carol were mailed "waiting for a second approval" of an item decided."""
    item = asked()
    assert approve(signed_in(people["alice"]), item).status_code == 302
    [alert] = second_approval_alerts(item)
    ended(item, people, how)
    assert ReviewItem.objects.get(pk=item.pk).status == ("open" if how == "window closed" else how)

    assert delivered(alert, mail_server) == []
    assert email_attempts(alert) == [(1, True, f"not mailed: no longer waiting: {why}", [])]
    assert [json.loads(post["body"])["kind"] for post in webhook.received] == ["second_approval"]  # the operations' record of it still goes
    alert.refresh_from_db()
    assert alert.delivered_at is not None and not scheduled_tries(alert)  # done: never tried again
    assert not DecisionLink.objects.exists()
    page = signed_in(people["alice"]).get(item.get_absolute_url())  # the item's page says so
    assert alert.subject in page.content.decode() and f"not mailed: no longer waiting: {why}" in page.content.decode()


def test_an_item_decided_while_the_mail_server_is_down_is_not_mailed_when_it_is_back(people, mail_server):
    """The mail server refuses the first try; bob approves before the next: the retry, hours
    later in a long outage, mailed carol (and bob) of a wait that was over."""
    item = asked()
    assert approve(signed_in(people["alice"]), item).status_code == 302
    [alert] = second_approval_alerts(item)
    mail_server.script["RCPT"] = ["451 4.3.0 Try again later"]
    assert delivered(alert, mail_server) == []
    [(attempt, ok, detail, reached)] = email_attempts(alert)
    assert (attempt, ok, reached) == (1, False, []) and "Try again later" in detail
    [(retry, _)] = scheduled_tries(alert)

    assert approve(signed_in(people["bob"]), item, "seen it").status_code == 302
    django_rq.get_queue("default").scheduled_job_registry.remove(retry)
    retry.perform()  # the scheduled try, as the worker's scheduler runs it

    assert mails(mail_server) == []
    assert email_attempts(alert)[1:] == [(2, True, "not mailed: no longer waiting: approved by user:bob", [])]
    alert.refresh_from_db()
    assert alert.delivered_at is not None and not scheduled_tries(alert)


def test_a_mail_sent_halfway_before_the_item_was_decided_is_not_finished_after(people, mail_server):
    """Bob's mail went, carol's was refused; bob approved from his link: carol is not mailed at
    the retry."""
    item = asked()
    assert approve(signed_in(people["alice"]), item).status_code == 302
    [alert] = second_approval_alerts(item)
    mail_server.script["RCPT"] = [None, "451 4.3.0 Try again later"]
    [(to, body)] = delivered(alert, mail_server)
    assert to == "bob@surety.example"
    assert approve_by_link(signed_in(people["bob"]), token_in(body), item).status_code == 302

    alert_deliver(alert.pk)  # the next try
    assert [to for to, _ in mails(mail_server)] == ["bob@surety.example"]
    assert [(attempt, ok, reached) for attempt, ok, _, reached in email_attempts(alert)] == [
        (1, False, ["bob@surety.example"]), (2, True, [])]
    alert.refresh_from_db()
    assert alert.delivered_at is not None


def test_an_item_still_waiting_at_the_retry_is_mailed_as_before(people, mail_server):
    item = asked()
    assert approve(signed_in(people["alice"]), item).status_code == 302
    [alert] = second_approval_alerts(item)
    mail_server.script["RCPT"] = ["451 4.3.0 Try again later"]
    assert delivered(alert, mail_server) == []
    alert_deliver(alert.pk)
    assert sorted(to for to, _ in mails(mail_server)) == ["bob@surety.example", "carol@surety.example"]


def test_an_escalated_items_first_approval_tells_its_next_tier_too(people, mail_server):
    """Its tiers as its overdue alerts name them (approvals.models.item_tiers): the first, and the
    next once escalated."""
    dave = person("dave", "approvers")
    dave.email = "dave@surety.example"
    dave.save(update_fields=["email"])
    Limit.limit_set(actor="system:tests", reason="a next tier", action_type="refund", currency="EUR",
                    max_amount=Decimal("500.00"), dual_approval_above=Decimal("5000.00"),
                    first_tier="bob@surety.example", next_tier="dave@surety.example", escalate_after_hours=1)
    item = asked()
    assert review_alert_overdue(now=item.deadline + timedelta(minutes=1)) == 1
    assert review_alert_overdue(now=item.deadline + timedelta(hours=2)) == 1
    assert approve(signed_in(people["alice"]), item).status_code == 302

    [alert] = second_approval_alerts(item)
    assert alert.recipients == ["bob@surety.example", "dave@surety.example"]
