"""Step-up: each money decision needs a second factor given within STEP_UP_SECONDS. Without one
the decision is not taken and the person is asked for it, the form kept; with it, the decision is
taken as submitted and its audit event says which factor was given, and when."""

import re
from datetime import datetime
from decimal import Decimal
from urllib.parse import urlencode

import pytest
from allauth.mfa.models import Authenticator

from approvals.models import ReviewItem, ReviewStatus
from dlq.redrive_runs import BulkRedrive
from ledger.actions import action_request
from ledger.models import AuditEvent
from tests.factories import audit_events, make_agent
from tests.signin.conftest import enrol_totp, sign_in, totp

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("jobs_to_test_redis")]
REAUTHENTICATE = "/accounts/2fa/reauthenticate/"


def approval(n):
    agent = make_agent(f"bot-{n}")[0]
    action, _ = action_request(agent=agent, operation_key=f"refund:ORD-S{n}:full:dec-{n}", action_type="refund",
                               target=f"ORD-S{n}", params={"amount": "750.00", "currency": "EUR"})
    return ReviewItem.objects.get(action=action, status=ReviewStatus.OPEN)


def approve(client, item, **headers):
    return client.post(f"/review/{item.pk}/decide", {"decision": "approve", "reason": "charged twice",
                                                     "fingerprint": item.action.params_fingerprint()}, headers=headers)


def test_a_decision_without_a_fresh_factor_is_refused_until_the_factor_is_given(client, step_up, alice):
    item = approval(1)
    sign_in(client, "alice")
    secret = enrol_totp(client)  # enrolling is not giving it: her sign-in used the password alone
    asked = approve(client, item)
    assert asked.status_code == 302 and asked["Location"] == f"{REAUTHENTICATE}?{urlencode({'next': f'/review/{item.pk}/decide'})}"
    # From an htmx form: the page as a whole goes to the same question.
    assert approve(client, item, **{"HX-Request": "true"})["HX-Redirect"] == asked["Location"]
    item.refresh_from_db()
    assert item.status == ReviewStatus.OPEN and not audit_events(item, "approve").exists()

    wrong = client.post(asked["Location"], {"code": "000000" if totp(secret) != "000000" else "111111"})
    assert wrong.status_code == 200
    item.refresh_from_db()
    assert item.status == ReviewStatus.OPEN

    # The right code: the stashed decision is taken as it was submitted, reason and all.
    decided = client.post(asked["Location"], {"code": totp(secret)})
    assert decided.status_code == 302 and not decided["Location"].startswith("/accounts/")
    item.refresh_from_db()
    assert item.status == ReviewStatus.APPROVED
    event = audit_events(item, "approve").get()
    assert event.reason == "charged twice" and event.actor == "user:alice"
    assert event.after["step_up"]["method"] == "totp"
    assert (datetime.now().astimezone() - datetime.fromisoformat(event.after["step_up"]["at"])).total_seconds() < 60
    assert AuditEvent.objects.filter(verb="stepped_up", actor="user:alice").count() == 1

    # While the factor is fresh, the next decision asks nothing more.
    other = approval(2)
    assert not approve(client, other)["Location"].startswith("/accounts/")
    assert audit_events(other, "approve").get().after["step_up"] == event.after["step_up"]


def test_a_factor_given_longer_ago_than_step_up_seconds_is_asked_for_again(client, step_up, alice, settings):
    sign_in(client, "alice")
    secret = enrol_totp(client)
    client.post(REAUTHENTICATE, {"code": totp(secret)})
    item = approval(3)
    session = client.session
    records = session["account_authentication_methods"]
    for record in records:
        record["at"] -= settings.STEP_UP_SECONDS
    session["account_authentication_methods"] = records
    session.save()
    assert approve(client, item)["Location"].startswith(REAUTHENTICATE)
    item.refresh_from_db()
    assert item.status == ReviewStatus.OPEN


def test_without_a_second_factor_a_decision_sends_the_person_to_enrol_one(client, step_up, alice):
    item = approval(4)
    sign_in(client, "alice")
    assert approve(client, item)["Location"] == "/accounts/2fa/"
    item.refresh_from_db()
    assert item.status == ReviewStatus.OPEN


@pytest.mark.parametrize("path", [
    "/review/1/decide",  # approve or reject, mark an unknown outcome succeeded or failed
    "/review/1/group",  # release one of a held group
    "/review/1/edit",  # edit down and approve
    "/decide/a-token",  # the same, from an alert's decision link
    "/dlq/1/redrive",
    "/dlq/1/resolve",  # done by hand: its money counts as moved
    "/dlq/1/discard",
    "/dlq/bulk",
    "/dlq/redrives/1/start",
    "/agents/1/grants/promote",
    "/agents/",  # a new agent: its token is shown
    "/agents/1/rotate",  # a new token for an agent with live grants
    "/agents/1/grant",
    "/policies/",  # change a limit
    "/delegations/new",  # hand one's authority over money to a delegate
])
def test_every_money_decision_asks_for_the_factor_first(client, step_up, alice, path):
    sign_in(client, "alice")
    enrol_totp(client)
    events = AuditEvent.objects.count()
    answer = client.post(path, {"reason": "go"})
    assert answer.status_code == 302 and answer["Location"] == f"{REAUTHENTICATE}?{urlencode({'next': path})}"
    assert AuditEvent.objects.count() == events


@pytest.mark.parametrize("path", [
    "/dlq/redrives/1/stop",  # stops re-sending: nothing more is sent
    "/incidents/1/take",  # an incident's owner, notes and resolution record people's work
    "/incidents/1/note",
    "/incidents/1/resolve",
    "/tasks/1/run-now",  # a queued task's backoff cut short: the same retry, sooner
    "/connectors/refund/replay",  # the replay set, against the connector's test mode
])
def test_what_moves_no_money_asks_for_no_factor(client, step_up, alice, path):
    """docs/signin.md says of each why it moves no money, re-sends no effect and changes nobody's
    authority: the view answers the POST itself (here, refusing alice, or naming nothing there is)."""
    sign_in(client, "alice")
    enrol_totp(client)  # enrolling is not giving it: she has no fresh factor
    answer = client.post(path, {"reason": "go"})
    assert answer.status_code in (403, 404), answer.get("Location")


def test_an_edit_refused_once_the_factor_is_given_keeps_what_was_typed_in_the_edit_form(client, step_up, alice):
    """The stashed edit is replayed from the factor page, whose URL the request then carries: what
    was typed came back in the decision form instead."""
    item = approval(3)
    sign_in(client, "alice")
    secret = enrol_totp(client)
    asked = client.post(f"/review/{item.pk}/edit", {"param_amount": "900.00", "reason": "more than asked",
                                                    "fingerprint": item.action.params_fingerprint()})
    assert asked["Location"].startswith(REAUTHENTICATE)
    client.post(asked["Location"], {"code": totp(secret)})  # replayed: an edit "down" to more is refused

    page = client.get(f"/review/{item.pk}/").content.decode()
    assert "Not done" in page
    assert 'id="edit-param_amount" name="param_amount" value="900.00"' in page
    assert not re.search(r'<textarea id="reason" name="reason"[^>]*>\w', page)


@pytest.mark.parametrize("abandoned", ["navigated elsewhere", "too long ago"])
def test_a_decision_abandoned_at_the_factor_page_is_not_taken_by_a_later_factor(client, step_up, alice, settings,
                                                                                abandoned):
    """alice posted Approve, was asked for her factor, and went back to the dashboard instead. Hours
    later a link to the factor page with the decision's `next` (anyone may send one) asked for her
    code: given, the stashed decision was taken as hers. It is dropped once she goes elsewhere, and
    once STEP_UP_SECONDS have passed; the factor then leads back to the page, nothing decided."""
    item = approval(4)
    sign_in(client, "alice")
    secret = enrol_totp(client)
    asked = approve(client, item)
    assert asked["Location"].startswith(REAUTHENTICATE)
    if abandoned == "navigated elsewhere":
        client.get(asked["Location"], headers={"Sec-Fetch-Mode": "navigate"})  # the factor page: still hers
        assert "account_reauthentication_state" in client.session
        client.get("/", headers={"Sec-Fetch-Mode": "navigate"})
    else:
        session = client.session
        state = session["account_reauthentication_state"]
        session["account_reauthentication_state"] = {**state, "stashed_at": state["stashed_at"] - settings.STEP_UP_SECONDS - 1}
        session.save()

    given = client.post(asked["Location"], {"code": totp(secret)})
    # The test client names no page it posted from: the item's page, not the decision's address.
    assert given.status_code == 302 and given["Location"] == f"/review/{item.pk}/"
    assert client.get(given["Location"]).status_code == 200
    item.refresh_from_db()
    assert item.status == ReviewStatus.OPEN and not audit_events(item, "approve").exists()


@pytest.mark.parametrize(("asked_from", "decision", "lands_on"), [
    # No page named (no Referer): the item's page, the page above the decision's address.
    (None, "/review/{pk}/decide", "/review/{pk}/"),
    (None, "/agents/1/grants/promote", "/agents/"),
    # The bulk discard's confirmation, the answer to its first POST, at an address only a POST opens.
    ("/dlq/bulk", "/dlq/bulk", "/dlq/"),
    # A bulk redrive's start refused (the queue moved since its dry run): its page, answered to the
    # POST, and the start form on it.
    ("/dlq/redrives/{pk}/start", "/dlq/redrives/{pk}/start", "/dlq/redrives/{pk}/"),
    # The factor page, where a decision replayed after an earlier factor showed its answer.
    ("/accounts/2fa/reauthenticate/?next=%2Fdlq%2Fbulk", "/review/{pk}/decide", "/review/{pk}/"),
])
def test_a_factor_given_after_the_decision_was_left_leads_to_a_page_a_get_opens(client, step_up, alice, asked_from,
                                                                                 decision, lands_on):
    """With no page named to go back to, or a page that was a POST's answer, the factor led to an
    address only a POST opens: the browser showed a 405. It leads to a page, nothing decided."""
    item = approval(5)
    run = BulkRedrive.objects.create(filters={}, planned_by="olga", ceiling=Decimal("60"))
    sign_in(client, "alice")
    secret = enrol_totp(client)
    decision, lands_on = (path.format(pk=item.pk if path.startswith("/review/") else run.pk)
                          for path in (decision, lands_on))
    headers = {"Referer": f"http://testserver{asked_from.format(pk=run.pk)}"} if asked_from else {}
    decide = {"decision": "approve", "reason": "go", "fingerprint": item.action.params_fingerprint()}
    asked = client.post(decision, decide, headers=headers)
    assert asked["Location"].startswith(REAUTHENTICATE)
    client.get("/", headers={"Sec-Fetch-Mode": "navigate"})  # elsewhere: the decision kept is dropped
    last = AuditEvent.objects.order_by("-pk").values_list("pk", flat=True).first()

    given = client.post(asked["Location"], {"code": totp(secret)})
    assert given.status_code == 302 and given["Location"] == lands_on
    assert client.get(lands_on).status_code == 200
    item.refresh_from_db()
    assert item.status == ReviewStatus.OPEN
    assert list(AuditEvent.objects.filter(pk__gt=last).values_list("verb", flat=True)) == ["stepped_up"]


def test_allauths_own_request_kept_for_the_factor_is_still_carried_out(client, step_up, alice):
    """allauth keeps a request of its own for the factor too (removing one, here): it bore no time
    of asking, was taken for an abandoned one and dropped on the factor page, and the factor given
    removed nothing."""
    sign_in(client, "alice")
    secret = enrol_totp(client)
    asked = client.post("/accounts/2fa/totp/deactivate/", headers={"Sec-Fetch-Mode": "navigate"})
    assert asked.status_code == 302 and asked["Location"].startswith(REAUTHENTICATE)
    client.get(asked["Location"], headers={"Sec-Fetch-Mode": "navigate"})
    assert "account_reauthentication_state" in client.session
    client.post(asked["Location"], {"code": totp(secret)}, headers={"Sec-Fetch-Mode": "navigate"})
    assert not Authenticator.objects.filter(user=alice, type=Authenticator.Type.TOTP).exists()
