"""A decision refused sends the person back to the item's page with the reason: what they typed
(the reason, the provider's reference, an edited amount) is still in the form, for the one form
they used, once; a redirect alone emptied it."""

import re

import pytest
from django.contrib.auth import get_user_model

from approvals.models import ReviewItem, ReviewStatus
from tests.browser.decisions import dual_limit, refund, unknown
from tests.factories import make_agent

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis")]

TYPED = "Checked the provider's dashboard at 14:02: refund re_9 is there"


@pytest.fixture
def signed_in(client):
    client.force_login(get_user_model().objects.create_superuser("root", password=None))
    return client


def fingerprint(page):
    return re.search(r'name="fingerprint" value="([^"]*)"', page).group(1)


def test_a_decision_refused_keeps_the_reason_typed_in_its_form_once(signed_in):
    action = unknown(refund(make_agent("billing-bot")[0], 3, "40.00"))
    action.mark_needs_review(actor="system:executor", reason="cannot say", evidence={"verification": {}})
    item = ReviewItem.objects.get(action=action, status=ReviewStatus.OPEN)
    page = signed_in.get(f"/review/{item.pk}/").content.decode()
    # "Mark succeeded" without the provider's reference is refused.
    after = signed_in.post(f"/review/{item.pk}/decide", {"decision": "mark_succeeded", "reason": TYPED,
                                                         "fingerprint": fingerprint(page)}, follow=True)
    after = after.content.decode()
    assert "reference is required" in after
    assert re.search(r'<textarea id="reason" name="reason"[^>]*>' + re.escape(TYPED.replace("'", "&#x27;")), after)
    again = signed_in.get(f"/review/{item.pk}/").content.decode()
    assert TYPED.replace("'", "&#x27;") not in again  # once: a later visit starts empty


def test_an_edit_refused_keeps_the_amount_and_reason_typed(signed_in):
    dual_limit()
    action = refund(make_agent("billing-bot")[0], 4, "750.00")
    item = ReviewItem.objects.get(action=action, status=ReviewStatus.OPEN)
    page = signed_in.get(f"/review/{item.pk}/").content.decode()
    # An edit "down" to more than was asked is refused.
    after = signed_in.post(f"/review/{item.pk}/edit", {"param_amount": "900.00", "reason": TYPED,
                                                       "fingerprint": fingerprint(page)}, follow=True).content.decode()
    assert "Not done" in after
    assert 'id="edit-param_amount" name="param_amount" value="900.00"' in after
    assert re.search(r'<textarea id="edit-reason" name="reason"[^>]*>' + re.escape(TYPED.replace("'", "&#x27;")),
                     after)
    assert not re.search(r'<textarea id="reason" name="reason"[^>]*>\w', after)  # not in the other forms
