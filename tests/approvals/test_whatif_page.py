"""The policies page's what-if: a preview of the form's values over real actions, never a save;
its errors in words, never a 500; the save's audit event keeps the preview shown."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from approvals.decisions import review_edit
from approvals.intake import customer_total_today
from approvals.models import Limit, ReviewItem
from approvals.whatif import Proposal, whatif
from ledger.actions import action_request
from ledger.models import AuditEvent
from tests.factories import make_action, make_agent, person

pytestmark = pytest.mark.django_db

HTMX = {"HX-Request": "true"}
FORM = {"action_type": "refund", "currency": "EUR", "max_amount": "200", "dual_approval_above": "",
        "daily_customer_total": "", "review_deadline_hours": "4", "days": "30"}


@pytest.fixture
def admin(client):
    client.force_login(get_user_model().objects.create_superuser("root", password="x"))
    return client


@pytest.fixture
def actions():
    """Refunds of 100, 300 and 600 EUR today, a 300 USD one, and a 900 EUR one 40 days ago;
    the current limit (500) made the 600 one wait."""
    agent, _ = make_agent("billing")
    Limit.limit_set(actor="system:tests", reason="the current limit", action_type="refund", currency="EUR",
                    max_amount=Decimal("500"))
    made = {}
    for n, (amount, currency, age) in enumerate([("100.00", "EUR", 0), ("300.00", "EUR", 0), ("600.00", "EUR", 0),
                                                 ("300.00", "USD", 0), ("900.00", "EUR", 40)]):
        made[(amount, currency, age)] = make_action(agent, "succeeded", key=f"refund:ORD-{n}:full", target=f"ORD-{n}",
                                                    amount=amount, currency=currency, customer="CUST-1",
                                                    created_at=timezone.now() - timedelta(days=age, minutes=n))
    return made


def counts_of(response):
    page = response.content.decode()
    assert response.status_code == 200, page
    return page


def test_a_preview_counts_the_windows_actions_under_both_limits_and_saves_nothing(admin, actions):
    events = AuditEvent.objects.count()
    page = counts_of(admin.post("/policies/whatif", FORM, headers=HTMX))
    assert "<html" not in page  # the fragment alone
    assert "3 actions since" in page  # the EUR refunds of the last 30 days
    # Waiting for a person: 1 under the current limit (600), 2 under 200 (300 and 600): +1.
    assert '<tr data-row="waiting"><th scope="row">waited for a person</th><td class="num">1</td>' in page
    assert "<strong>2</strong></td>" in page and ">+1<" in page
    assert "300.00 EUR is above the limit of 200.00" in page  # verdict_for's own words
    assert f'href="/actions/{actions[("300.00", "EUR", 0)].pk}/"' in page
    assert f'href="/actions/{actions[("100.00", "EUR", 0)].pk}/"' not in page  # its verdict does not change
    assert Limit.objects.get().max_amount == 500 and AuditEvent.objects.count() == events


def test_a_window_with_no_data_says_so(admin):
    page = counts_of(admin.post("/policies/whatif", {**FORM, "currency": "GBP"}, headers=HTMX))
    assert "No refund actions in GBP since" in page and 'id="whatif-counts"' not in page


@pytest.mark.parametrize(("change", "says"), [
    ({"max_amount": "abc"}, "Enter a number."),
    ({"max_amount": ""}, "This field is required."),
    ({"dual_approval_above": "50"}, "Must be at least the maximum amount."),
    ({"daily_customer_total": "-1"}, "Must not be negative."),
    ({"currency": "E1"}, "Not an ISO 4217 currency code."),
    ({"action_type": "teleport"}, "Select a valid choice."),
    ({"days": "0"}, "greater than or equal to 1"),
    ({"days": "91"}, "less than or equal to 90"),
    ({"days": "abc"}, "Enter a whole number."),
    ({"days": "9" * 30}, "less than or equal to 90"),
    ({"max_amount": "1e400"}, ""),
])
def test_bad_values_get_the_forms_errors_never_a_500(admin, actions, change, says):
    page = counts_of(admin.post("/policies/whatif", {**FORM, **change}, headers=HTMX))
    assert 'id="whatif-errors"' in page and says in page
    assert 'id="whatif-counts"' not in page


def test_without_javascript_the_preview_comes_back_on_the_whole_page(admin, actions):
    page = counts_of(admin.post("/policies/whatif", {**FORM, "reason": ""}))
    assert "<html" in page and 'id="whatif-counts"' in page and 'id="limit-form"' in page
    assert 'value="200"' in page  # the form keeps what was typed
    assert "This field is required" not in page  # the reason is only needed to save


def test_it_takes_posts_from_staff_only(admin, client):
    assert admin.get("/policies/whatif").status_code == 405
    client.force_login(get_user_model().objects.create_user("nobody", password="x"))
    assert client.post("/policies/whatif", FORM).status_code == 403


def test_saving_after_a_preview_records_the_preview_shown(admin, actions):
    page = counts_of(admin.post("/policies/whatif", FORM, headers=HTMX))
    signed = page.split('name="whatif" value="')[1].split('"')[0]
    response = admin.post("/policies/", {**FORM, "whatif": signed, "reason": "fewer large refunds unseen"})
    assert response.status_code == 302
    event = AuditEvent.objects.filter(verb="limit_set").order_by("id").last()
    preview = event.after["preview"]
    assert preview["shown"] is True and preview["days"] == 30
    assert preview["values"] == {"action_type": "refund", "currency": "EUR", "max_amount": "200.00",
                                 "dual_approval_above": None, "daily_customer_total": None}
    assert (preview["counts"]["current_waiting"], preview["counts"]["proposed_waiting"]) == (1, 2)
    assert event.after["max_amount"] == "200.00" and event.reason == "fewer large refunds unseen"


def test_values_changed_after_the_preview_record_a_preview_of_what_was_saved(admin, actions):
    page = counts_of(admin.post("/policies/whatif", FORM, headers=HTMX))
    signed = page.split('name="whatif" value="')[1].split('"')[0]
    admin.post("/policies/", {**FORM, "max_amount": "50", "whatif": signed, "reason": "even lower"})
    preview = AuditEvent.objects.filter(verb="limit_set").order_by("id").last().after["preview"]
    assert preview["shown"] is False and preview["values"]["max_amount"] == "50.00"
    assert preview["counts"]["proposed_waiting"] == 3


def test_a_forged_preview_is_not_recorded_as_shown(admin, actions):
    admin.post("/policies/", {**FORM, "whatif": "forged:value", "reason": "no preview"})
    preview = AuditEvent.objects.filter(verb="limit_set").order_by("id").last().after["preview"]
    assert preview["shown"] is False and preview["counts"]["proposed_waiting"] == 2


def test_the_preview_of_a_first_limit_warns_of_the_currencies_it_leaves_uncovered_and_the_save_keeps_it(
        admin, settings):
    """Refund's first limit, in GBP: every EUR and USD refund would then wait for a person, or be
    refused; the page says how many of the window's would have, and the audit event keeps it."""
    agent, _ = make_agent("billing")
    for n, (amount, currency) in enumerate([("100.00", "EUR"), ("300.00", "EUR"), ("300.00", "USD")]):
        make_action(agent, "succeeded", key=f"refund:ORD-{n}:full", target=f"ORD-{n}", amount=amount,
                    currency=currency, customer="CUST-1")
    page = counts_of(admin.post("/policies/whatif", {**FORM, "currency": "GBP"}, headers=HTMX))
    warning = page.split('id="whatif-uncovered"')[1].split("</div>")[0]
    assert ("This is the first refund limit: once it is saved, a refund in any other currency than GBP waits for "
            "a person.") in warning
    assert ("Over the same days, <strong>2</strong> refunds in <span class=\"mono\">EUR</span>, <strong>1</strong> "
            "refund in <span class=\"mono\">USD</span> would have waited for a person.") in warning
    assert "No refund actions in GBP since" in page  # the limit's own currency has nothing to replay
    settings.LIMITS_UNCOVERED_CURRENCY = "refuse"
    page = counts_of(admin.post("/policies/whatif", {**FORM, "currency": "GBP"}, headers=HTMX))
    assert "would have been refused at intake." in page.split('id="whatif-uncovered"')[1]
    signed = page.split('name="whatif" value="')[1].split('"')[0]
    admin.post("/policies/", {**FORM, "currency": "GBP", "whatif": signed, "reason": "first limit"})
    preview = AuditEvent.objects.filter(verb="limit_set").order_by("id").last().after["preview"]
    assert preview["shown"] is True
    assert preview["left_uncovered"] == {"currencies": {"EUR": 2, "USD": 1}, "refused": True}


def test_a_first_limit_saved_without_a_preview_records_what_it_leaves_uncovered(admin):
    agent, _ = make_agent("billing")
    make_action(agent, "succeeded", amount="300.00", currency="USD")
    admin.post("/policies/", {**FORM, "reason": "first limit"})
    preview = AuditEvent.objects.filter(verb="limit_set").order_by("id").last().after["preview"]
    assert preview["shown"] is False and preview["left_uncovered"] == {"currencies": {"USD": 1}, "refused": False}


def test_a_limit_of_a_type_that_has_some_shows_no_such_warning(admin, actions):
    assert 'id="whatif-uncovered"' not in counts_of(admin.post("/policies/whatif", FORM, headers=HTMX))


def test_the_examples_are_the_newest_changed_ones_with_both_verdicts(actions):
    preview = whatif(Proposal("refund", "EUR", Decimal("50")))
    assert [e["action"].amount for e in preview["examples"]] == [Decimal("100.00"), Decimal("300.00")]
    assert preview["examples"][0]["current"].approvals_needed == 0
    assert preview["examples"][0]["proposed"].reason == "100.00 EUR is above the limit of 50.00"


@pytest.mark.parametrize("ages", [[3], [10], [3, 10, 20]])
def test_examples_are_found_however_far_back_they_are(ages):
    """The last day is looked at first, then the week, then the window: nothing is missed."""
    agent, _ = make_agent("billing")
    made = [make_action(agent, "succeeded", key=f"refund:ORD-{age}:full", target=f"ORD-{age}", amount="300.00",
                        created_at=timezone.now() - timedelta(days=age)) for age in ages]
    preview = whatif(Proposal("refund", "EUR", Decimal("50")))
    assert [e["action"].pk for e in preview["examples"]] == [action.pk for action in made]
    assert preview["counts"]["changed"] == len(ages)


def test_no_example_when_no_verdict_changes(actions):
    preview = whatif(Proposal("refund", "EUR", Decimal("500")))
    assert preview["counts"]["changed"] == 0 and preview["examples"] == []


@pytest.fixture
def edited(actions):
    """CUST-E asks 700.00, which alice edits down to 400.00 (its version), then 300.00 more."""
    users = [person(name, "approvers") for name in ("olga", "alice")]
    agent, _ = make_agent("edited-bot", owner=users[0])

    def refund(key, amount):
        return action_request(agent=agent, operation_key=key, action_type="refund", target=key, customer="CUST-E",
                              params={"amount": amount, "currency": "EUR"})[0]

    action = refund("ORD-E1", "700.00")
    review_edit(ReviewItem.objects.get(action=action, status="open"), user=users[1], changes={"amount": "400.00"},
                reason="the broken item only", fingerprint=action.params_fingerprint())
    return refund("ORD-E2", "300.00")


def test_a_request_edited_down_by_a_person_counts_once_as_the_agent_asked_it(edited):
    preview = whatif(Proposal("refund", "EUR", Decimal("250")))
    # The three of the fixture and the two of CUST-E; not the 400.00 version as well.
    assert preview["counts"]["actions"] == 5
    assert preview["counts"]["current_waiting"] == 2 and preview["counts"]["proposed_waiting"] == 4


def test_the_version_a_person_made_is_in_its_customers_daily_total_as_the_intake_counts_it(edited):
    assert customer_total_today("refund", "EUR", "CUST-E", excluding=edited) == Decimal("400.00")
    preview = whatif(Proposal("refund", "EUR", Decimal("500"), daily_customer_total=Decimal("600")))
    [example] = [e for e in preview["examples"] if e["action"].pk == edited.pk]
    assert example["total_before"] == Decimal("400.00")
    assert example["proposed"].reason == "the customer's total today would be 700.00 EUR, above 600.00"
