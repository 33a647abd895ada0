"""An alert's decision links go to the people the item waits for, as its page and the counts say
(approvals.decisions.waiting_for): not to one who gave the first of two approvals, nor to their
delegate (the second approval must come from someone else), and to nobody once its approval window
has closed. Such links were mailed and opened a page that offered nothing. A link opened after its
person's approval or after the window closed, mailed before either, shows why and decides nothing."""

import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.test import Client
from django.utils import timezone

from approvals.decisions import review_decide
from approvals.delegation import delegation_name
from approvals.links import deciders, link_issue
from approvals.models import DecisionLink, Limit, ReviewItem, ReviewStatus
from dlq.alerts import alert_deliver
from dlq.models import Alert
from dlq.overdue import review_alert_overdue
from ledger import clock
from ledger.actions import action_request
from tests.factories import make_agent, person

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis")]

LINK = re.compile(r"http://[^\s]+/decide/([A-Za-z0-9_-]+)")


@pytest.fixture
def people(settings):
    """alice and bob approve, and are the limit's first tier; olga, an operator, decides only as
    alice's delegate."""
    settings.SITE_URL = "http://testserver"
    users = {name: person(name, group) for name, group in
             (("alice", "approvers"), ("bob", "approvers"), ("olga", "operators"))}
    for user in users.values():
        user.email = f"{user.username}@surety.example"
        user.save(update_fields=["email"])
    Limit.limit_set(actor="system:tests", reason="the tests' policy", action_type="refund", currency="EUR",
                    max_amount=Decimal("500.00"), dual_approval_above=Decimal("5000.00"),
                    approval_expires_after_hours=24, first_tier="alice@surety.example, bob@surety.example")
    return users


def asked(amount):
    agent = make_agent("billing-bot")[0]
    action, _ = action_request(agent=agent, operation_key="refund:ORD-1:dec-1", action_type="refund",
                               target="ORD-1", customer="CUST-1", params={"amount": amount, "currency": "EUR"})
    return ReviewItem.objects.get(action=action)


def alice_away(people):
    now = timezone.now()
    delegation_name(person=people["alice"], delegate=people["olga"], starts_at=now - timedelta(hours=1),
                    ends_at=now + timedelta(hours=24), reason="on leave")


def first_approval(item, people, by):
    """The first of two approvals, by alice or by olga for her."""
    review_decide(item, user=people[by], decision="approve", reason="one of two")
    assert ReviewItem.objects.get(pk=item.pk).status == ReviewStatus.OPEN


def close_its_window(item):
    """Its window closed a minute ago by the database's clock; the sweeper has not come yet."""
    ReviewItem.objects.filter(pk=item.pk).update(expires_at=clock.now() - timedelta(minutes=1))


def alert(item):
    assert review_alert_overdue(now=item.deadline + timedelta(minutes=1)) == 1
    return Alert.objects.get(review_item=item, kind=Alert.Kind.OVERDUE_REVIEW)  # a first of two raises its own too


def links_mailed(alert, mailoutbox):
    """Delivered: each address mailed -> whether its mail carries a decision link."""
    alert_deliver(alert.pk)
    return {address: bool(LINK.search(message.body)) for message in mailoutbox for address in message.to}


@pytest.mark.parametrize("by", ["alice", "olga"], ids=["by herself", "by her delegate"])
def test_whoever_gave_the_first_of_two_approvals_gets_no_link_the_other_approver_does(people, mailoutbox, by):
    item = asked("6000.00")
    alice_away(people)
    first_approval(item, people, by)

    assert links_mailed(alert(item), mailoutbox) == {"alice@surety.example": False, "olga@surety.example": False,
                                                     "bob@surety.example": True}
    assert [link.user.username for link in DecisionLink.objects.all()] == ["bob"]


def test_nobody_gets_a_link_once_the_items_window_has_closed(people, mailoutbox):
    item = asked("750.00")
    raised = alert(item)
    close_its_window(item)  # between the alert and its delivery (a retry, a queue backed up)

    assert links_mailed(raised, mailoutbox) == {"alice@surety.example": False, "bob@surety.example": False}
    assert not DecisionLink.objects.exists()


def test_while_it_waits_each_approver_gets_a_link(people, mailoutbox):
    assert links_mailed(alert(asked("750.00")), mailoutbox) == {"alice@surety.example": True,
                                                                "bob@surety.example": True}


def opened(user, token, item, decision="approve"):
    """The link's page (a GET) and its `decision` posted as the page would (a POST): what each showed."""
    client = Client()
    client.force_login(user)
    page = client.get(f"/decide/{token}")
    posted = client.post(f"/decide/{token}", {"decision": decision, "reason": "from the mail",
                                              "fingerprint": item.action.params_fingerprint()})
    shown = client.get(posted["Location"]) if posted.status_code in (302, 303) else posted
    return page, posted, shown


@pytest.mark.parametrize("decision", ["approve", "reject"])
@pytest.mark.parametrize("who, callout", [("alice", "approved-by-me"), ("olga", "approved-by-us")])
def test_a_link_mailed_before_its_persons_first_approval_says_so_and_decides_nothing(people, who, callout, decision):
    """Neither the second approval nor a rejection: the item's second decision is someone else's (a
    rejection went through, in the first approver's name, and spent the link)."""
    item = asked("6000.00")
    alice_away(people)
    token = link_issue(people[who], item)
    first_approval(item, people, "alice")  # from the dashboard

    page, posted, shown = opened(people[who], token, item, decision)

    assert page.status_code == 200
    assert f'id="{callout}"' in page.content.decode() and 'id="approve-button"' not in page.content.decode()
    assert posted.status_code == 303 and "four eyes" in shown.content.decode()
    item.refresh_from_db()
    assert item.status == ReviewStatus.OPEN and item.approvals.count() == 1
    assert DecisionLink.objects.get().used_at is None


def test_a_link_opened_after_the_window_closed_says_so_and_decides_nothing(people):
    item = asked("750.00")
    token = link_issue(people["alice"], item)
    close_its_window(item)

    page, posted, shown = opened(people["alice"], token, item)

    assert page.status_code == 200
    assert 'id="window-closed"' in page.content.decode() and 'id="approve-button"' not in page.content.decode()
    assert posted.status_code == 303 and "approval window closed" in shown.content.decode()
    item.refresh_from_db()
    assert item.status == ReviewStatus.OPEN and not item.approvals.exists()
    assert DecisionLink.objects.get().used_at is None


def test_of_two_people_sharing_an_address_the_link_goes_to_the_first_made(people):
    """Two accounts with one address (a person's second, made for another role), both of whom the
    item waits for: the link went to whichever the database read first, and an update of the first
    made (its row written again, at the table's end) sent the next alert's to the other."""
    first, second = person("dana", "approvers"), person("dana-2", "approvers")
    for user in (first, second):
        user.email = "dana@surety.example"
        user.save(update_fields=["email"])
    first.last_name = "Moved"
    first.save(update_fields=["last_name"])  # read after the second's now, in the table's order
    item = asked("750.00")

    assert deciders(item, ["dana@surety.example", "bob@surety.example"]) == {
        "dana@surety.example": first, "bob@surety.example": people["bob"]}
