"""An unknown outcome's item, in the queue as on its page, says why it waits as the move that
made it wait said it, not "outcome unproven after 1 attempt(s)"; sent back to verify and come
back unproven, it is the same item that waits again, and the page reloads whole."""

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from approvals.decisions import review_decide
from approvals.models import ReviewItem, ReviewStatus
from tests.browser.decisions import refund, unknown
from tests.factories import make_agent

pytestmark = pytest.mark.django_db


def test_the_queue_says_the_reason_the_provider_gave(client):
    action = unknown(refund(make_agent("billing-bot")[0], 1, "40.00"))
    action.mark_needs_review(actor="system:executor", reason="the provider cannot say whether the effect happened",
                             evidence={"verification": {"error": "no answer"}, "at": timezone.now().isoformat()})
    item = ReviewItem.objects.get(action=action, status=ReviewStatus.OPEN)
    assert item.why == "the provider cannot say whether the effect happened"

    client.force_login(get_user_model().objects.create_superuser("root", password=None))
    queue = client.get("/unknown/").content.decode()
    assert "the provider cannot say whether the effect happened" in queue
    assert "outcome unproven" not in queue


def test_verify_again_that_comes_back_unproven_reopens_the_same_item_and_the_page_refreshes(client):
    action = unknown(refund(make_agent("billing-bot")[0], 2, "40.00"))
    cannot_say = "the provider cannot say whether the effect happened"
    action.mark_needs_review(actor="system:executor", reason=cannot_say, evidence={"verification": {}, "n": 1})
    item = ReviewItem.objects.get(action=action, status=ReviewStatus.OPEN)
    person = get_user_model().objects.create_superuser("root", password=None)
    client.force_login(person)
    for n in range(2):
        review_decide(ReviewItem.objects.get(pk=item.pk), user=person, decision="verify")
        polled = client.get(f"/review/{item.pk}/", headers={"HX-Request": "true"})
        assert polled.status_code == 200 and "HX-Refresh" not in polled.headers  # still verifying: the note polls
        action.refresh_from_db()
        action.mark_needs_review(actor="system:executor", reason=f"{cannot_say} ({n + 2})", evidence={"n": n + 2})

        assert list(ReviewItem.objects.filter(action=action).values_list("pk", flat=True)) == [item.pk]
        reopened = ReviewItem.objects.get(pk=item.pk)
        assert (reopened.status, reopened.why, reopened.decided_by) == (ReviewStatus.OPEN, f"{cannot_say} ({n + 2})",
                                                                         None)
        # The page's poll, once the verification ended, reloads the whole page (its badges too).
        assert client.get(f"/review/{item.pk}/", headers={"HX-Request": "true"}).headers.get("HX-Refresh") == "true"
