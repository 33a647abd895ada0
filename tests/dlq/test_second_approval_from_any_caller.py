"""The first of two approvals tells the people the item now waits for whoever gives it: a reaction to
the item's move (dlq.alerts.review_alert_when_second_awaited), not a call each page makes. Given
through approvals.decisions alone (the demo, a bench, any caller without a page), it mailed nobody
before. And an item reopened after a hold with its first approval standing waits anew: those it
waits for are told again, where the first approval's mail went to nobody (the item was held when it
went) or was never raised (a version held as it was made). Through the same real SMTP server and
this run's Redis as the pages' tests (tests/console/test_decision_links_for_the_second_approval.py)."""

import pytest

from approvals.decisions import review_decide, review_edit
from approvals.models import ReviewItem, ReviewKind, ReviewStatus
from dlq.models import Alert
from ledger.actions import action_request
from ledger.models import ActionStatus
from tests.console.test_decision_links_for_the_second_approval import (  # noqa: F401 (fixtures)
    asked, delivered, email_attempts, mail_server, people, second_approval_alerts)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("jobs_to_test_redis")]
OTHERS = ["bob@surety.example", "carol@surety.example"]


def mailed(alert, mail_server):
    return sorted(to for to, _ in delivered(alert, mail_server))


def held_beside(item):
    """Another refund of the item's order arrives: it holds the action waiting for approval (the
    intake holds what is in flight there), which closes the item."""
    action = item.action
    action_request(agent=action.agent, operation_key="refund:ORD-1:part:dec-2", action_type="refund",
                   target=action.target, params={"amount": "20.00", "currency": "EUR"})
    action.refresh_from_db()
    assert action.status == ActionStatus.HELD
    return ReviewItem.objects.get(action=action, status="open", kind=ReviewKind.HELD)


def test_a_first_approval_given_through_the_decisions_alone_mails_the_others(people, mail_server):
    item = asked()

    review_decide(item, user=people["alice"], decision="approve", reason="the order shows the damage")

    [alert] = second_approval_alerts(item)
    assert alert.recipients == OTHERS
    assert mailed(alert, mail_server) == OTHERS


def test_an_edit_down_through_the_decisions_alone_mails_the_others_of_its_version(people, mail_server):
    item = asked("9000.00")

    _, version = review_edit(item, user=people["bob"], changes={"amount": "6000.00"}, reason="only the damaged part",
                             fingerprint=item.action.params_fingerprint())

    waiting = ReviewItem.objects.get(action=version, kind=ReviewKind.APPROVAL)
    assert waiting.status == ReviewStatus.OPEN and not second_approval_alerts(item)
    [alert] = second_approval_alerts(waiting)
    assert mailed(alert, mail_server) == ["alice@surety.example", "carol@surety.example"]


def test_a_first_approval_whose_mail_found_the_item_held_is_mailed_again_when_it_waits_again(people, mail_server):
    item = asked()
    review_decide(item, user=people["alice"], decision="approve", reason="the order shows the damage")
    [first] = second_approval_alerts(item)
    held = held_beside(item)
    assert mailed(first, mail_server) == []
    assert email_attempts(first) == [(1, True, "not mailed: no longer waiting: closed", [])]

    review_decide(held, user=people["carol"], decision="release", reason="the part refund is another matter")

    assert ReviewItem.objects.get(pk=item.pk).status == ReviewStatus.OPEN  # reopened, alice's approval standing
    [_, again] = second_approval_alerts(item)
    assert again.recipients == OTHERS and "Approved by alice" in again.body
    assert mailed(again, mail_server) == OTHERS


def test_a_version_held_as_it_is_made_tells_the_others_when_it_waits_for_its_second_approval(people, mail_server):
    """Its editor's first approval is recorded on the item its hold closed: nobody was told of it,
    and its release sends it to wait for the second one."""
    item = asked("9000.00")
    review_decide(held_beside(item), user=people["carol"], decision="release", reason="the part refund is another")
    item = ReviewItem.objects.get(action=item.action, status="open", kind=ReviewKind.APPROVAL)
    _, version = review_edit(item, user=people["alice"], changes={"amount": "6000.00"}, reason="only the damaged part",
                             fingerprint=item.action.params_fingerprint())
    assert version.status == ActionStatus.HELD
    waiting = ReviewItem.objects.get(action=version, kind=ReviewKind.APPROVAL)
    assert waiting.status == ReviewStatus.CLOSED and not second_approval_alerts(waiting)

    review_decide(ReviewItem.objects.get(action=version, status="open", kind=ReviewKind.HELD), user=people["carol"],
                  decision="release", reason="the part refund is another matter",
                  fingerprint=version.params_fingerprint())

    assert ReviewItem.objects.get(pk=waiting.pk).status == ReviewStatus.OPEN
    [alert] = second_approval_alerts(waiting)
    assert mailed(alert, mail_server) == OTHERS
    assert Alert.objects.filter(kind=Alert.Kind.SECOND_APPROVAL).count() == 1  # nothing of the original's
