"""An unknown outcome's item, in the queue as on its page, says why it waits as the move that
made it wait said it, not "outcome unproven after 1 attempt(s)"."""

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

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
