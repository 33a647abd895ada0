"""An overdue review item's alert mails each person who may decide it a decision link of their
own, through a real SMTP server (aiosmtpd) run by the test. Opening the link (as a mail
scanner or a link previewer does) changes nothing; its person's POST decides once, recorded as
taken through the link; another person, a second use, an expired link or params edited since
are refused and change nothing."""

import re
import threading
import time
from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.db import connection
from django.test import Client

from approvals.decisions import review_decide, review_edit
from approvals.links import digest, link_issue
from approvals.models import DecisionLink, Limit, ReviewItem, ReviewStatus
from dlq.alerts import alert_deliver
from dlq.models import Alert
from dlq.overdue import review_alert_overdue
from ledger.actions import action_request
from ledger.models import AuditEvent
from tests.connectors.test_email import SMTP_BACKEND, MailServer
from tests.browser.decisions import refund, unknown
from tests.factories import audit_events, make_agent, person

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("jobs_to_test_redis")]

LINK = re.compile(r"http://[^\s]+/decide/([A-Za-z0-9_-]+)")


@pytest.fixture
def mail_server(settings):
    server = MailServer()
    server.controller.start()
    settings.EMAIL_BACKEND = SMTP_BACKEND
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", server.port
    yield server
    server.controller.stop()


@pytest.fixture
def people():
    call_command("setup_roles", verbosity=0)
    users = {}
    for name in ("alice", "bob"):
        users[name] = get_user_model().objects.create_user(name, f"{name}@surety.example", "pw")
        users[name].groups.add(Group.objects.get(name="approvers"))
    return users


@pytest.fixture
def item(people):
    Limit.limit_set(actor="system:tests", reason="the tests' policy", action_type="refund", currency="EUR",
                    max_amount=Decimal("500.00"), first_tier="alice@surety.example, bob@surety.example, "
                                                             "desk@surety.example")
    agent = make_agent("billing-bot")[0]
    action, _ = action_request(agent=agent, operation_key="refund:ORD-1:full:dec-1", action_type="refund",
                               target="ORD-1", customer="CUST-1", params={"amount": "750.00", "currency": "EUR"})
    return ReviewItem.objects.get(action=action)


def alerted(item, mail_server):
    """The overdue alert raised and delivered by SMTP: recipient -> the message's body."""
    assert review_alert_overdue(now=item.deadline + timedelta(minutes=1)) == 1
    alert_deliver(Alert.objects.get(review_item=item).pk)
    return {str(message["To"]): message.get_content() for message in mail_server.accepted}


def token_for(name, item, mail_server):
    return LINK.search(alerted(item, mail_server)[f"{name}@surety.example"]).group(1)


def signed_in(user):
    client = Client()
    client.force_login(user)
    return client


def approve(client, token, reason="the order shows the damage"):
    page = client.get(f"/decide/{token}")
    fingerprint = re.search(rb'name="fingerprint" value="([0-9a-f]{64})"', page.content).group(1).decode()
    return client.post(f"/decide/{token}", {"decision": "approve", "reason": reason, "fingerprint": fingerprint})


def state(item):
    """Everything a GET must leave as it was."""
    return (list(DecisionLink.objects.order_by("id").values_list("id", "used_at")),
            AuditEvent.objects.count(), ReviewItem.objects.get(pk=item.pk).status,
            sorted(ReviewItem.objects.values_list("id", "status")))


def test_each_person_who_may_decide_gets_a_link_of_their_own_and_only_its_digest_is_kept(item, mail_server):
    bodies = alerted(item, mail_server)
    assert sorted(bodies) == ["alice@surety.example", "bob@surety.example", "desk@surety.example"]
    tokens = {name: LINK.search(bodies[f"{name}@surety.example"]).group(1) for name in ("alice", "bob")}
    assert tokens["alice"] != tokens["bob"]
    assert not LINK.search(bodies["desk@surety.example"])  # no account here: the dashboard's link only
    assert f"/review/{item.pk}/" in bodies["desk@surety.example"]
    links = DecisionLink.objects.order_by("user__username")
    assert [link.user.username for link in links] == ["alice", "bob"]
    assert [link.digest for link in links] == [digest(tokens["alice"]), digest(tokens["bob"])]
    assert all(link.fingerprint == item.action.params_fingerprint() for link in links)
    stored = str(list(DecisionLink.objects.values()))
    assert tokens["alice"] not in stored and tokens["bob"] not in stored


def test_a_scanners_get_and_the_persons_own_get_change_nothing_and_the_link_still_decides(item, mail_server,
                                                                                          people):
    token = token_for("alice", item, mail_server)
    alice = signed_in(people["alice"])  # (signing in is an audit event of its own)
    before = state(item)

    scanner = Client().get(f"/decide/{token}")  # no session: sent to sign in
    assert scanner.status_code == 302 and scanner["Location"].startswith("/accounts/login/")
    assert "no-store" in scanner["Cache-Control"]
    shown = alice.get(f"/decide/{token}")
    assert shown.status_code == 200
    assert shown["Referrer-Policy"] == "same-origin" and "no-store" in shown["Cache-Control"]
    assert f'action="/decide/{token}"'.encode() in shown.content and b'id="approve-button"' in shown.content
    assert state(item) == before

    decided = approve(alice, token)
    assert decided.status_code == 302
    item.refresh_from_db()
    assert item.status == ReviewStatus.APPROVED and item.decided_by == people["alice"]
    [event] = audit_events(item, "approve")
    link = DecisionLink.objects.get(user=people["alice"])
    assert event.after["decision_link"] == {"id": link.pk, "sent_at": link.created_at.isoformat()}
    assert link.used_at is not None


def test_used_twice_refused_the_second_time(item, mail_server, people):
    token = token_for("alice", item, mail_server)
    alice = signed_in(people["alice"])
    assert approve(alice, token).status_code == 302
    again = alice.post(f"/decide/{token}", {"decision": "reject", "reason": "second thoughts"})
    assert again.status_code == 410 and b"works once" in again.content
    assert ReviewItem.objects.get(pk=item.pk).status == ReviewStatus.APPROVED
    assert audit_events(item, "reject").count() == 0


def test_another_persons_link_is_refused_and_stays_usable_by_its_own(item, mail_server, people):
    token = token_for("alice", item, mail_server)
    bob = signed_in(people["bob"])
    before = state(item)
    assert bob.get(f"/decide/{token}").status_code == 403
    refused = bob.post(f"/decide/{token}", {"decision": "approve", "reason": "forwarded to me",
                                            "fingerprint": item.action.params_fingerprint()})
    assert refused.status_code == 403 and b"sent to alice, not to you" in refused.content
    assert state(item) == before
    assert approve(signed_in(people["alice"]), token).status_code == 302


def test_an_expired_link_is_refused(item, mail_server, people, settings):
    settings.DECISION_LINK_SECONDS = 1
    token = token_for("alice", item, mail_server)
    time.sleep(1.1)
    refused = approve_without_page(signed_in(people["alice"]), token, item)
    assert refused.status_code == 410 and b"expired" in refused.content
    assert ReviewItem.objects.get(pk=item.pk).status == ReviewStatus.OPEN


def approve_without_page(client, token, item):
    return client.post(f"/decide/{token}", {"decision": "approve", "reason": "late",
                                            "fingerprint": item.action.params_fingerprint()})


def test_params_edited_down_since_the_mail_are_refused_saying_what_changed(item, mail_server, people):
    token = token_for("alice", item, mail_server)
    review_edit(item, user=people["bob"], changes={"amount": "600.00"}, reason="only the damaged part")
    alice = signed_in(people["alice"])
    before = state(item)
    page = alice.get(f"/decide/{token}")
    assert page.status_code == 409
    text = page.content.decode()
    assert "refund:ORD-1:full:dec-1~v2" in text and "750.00" in text and "600.00" in text
    assert re.search(r"<th scope=\"row\">amount</th><td class=\"mono\">750.00</td><td class=\"mono\">600.00</td>", text)
    assert approve_without_page(alice, token, item).status_code == 409
    assert state(item) == before and DecisionLink.objects.get(user=people["alice"]).used_at is None


def test_two_posts_at_once_give_one_decision(item, mail_server, people):
    token = token_for("alice", item, mail_server)
    fingerprint = item.action.params_fingerprint()
    clients = [signed_in(people["alice"]) for _ in range(2)]
    answers, start = [], threading.Barrier(2)

    def post(client, decision):
        start.wait()
        try:
            answers.append(client.post(f"/decide/{token}", {"decision": decision, "reason": "at once",
                                                            "fingerprint": fingerprint}).status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=post, args=(c, d)) for c, d in zip(clients, ("approve", "reject"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(answers) == [302, 410]
    decisions = audit_events(item).filter(verb__in=["approve", "reject"])
    assert decisions.count() == 1


def test_without_a_fresh_second_factor_the_link_asks_for_one_and_stays_unused(item, mail_server, people, settings):
    settings.STEP_UP_SECONDS = 300
    token = token_for("alice", item, mail_server)
    asked = approve_without_page(signed_in(people["alice"]), token, item)
    assert asked.status_code == 302 and "/decide/" not in asked["Location"]
    assert DecisionLink.objects.get(user=people["alice"]).used_at is None
    assert ReviewItem.objects.get(pk=item.pk).status == ReviewStatus.OPEN


def test_the_links_verification_note_polls_for_the_note_alone(client):
    """The page a link opens polls its verification note, as the item's page does, at the link
    itself: the link answers the poll with the note, not with a whole page htmx would swap into it
    every two seconds (and once the verification ended, with a refresh of the page)."""
    action = unknown(refund(make_agent("billing-bot")[0], 2, "40.00"))
    action.mark_needs_review(actor="system:executor", reason="cannot say", evidence={"verification": {}})
    item = ReviewItem.objects.get(action=action, status=ReviewStatus.OPEN)
    alice = person("alice", "approvers")
    token = link_issue(alice, item)
    review_decide(item, user=person("root", "admins"), decision="verify")
    client.force_login(alice)
    assert f'hx-get="/decide/{token}"' in client.get(f"/decide/{token}").content.decode()
    polled = client.get(f"/decide/{token}", headers={"HX-Request": "true"}).content.decode()
    assert 'id="verification"' in polled and "<html" not in polled


def test_a_mail_refused_halfway_is_tried_again_for_those_it_missed_only(item, mail_server):
    """alice's mail went, bob's was refused for now: the channel failed and was tried again whole,
    and alice got a second mail with a second decision link. The retry mails bob and desk only."""
    assert review_alert_overdue(now=item.deadline + timedelta(minutes=1)) == 1
    alert = Alert.objects.get(review_item=item)
    mail_server.script["RCPT"] = [None, "451 4.3.0 Try again later"]
    alert_deliver(alert.pk)
    assert [str(message["To"]) for message in mail_server.accepted] == ["alice@surety.example"]

    alert_deliver(alert.pk)  # what the scheduled retry does when it comes due
    assert sorted(str(message["To"]) for message in mail_server.accepted) == [
        "alice@surety.example", "bob@surety.example", "desk@surety.example"]
    assert DecisionLink.objects.filter(user__username="alice").count() == 1
    assert Alert.objects.get(pk=alert.pk).delivered_at is not None
