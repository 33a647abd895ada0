"""A money decision by a person whose step-up is stale, in Chromium with a passkey (its virtual
authenticator, as test_passkey has it), posted through htmx: the check answers htmx with
`HX-Redirect`, so the browser leaves the item's page for the factor's as a whole page (a redirect
answered to htmx's request would be followed by the request itself, and the factor page swapped
into the decision form); the decision kept meanwhile is taken once the passkey is given, once,
as hers, and she lands on the item's page (the next item's, where there is one) as after any
decision. A decision she walked away from is dropped, and a factor given later leads back to the
page she had asked it from, or, where that page was a POST's answer (a bulk discard's
confirmation), to the page above it. The stack requires the second factor and step-up, as
production does."""

from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.sessions.backends.db import SessionStore

from approvals.models import ReviewItem, ReviewStatus
from dlq.models import DeadLetter, EntryStatus
from tests.browser.conftest import request_refund, status_message
from tests.browser.test_passkey import sign_in_with_password, virtual_authenticator
from tests.conftest import running_server
from tests.factories import audit_events, dead_letter

pytestmark = pytest.mark.browser
KEY = "refund:ORD-7311:full:dec-7311"
WEBAUTHN_REAUTHENTICATE = "/accounts/2fa/webauthn/reauthenticate/"

# The item page's decision form made an htmx control (no control of the dashboard decides through
# htmx yet: its forms post themselves), as a page would write one: htmx posts it, the Approve
# button's name and value with it, and swaps what comes back into the form.
AS_HTMX = """form => {
  form.setAttribute("hx-post", form.getAttribute("action"));
  form.setAttribute("hx-target", "this");
  form.setAttribute("hx-swap", "outerHTML");
  htmx.process(form);
}"""


@pytest.fixture(scope="module")
def server(django_db_setup, django_db_blocker):
    with running_server(django_db_blocker, MFA_REQUIRED="true", STEP_UP_SECONDS="300") as stack:
        stack.url = stack.url.replace("127.0.0.1", "localhost")  # WebAuthn refuses an IP address
        yield stack


def signed_in_with_a_passkey(page, username):
    """`username` enrols a passkey, signs out, and signs in again with it: a fresh step-up."""
    virtual_authenticator(page)
    sign_in_with_password(page, username)  # asked to enrol a factor before any page: a passkey
    page.goto("/accounts/2fa/webauthn/add/")
    page.fill("#id_name", "laptop")
    with page.expect_navigation():
        page.locator("#mfa_webauthn_add").click()
    with page.expect_navigation():
        page.locator("form[action='/accounts/logout/'] button").click()
    sign_in_with_password(page, username)
    with page.expect_navigation():
        page.locator("#mfa_webauthn_authenticate").click()


def stale_step_up(page):
    """The factors this browser's session gave, given longer ago than STEP_UP_SECONDS."""
    session = SessionStore(session_key=next(c["value"] for c in page.context.cookies() if c["name"] == "sessionid"))
    records = session["account_authentication_methods"]
    for record in records:
        record["at"] -= 300
    session["account_authentication_methods"] = records
    session.save()


@pytest.fixture
def item(stack, people, api, limit, page):
    """A refund over the limit, and alice at its page with a passkey she gave longer ago than
    STEP_UP_SECONDS (at sign-in)."""
    request_refund(api, KEY, "ORD-7311", "750.00", "CUST-7311")
    signed_in_with_a_passkey(page, "alice")
    stale_step_up(page)
    item = ReviewItem.objects.get(action__operation_key=KEY, status=ReviewStatus.OPEN)
    page.goto(f"/review/{item.pk}/")
    return item


def approve(page, item, through):
    """Approve on the item's page, with a reason, through htmx or the form's own submission: the
    browser goes to the factor's page, a whole page, and nothing is decided yet."""
    page.locator("#reason").fill("the customer was charged twice")
    if through == "htmx":
        page.locator("#decision-form").evaluate(AS_HTMX)
    decide = f"/review/{item.pk}/decide"
    posting = page.expect_request(lambda r: r.method == "POST" and r.url.endswith(decide))
    with page.expect_navigation(), posting as posted:
        page.locator("#approve-button").click()
    assert posted.value.all_headers().get("hx-request") == ("true" if through == "htmx" else None)
    asked = urlsplit(page.url)
    assert (asked.path, parse_qs(asked.query)["next"]) == (WEBAUTHN_REAUTHENTICATE, [decide])
    assert page.locator("#reauth-title").count() == 1 and page.locator("#decision-form").count() == 0
    item.refresh_from_db()
    assert item.status == ReviewStatus.OPEN and not audit_events(item, "approve").exists()


def test_an_approval_through_htmx_with_a_stale_step_up_is_taken_once_the_passkey_is_given(stack, page, people, item,
                                                                                          shot):
    approve(page, item, "htmx")
    shot(page, "step-up")
    with page.expect_navigation():
        page.locator("#mfa_webauthn_reauthenticate").click()
    # Back on the item's page (the queue has no other): decided, as she submitted it, once.
    assert page.url == f"{stack.url}/review/{item.pk}/"
    assert f"{KEY}: approved." in status_message(page)
    assert page.locator("#item-status").inner_text().strip() == "approved"
    shot(page, "decided")
    page.reload()
    item.refresh_from_db()
    assert (item.status, item.decided_by, item.decided_for) == (ReviewStatus.APPROVED, people["alice"], None)
    [event] = audit_events(item, "approve")
    assert (event.actor, event.reason) == ("user:alice", "the customer was charged twice")
    assert event.after["step_up"]["method"] == "webauthn"
    assert not page.console_errors, page.console_errors


@pytest.mark.parametrize("through", ["htmx", "form"])
def test_a_factor_given_after_the_decision_was_left_leads_back_to_its_page(stack, page, item, through, shot):
    """alice is sent to the factor, goes to the queue instead (the decision kept for her is
    dropped), and later opens the factor page again and gives her passkey: she is back on the
    item's page, nothing decided. She was sent to the decision's address, which only a POST
    opens: Chromium showed its error page for the 405."""
    approve(page, item, through)
    factor_page = page.url
    page.goto("/approvals/")
    page.goto(factor_page)
    with page.expect_navigation():
        page.locator("#mfa_webauthn_reauthenticate").click()
    shot(page, "back")
    assert page.url == f"{stack.url}/review/{item.pk}/"
    assert page.locator("#approve-button").count() == 1
    item.refresh_from_db()
    assert item.status == ReviewStatus.OPEN and not audit_events(item, "approve").exists()
    assert not page.console_errors, page.console_errors


@pytest.mark.parametrize("preview", ["fresh", "stale"])
def test_a_factor_given_after_a_bulk_discard_was_left_leads_to_the_queue(stack, page, people, agent, preview, shot):
    """olga confirms a bulk discard on its confirmation page, the answer to the preview's POST:
    its address (or, where the preview itself asked for her passkey, the factor page's) is the only
    page the browser names. Asked for her passkey, she goes elsewhere, and gives it later: she was
    sent back to that address, where Chromium showed its error page for the 405 (or the factor page
    asked for it again, and then did). She is on the queue, nothing discarded."""
    entries = [dead_letter(agent, f"stepup-bulk-{n}") for n in range(2)]
    signed_in_with_a_passkey(page, "olga")
    if preview == "stale":
        stale_step_up(page)
    page.goto("/dlq/")
    page.locator("#bulk-form select[name=op]").select_option("discard")
    with page.expect_navigation():
        page.locator("#bulk-form").get_by_role("button", name="Preview").click()
    if preview == "stale":  # the decision kept is replayed once the passkey is given: its answer, there
        with page.expect_navigation():
            page.locator("#mfa_webauthn_reauthenticate").click()
        assert urlsplit(page.url).path == WEBAUTHN_REAUTHENTICATE
    assert page.locator("#bulk-count").inner_text().strip() == "2"

    stale_step_up(page)
    page.locator("textarea[name=reason]").fill("duplicates of a refund already made by hand")
    with page.expect_navigation():
        page.locator("#bulk-confirm").click()
    assert urlsplit(page.url).path == WEBAUTHN_REAUTHENTICATE
    factor_page = page.url
    page.goto("/dlq/redrives/")
    page.goto(factor_page)
    with page.expect_navigation():
        page.locator("#mfa_webauthn_reauthenticate").click()
    shot(page, "back")
    assert page.url == f"{stack.url}/dlq/"
    assert page.locator(".queue-row").count() == 2
    assert set(DeadLetter.objects.filter(pk__in=[e.pk for e in entries]).values_list("status", flat=True)) == {
        EntryStatus.OPEN}
    assert not page.console_errors, page.console_errors
