"""What the people-facing pages give back: the page a person was on after signing in again, the
approvals queue as it was filtered after a rejection, amounts as their currency writes them, and
times that name their day and zone."""

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from approvals.models import Limit, ReviewItem, ReviewStatus
from dlq.incidents import Incident, IncidentKind
from dlq.models import Alert, BulkRedrive, BulkRedriveItem, DeadLetter
from dlq.reconcile import Finding
from dlq.redrive_runs import Outcome, Plan
from ledger.actions import action_request
from ledger.models import ActionStatus
from tests.browser.conftest import PASSWORD
from tests.factories import make_action, make_agent, person

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis")]

HTMX = {"HX-Request": "true"}
QUEUE = "/approvals/?status=all&action_type=refund"
SIGN_IN_TO_QUEUE = "/accounts/login/?next=/approvals/%3Fstatus%3Dall%26action_type%3Drefund"


# --- Signing in again -----------------------------------------------------------------------------

def test_a_poll_whose_session_ended_signs_in_again_to_the_page_as_it_was_filtered(client):
    # The queue's refresh asked with its filters; `next` kept the path alone, unencoded.
    answer = client.get(QUEUE, headers={**HTMX, "HX-Current-URL": f"http://testserver{QUEUE}"})
    assert answer["HX-Redirect"] == SIGN_IN_TO_QUEUE
    # Without the page's address, the one asked for.
    assert client.get(QUEUE, headers=HTMX)["HX-Redirect"] == SIGN_IN_TO_QUEUE


def test_a_page_of_another_site_is_never_where_signing_in_leads(client):
    answer = client.get(QUEUE, headers={**HTMX, "HX-Current-URL": "https://evil.example/approvals/?status=all"})
    assert answer["HX-Redirect"] == SIGN_IN_TO_QUEUE


@pytest.mark.parametrize(("current", "lands_on"), [("http://testserver/policies/", "/policies/"), (None, "/policies/")])
def test_a_post_whose_session_ended_signs_in_again_to_a_page_not_to_the_post(client, current, lands_on):
    # The what-if's Preview posts to an address that answers only a POST: signed in, the person
    # was sent there with a GET (a 405).
    headers = {**HTMX, **({"HX-Current-URL": current} if current else {})}
    answer = client.post("/policies/whatif", {"action_type": "refund", "currency": "EUR"}, headers=headers)
    to_sign_in = answer["HX-Redirect"]
    assert to_sign_in.startswith("/accounts/login/?next=") and "whatif" not in to_sign_in

    olga = person("olga", "operators")
    olga.set_password(PASSWORD)
    olga.save()
    signed_in = client.post(to_sign_in, {"login": "olga", "password": PASSWORD})
    assert signed_in["Location"] == lands_on
    assert client.get(signed_in["Location"]).status_code == 200


@pytest.mark.parametrize(("referer", "lands_on"), [
    ("http://testserver/policies/?currency=EUR", "/policies/?currency=EUR"),
    ("https://evil.example/policies/", "/policies/"),  # the page above the address posted to
])
def test_a_form_posted_whose_session_ended_signs_in_again_to_the_page_it_was_posted_from(client, referer, lands_on):
    # A form without htmx names its page in the Referer only; a page asked for whole is itself
    # the page, not the one that linked to it.
    assert client.get(QUEUE, headers={"Referer": referer})["Location"] == SIGN_IN_TO_QUEUE
    answer = client.post("/policies/whatif", {"action_type": "refund", "currency": "EUR"}, headers={"Referer": referer})
    assert answer.status_code == 302 and "whatif" not in answer["Location"]

    olga = person("olga", "operators")
    olga.set_password(PASSWORD)
    olga.save()
    assert client.post(answer["Location"], {"login": "olga", "password": PASSWORD})["Location"] == lands_on


# --- The approvals queue after a rejection ----------------------------------------------------------

@pytest.fixture
def alice(client):
    client.force_login(person("alice", "approvers"))
    return client


@pytest.fixture
def waiting(db):
    """A refund over its limit, waiting for approval."""
    Limit.limit_set(actor="system:tests", reason="the tests' policy", action_type="refund", currency="EUR",
                    max_amount=Decimal("100.00"), dual_approval_above=None)
    agent, _ = make_agent("billing")
    action, _ = action_request(agent=agent, operation_key="refund:ORD-Q1:full:dec-q1", action_type="refund",
                               target="ORD-Q1", customer="CUST-Q1", params={"amount": "600.00", "currency": "EUR"})
    return ReviewItem.objects.get(action=action, status=ReviewStatus.OPEN)


def reject_from(client, item, filters):
    return client.post(f"/review/{item.pk}/decide", {"decision": "reject", "reason": "not ours", "return_to": "queue",
                                                     "queue_filters": filters})


def test_a_row_rejected_from_a_filtered_queue_returns_to_the_queue_as_it_was_filtered(alice, waiting):
    page = alice.get(QUEUE).content.decode()
    assert '<input type="hidden" name="queue_filters" value="status=all&amp;action_type=refund">' in page
    assert reject_from(alice, waiting, "status=all&action_type=refund")["Location"] == QUEUE
    assert ReviewItem.objects.get(pk=waiting.pk).status == ReviewStatus.REJECTED


def test_a_one_click_reason_from_a_filtered_queue_returns_to_it_too(alice, waiting):
    """The reasons the person gave before are one-click rejects of their own (keys 1 to 3)."""
    action, _ = action_request(agent=waiting.action.agent, operation_key="refund:ORD-Q2:full:dec-q2",
                               action_type="refund", target="ORD-Q2", customer="CUST-Q2",
                               params={"amount": "700.00", "currency": "EUR"})
    reject_from(alice, waiting, "")  # "not ours" is a reason alice gave before now
    page = alice.get(QUEUE).content.decode()
    assert 'value="not ours"' in page
    assert page.count('<input type="hidden" name="queue_filters" value="status=all&amp;action_type=refund">') == 2


@pytest.mark.parametrize(("filters", "back_to"), [
    ("", "/approvals/"),
    ("after=abc&kind=held", "/approvals/?after=abc&kind=held"),
    # Only the queue's own filters, written out again: never an address of the poster's choosing.
    ("next=https://evil.example/&status=open", "/approvals/?status=open"),
    ("status=//evil.example", "/approvals/?status=%2F%2Fevil.example"),
])
def test_the_queue_a_rejection_returns_to_carries_its_own_filters_only(alice, waiting, filters, back_to):
    assert reject_from(alice, waiting, filters)["Location"] == back_to


# --- Amounts as their currency writes them --------------------------------------------------------------

@pytest.fixture
def admin(client):
    client.force_login(get_user_model().objects.create_superuser("root", password="x"))
    return client


def test_an_amount_mismatch_names_the_ledgers_amount_in_its_currencys_decimals(admin):
    # The ledger's column keeps three decimals: the incident, its alert and its page said "500.000 JPY".
    key = "refund:ORD-Y:full:dec-1"
    effect = {"external_ref": "re_y", "amount": "5000", "currency": "JPY", "created_at": timezone.now().isoformat()}
    ledger = {"action_id": 1, "status": "succeeded", "external_ref": "re_y", "amount": "500.000", "currency": "JPY"}
    finding = Finding(IncidentKind.AMOUNT_MISMATCH, "sandbox", "refund", key, key, effects=[effect], ledger=ledger)
    assert finding.summary == f"{key}: sandbox has 5000 JPY, the ledger 500 JPY"
    incident = Incident.objects.open_for(finding, actor="system:reconcile")
    assert Alert.objects.get(incident=incident).subject == f"Reconciliation: {finding.summary}"
    page = admin.get(f"/incidents/{incident.pk}/").content.decode()
    assert "<dd>500 JPY</dd>" in page and "500.000" not in page


def test_a_providers_amount_with_more_decimals_than_its_currency_is_never_rounded_in_the_summary():
    effect = {"external_ref": "re_e", "amount": "25.005", "currency": "EUR", "created_at": timezone.now().isoformat()}
    ledger = {"action_id": 1, "status": "succeeded", "external_ref": "re_e", "amount": "25.000", "currency": "EUR"}
    finding = Finding(IncidentKind.AMOUNT_MISMATCH, "sandbox", "refund", "k", "k", effects=[effect], ledger=ledger)
    assert finding.summary == "k: sandbox has 25.005 EUR, the ledger 25.00 EUR"


def test_a_dead_letters_amount_is_written_as_its_currency_writes_it(admin):
    agent, _ = make_agent("billing")
    action = make_action(agent, ActionStatus.PENDING, key="refund:ORD-K:full:dec-1", target="ORD-K",
                         params={"amount": "1.5", "currency": "KWD"}, amount=Decimal("1.5"), currency="KWD")
    action.mark_failed(actor="system:tests", code="x", message="no", retryable=False)
    entry = DeadLetter.objects.get(action=action)
    assert "<dd>1.500 KWD</dd>" in admin.get(f"/dlq/{entry.pk}/").content.decode()


# --- Exact times ----------------------------------------------------------------------------------------

def test_a_redrive_runs_times_name_their_day_and_zone(admin):
    agent, _ = make_agent("billing")
    action = make_action(agent, ActionStatus.PENDING, key="refund:ORD-R:full:dec-1", target="ORD-R")
    action.mark_failed(actor="system:tests", code="x", message="no", retryable=True)
    run = BulkRedrive.objects.create(filters={}, planned_by="root", ceiling=Decimal("60"), status="finished",
                                     started_by=get_user_model().objects.get(username="root"), rate=Decimal("10"),
                                     started_at=datetime(2026, 9, 10, 3, tzinfo=UTC))
    item = BulkRedriveItem.objects.create(run=run, entry=DeadLetter.objects.get(action=action), position=1,
                                          plan=Plan.ACTION_RETRY)
    item.settle(Outcome.REDRIVEN, "one more attempt", redriven_at=datetime(2026, 9, 10, 3, 0, 1, 234567, tzinfo=UTC))
    page = admin.get(f"/dlq/redrives/{run.pk}/").content.decode()
    assert '<time datetime="2026-09-10T03:00:01.234567+00:00">2026-09-10 03:00:01.234 UTC</time>' in page
