"""Delegation (approvals.delegation): a person away names a delegate for a period. While it
runs, the delegate is mailed the person's alerts, with a decision link of their own, and may
decide what the person may decide, on their behalf, recorded as such; four eyes hold for both
of them. Named, ended and offered: each is audited."""

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import IntegrityError, connection, transaction
from django.test import Client
from django.utils import timezone

from approvals.access import acting_for, may_decide
from approvals.decisions import DecisionRefused, given_by_the_same_eyes, review_decide, waiting_for
from approvals.evidence import approvals_evidence
from approvals.delegation import (DelegationRefused, delegate_choices, delegation_name, delegation_revoke,
                                  standing_in)
from approvals.models import Delegation, Limit, ReviewItem, ReviewKind, ReviewStatus
from dlq.alerts import alert_deliver
from dlq.models import Alert
from dlq.overdue import review_alert_overdue
from ledger.actions import action_request
from tests.conftest import free_port
from tests.connectors.test_email import SMTP_BACKEND, MailServer
from tests.factories import audit_events, make_agent, person

pytestmark = pytest.mark.django_db

LINK = re.compile(r"http://[^\s]+/decide/([A-Za-z0-9_-]+)")


@pytest.fixture
def people():
    """alice and bob approve; olga, an operator, may not approve on her own."""
    users = {name: person(name, group) for name, group in
             (("alice", "approvers"), ("bob", "approvers"), ("olga", "operators"))}
    for user in users.values():
        user.email = f"{user.username}@surety.example"
        user.save(update_fields=["email"])
    return users


@pytest.fixture
def limit():
    Limit.limit_set(actor="system:tests", reason="the tests' policy", action_type="refund", currency="EUR",
                    max_amount=Decimal("500.00"), dual_approval_above=Decimal("5000.00"),
                    first_tier="alice@surety.example")


def over_limit(amount="750.00", owner=None, n=1):
    agent = make_agent(f"billing-{n}", owner=owner)[0]
    action, _ = action_request(agent=agent, operation_key=f"refund:ORD-{n}:dec-{n}", action_type="refund",
                               target=f"ORD-{n}", customer="CUST-1", params={"amount": amount, "currency": "EUR"})
    return ReviewItem.objects.get(action=action)


def away(person, delegate, *, starts=-1, ends=24):
    now = timezone.now()
    return delegation_name(person=person, delegate=delegate, starts_at=now + timedelta(hours=starts),
                           ends_at=now + timedelta(hours=ends), reason="on leave")


def signed_in(user):
    client = Client()
    client.force_login(user)
    return client


def decide(client, item, decision="approve", reason="the order shows the damage"):
    return client.post(f"/review/{item.pk}/decide", {"decision": decision, "reason": reason,
                                                      "fingerprint": item.action.params_fingerprint()})


def test_a_delegate_decides_on_the_persons_behalf_and_the_trail_says_so(people, limit):
    item = over_limit()
    olga = signed_in(people["olga"])
    assert b'id="approve-button"' not in olga.get(f"/review/{item.pk}/").content
    assert decide(olga, item).status_code == 403

    away(people["alice"], people["olga"])
    assert b'id="approve-button"' in olga.get(f"/review/{item.pk}/").content
    assert decide(olga, item).status_code == 302

    item.refresh_from_db()
    assert (item.status, item.decided_by, item.decided_for) == (ReviewStatus.APPROVED, people["olga"], people["alice"])
    [event] = audit_events(item, "approve")
    assert event.actor == "user:olga" and event.after["on_behalf_of"] == "user:alice"
    # The evidence record says so too: the decision read as the delegate's own.
    [shown] = approvals_evidence(item.action).data["review_items"]
    assert (shown["decided_by"], shown["decided_for"]) == ("olga", "alice")


@pytest.mark.parametrize("when", ["ended early", "not started", "over"])
def test_outside_its_period_a_delegation_gives_nothing(people, limit, when):
    item = over_limit()
    if when == "ended early":
        delegation_revoke(away(people["alice"], people["olga"]), user=people["alice"])
    elif when == "not started":
        away(people["alice"], people["olga"], starts=2)
    else:
        delegation = away(people["alice"], people["olga"])
        Delegation.objects.filter(pk=delegation.pk).update(ends_at=timezone.now() - timedelta(minutes=1))

    assert decide(signed_in(people["olga"]), item).status_code == 403
    assert ReviewItem.objects.get(pk=item.pk).status == ReviewStatus.OPEN


def test_a_delegate_never_decides_a_request_of_an_agent_the_person_owns(people, limit):
    item = over_limit(owner=people["alice"])
    away(people["alice"], people["olga"])

    with pytest.raises(DecisionRefused, match="alice, whose delegate you are, is responsible"):
        review_decide(item, user=people["olga"], decision="approve", reason="for alice")
    assert b'id="approve-button"' not in signed_in(people["olga"]).get(f"/review/{item.pk}/").content
    assert ReviewItem.objects.get(pk=item.pk).status == ReviewStatus.OPEN
    review_decide(item, user=people["bob"], decision="approve", reason="four eyes")  # bob is someone else


@pytest.mark.parametrize("owner_first", [True, False], ids=["owner's delegation first", "owner's second"])
def test_with_two_delegations_the_delegate_decides_for_the_one_four_eyes_allow(people, limit, owner_first):
    """alice owns the agent that asked, bob does not; both are away and name olga. She decides for
    bob, whichever delegation came first (the first one used to decide, and alice's was refused)."""
    item = over_limit(owner=people["alice"])
    for name in ("alice", "bob") if owner_first else ("bob", "alice"):
        away(people[name], people["olga"])
    olga = signed_in(people["olga"])
    assert b'id="approve-button"' in olga.get(f"/review/{item.pk}/").content
    review_decide(item, user=people["olga"], decision="approve", reason="for bob")
    item.refresh_from_db()
    assert (item.status, item.decided_by, item.decided_for) == (ReviewStatus.APPROVED, people["olga"], people["bob"])


def test_with_two_delegations_the_second_approval_is_given_for_the_one_who_has_not_approved(people, limit):
    """Two approvals needed; bob gave the first. olga stands in for bob (the older delegation) and
    carol: her approval is carol's, the second, not bob's again (refused as four eyes)."""
    carol = person("carol", "approvers")
    item = over_limit(amount="6000.00")
    assert item.approvals_needed == 2
    review_decide(item, user=people["bob"], decision="approve", reason="first look")
    away(people["bob"], people["olga"])
    away(carol, people["olga"])
    review_decide(item, user=people["olga"], decision="approve", reason="second look")
    item.refresh_from_db()
    assert (item.status, item.decided_by, item.decided_for) == (ReviewStatus.APPROVED, people["olga"], carol)


def test_a_person_and_their_delegate_give_one_approval_between_them(people, limit):
    item = over_limit(amount="6000.00")
    away(people["alice"], people["olga"])
    review_decide(item, user=people["alice"], decision="approve", reason="first")

    with pytest.raises(DecisionRefused, match="someone else than you and alice"):
        review_decide(item, user=people["olga"], decision="approve", reason="second, for alice")
    assert ReviewItem.objects.get(pk=item.pk).status == ReviewStatus.OPEN

    review_decide(item, user=people["bob"], decision="approve", reason="second")
    assert ReviewItem.objects.get(pk=item.pk).status == ReviewStatus.APPROVED


def test_a_delegates_approval_first_counts_for_the_person_too(people, limit):
    item = over_limit(amount="6000.00")
    away(people["alice"], people["olga"])
    review_decide(item, user=people["olga"], decision="approve", reason="first, for alice")
    [recorded] = audit_events(item, "approval_recorded")
    assert recorded.after["on_behalf_of"] == "alice"

    with pytest.raises(DecisionRefused, match="someone else"):
        review_decide(item, user=people["alice"], decision="approve", reason="second")


def test_an_alert_to_a_person_away_reaches_their_delegate_with_a_link_of_their_own(people, limit, mailoutbox,
                                                                                    settings):
    settings.SITE_URL = "http://testserver"
    item = over_limit()
    away(people["alice"], people["olga"])

    assert review_alert_overdue(now=item.deadline + timedelta(minutes=1)) == 1
    alert_deliver(Alert.objects.get(review_item=item).pk)

    mailed = {message.to[0]: message.body for message in mailoutbox}
    assert sorted(mailed) == ["alice@surety.example", "olga@surety.example"]
    token = LINK.search(mailed["olga@surety.example"]).group(1)
    assert token != LINK.search(mailed["alice@surety.example"]).group(1)
    [offered] = audit_events(item, "offered_to_delegate")
    assert (offered.after["person"], offered.after["delegate"]) == ("alice", "olga")

    olga = signed_in(people["olga"])
    page = olga.get(f"/decide/{token}")
    fingerprint = re.search(rb'name="fingerprint" value="([0-9a-f]{64})"', page.content).group(1).decode()
    assert olga.post(f"/decide/{token}", {"decision": "approve", "reason": "for alice",
                                          "fingerprint": fingerprint}).status_code == 302
    item.refresh_from_db()
    assert (item.status, item.decided_for) == (ReviewStatus.APPROVED, people["alice"])


def test_an_offering_is_audited_once_and_only_when_the_mail_went(people, limit, mailoutbox, settings):
    item = over_limit()
    away(people["alice"], people["olga"])
    review_alert_overdue(now=item.deadline + timedelta(minutes=1))
    alert = Alert.objects.get(review_item=item)

    # Nothing listens on the SMTP port: the delivery fails, and nothing was offered.
    settings.EMAIL_BACKEND, settings.EMAIL_HOST, settings.EMAIL_PORT = SMTP_BACKEND, "127.0.0.1", free_port()
    alert_deliver(alert.pk)
    assert alert.deliveries.get().ok is False and not audit_events(item, "offered_to_delegate").exists()

    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    alert_deliver(alert.pk)
    assert sorted(m.to[0] for m in mailoutbox) == ["alice@surety.example", "olga@surety.example"]
    assert len(audit_events(item, "offered_to_delegate")) == 1


def test_a_person_names_a_delegate_on_the_page_and_ends_it(people):
    alice = signed_in(people["alice"])
    page = alice.get("/delegations/")
    assert page.status_code == 200 and b'<option value="%d">olga' % people["olga"].pk in page.content
    now = timezone.now()
    named = alice.post("/delegations/new", {"delegate": people["olga"].pk, "reason": "on leave",
                                            "starts_at": f"{now:%Y-%m-%dT%H:%M}",
                                            "ends_at": f"{now + timedelta(days=7):%Y-%m-%dT%H:%M}"})
    assert named.status_code == 302
    delegation = Delegation.objects.get()
    assert (delegation.person, delegation.delegate) == (people["alice"], people["olga"])
    assert [e.actor for e in audit_events(delegation, "delegation_named")] == ["user:alice"]
    assert b"Hand it back" in signed_in(people["olga"]).get("/delegations/").content

    assert signed_in(people["bob"]).post(f"/delegations/{delegation.pk}/end").status_code == 404
    assert alice.post(f"/delegations/{delegation.pk}/end").status_code == 302
    delegation.refresh_from_db()
    assert delegation.revoked_at is not None and audit_events(delegation, "delegation_revoked")


@pytest.mark.parametrize("change, error", [
    ({"ends_at": "2020-01-01T00:00"}, b"must end after it starts"),
    ({"starts_at": "2020-01-01T00:00", "ends_at": "2020-01-02T00:00"}, b"would be over already"),
    ({"ends_at": "2099-01-01T00:00"}, b"90 days at the most"),
    ({"reason": ""}, b"This field is required"),
    ({"delegate": "oneself"}, b"Select a valid choice"),
    ({"starts_at": "soon"}, b"Enter a valid date/time"),
])
def test_a_delegation_that_cannot_be_is_refused_and_nothing_is_written(people, change, error):
    alice = signed_in(people["alice"])
    now = timezone.now()
    form = {"delegate": people["olga"].pk, "reason": "on leave", "starts_at": f"{now:%Y-%m-%dT%H:%M}",
            "ends_at": f"{now + timedelta(days=1):%Y-%m-%dT%H:%M}", **change}
    if form["delegate"] == "oneself":
        form["delegate"] = people["alice"].pk
    refused = alice.post("/delegations/new", form)
    assert refused.status_code == 400 and error in refused.content
    assert not Delegation.objects.exists()


def test_the_database_refuses_a_delegation_longer_than_the_cap(people):
    """The 90 days are the database's rule too, not only the form's and delegation_name's."""
    start = timezone.now()
    fields = {"person": people["alice"], "delegate": people["olga"], "starts_at": start, "reason": "on leave"}
    Delegation.objects.create(ends_at=start + timedelta(days=90), **fields)  # the longest there is
    with pytest.raises(IntegrityError, match="delegation_at_most_max_days"), transaction.atomic():
        Delegation.objects.create(ends_at=start + timedelta(days=90, seconds=1), **fields)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a session time zone is PostgreSQL's")
def test_the_cap_is_a_length_whatever_the_sessions_time_zone(people):
    """90 days across a clock change are 90 days: in Berlin, `starts_at + 90 days` across the
    spring's change is an hour short of them (a restore may run in any time zone)."""
    start = datetime(2027, 1, 15, 12, tzinfo=UTC)  # Berlin moves its clocks on 2027-03-28
    fields = {"person": people["alice"], "delegate": people["olga"], "starts_at": start, "reason": "on leave"}
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL TIME ZONE 'Europe/Berlin'")
        Delegation.objects.create(ends_at=start + timedelta(days=90), **fields)


def test_a_delegate_mailed_before_a_later_address_failed_is_audited_once(people, limit, settings):
    """alice's and her delegate olga's mails went, desk's was refused for now: the offering was
    audited only after every mail of the attempt, so never; the retry mails desk alone."""
    Limit.limit_set(actor="system:tests", reason="a desk too", action_type="refund", currency="EUR",
                    max_amount=Decimal("500.00"), dual_approval_above=Decimal("5000.00"),
                    first_tier="alice@surety.example, desk@surety.example")
    item = over_limit()
    away(people["alice"], people["olga"])
    review_alert_overdue(now=item.deadline + timedelta(minutes=1))
    alert = Alert.objects.get(review_item=item)
    server = MailServer()
    server.controller.start()
    try:
        settings.EMAIL_BACKEND, settings.EMAIL_HOST, settings.EMAIL_PORT = SMTP_BACKEND, "127.0.0.1", server.port
        server.script["RCPT"] = [None, None, "451 4.3.0 Try again later"]
        alert_deliver(alert.pk)
        assert sorted(str(m["To"]) for m in server.accepted) == ["alice@surety.example", "olga@surety.example"]
        alert_deliver(alert.pk)
    finally:
        server.controller.stop()
    assert sorted(str(m["To"]) for m in server.accepted) == [
        "alice@surety.example", "desk@surety.example", "olga@surety.example"]
    assert len(audit_events(item, "offered_to_delegate")) == 1


def test_an_auditor_is_never_a_delegate_and_one_named_before_decides_nothing(people, limit):
    """An auditor only reads (and holds no factor for deciding): offered as a delegate, named, they
    approved refunds on the person's behalf. They are not offered, not accepted, and a delegation
    to one made before (or through the admin) gives nothing."""
    aldo = person("aldo", "auditors")
    assert aldo not in delegate_choices(people["alice"])
    with pytest.raises(DelegationRefused, match="not an active person of a role that decides"):
        away(people["alice"], aldo)
    now = timezone.now()
    Delegation.objects.create(person=people["alice"], delegate=aldo, starts_at=now - timedelta(hours=1),
                              ends_at=now + timedelta(hours=1), reason="named before the rule")
    aldo.email, aldo.is_staff = "aldo@surety.example", True  # staff (the admin's flag) is no deciding role
    aldo.save(update_fields=["email", "is_staff"])
    assert standing_in(["alice@surety.example"]) == []  # nor is he mailed her alerts
    item = over_limit()
    assert decide(signed_in(aldo), item).status_code == 403
    item.refresh_from_db()
    assert item.status == ReviewStatus.OPEN


@pytest.mark.parametrize("first", ["alice", "olga"], ids=["the person first", "the delegate first"])
def test_the_page_tells_a_person_and_their_delegate_that_one_of_them_approved_already(people, limit, first):
    """Four eyes refuse the second approval of a person and their delegate: the page says so first,
    and offers neither of them an Approve that would only be refused."""
    item = over_limit(amount="6000.00")
    away(people["alice"], people["olga"])
    review_decide(item, user=people[first], decision="approve", reason="first look")

    for name in ("alice", "olga"):
        page = signed_in(people[name]).get(f"/review/{item.pk}/").content.decode()
        assert 'id="approve-button"' not in page and 'id="edit-form"' not in page, name
        if name == first:
            assert 'id="approved-by-me"' in page
            continue
        [said] = re.findall(r'id="approved-by-us">(.*?)</p>', page, re.S)
        said = " ".join(re.sub(r"<[^>]+>", " ", said).split())
        assert said.startswith(f"{first} approved this") and "someone other than the two of you" in said, said
    # bob is someone else: the second approval is his to give.
    assert b'id="approve-button"' in signed_in(people["bob"]).get(f"/review/{item.pk}/").content


def test_a_delegate_whose_person_owns_the_agent_is_told_so_not_that_they_lack_a_permission(people, limit):
    item = over_limit(owner=people["alice"])
    away(people["alice"], people["olga"])
    page = signed_in(people["olga"]).get(f"/review/{item.pk}/").content.decode()
    assert 'id="no-permission"' not in page
    [said] = re.findall(r'id="four-eyes">(.*?)</p>', page, re.S)
    assert "alice, for whom you stand in, is responsible for billing-1" in " ".join(said.split())


def test_the_approve_buttons_question_says_for_whom_a_delegate_approved(people, limit):
    """olga approved the first of two for alice: bob's Approve asks naming her approval as given,
    for alice (it ran the approvers' names together, and never said for whom)."""
    item = over_limit(amount="6000.00")
    away(people["alice"], people["olga"])
    review_decide(item, user=people["olga"], decision="approve", reason="first, for alice")

    page = signed_in(people["bob"]).get(f"/review/{item.pk}/").content.decode()
    [asked] = re.findall(r'id="approve-button"\s+data-confirm="([^"]*)"', page)
    assert " ".join(asked.split()) == ("Approve 6000.00 EUR? It is above the two-approver threshold: olga for alice "
                                       "approved first, and yours, from a second, different person, lets it go ahead.")


def test_the_items_list_of_approvals_says_for_whom_a_delegate_approved(people, limit):
    """olga approved the first of two for alice: the item's list of approvals names her approval
    as given for alice, as the Approve button's question does (it named olga alone, as if the
    approval were her own, and alice's eyes had not yet looked)."""
    item = over_limit(amount="6000.00")
    away(people["alice"], people["olga"])
    review_decide(item, user=people["olga"], decision="approve", reason="first, for alice")

    page = signed_in(people["bob"]).get(f"/review/{item.pk}/").content.decode()
    [listed] = re.findall(r'<ul class="approvals-list">(.*?)</ul>', page, re.S)
    said = " ".join(re.sub(r"<[^>]+>", " ", listed).split())
    assert said.startswith("olga for alice approved "), said


def test_the_items_decided_line_says_for_whom_a_delegate_decided(people, limit):
    """olga approved for alice: the item's page said "approved by user:olga", as if on her own
    authority, where its audit event and its evidence say on whose behalf. A decision on one's own
    authority names its decider alone."""
    item = over_limit()
    away(people["alice"], people["olga"])
    assert decide(signed_in(people["olga"]), item).status_code == 302
    own = over_limit(n=2)  # of the same customer, held behind the first: bob rejects it as himself
    assert decide(signed_in(people["bob"]), own, decision="reject").status_code == 302

    def decided_line(item):
        page = signed_in(people["bob"]).get(f"/review/{item.pk}/").content.decode()
        [line] = re.findall(r'<div class="decided" id="decided">\s*<p>(.*?)</p>', page, re.S)
        return " ".join(re.sub(r"<[^>]+>", " ", line).split())

    assert decided_line(item).startswith("approved by user:olga for user:alice "), decided_line(item)
    assert audit_events(item, "approve").get().after["on_behalf_of"] == "user:alice"
    assert decided_line(own).startswith("rejected by user:bob "), decided_line(own)
    assert " for " not in decided_line(own)


def asked_of(n, owner=None, amount="750.00", customer=None):
    """An over-limit refund of its own agent, order and customer (unless `customer` is shared):
    what waits for a person about it."""
    agent = make_agent(f"bot-{n}", owner=owner)[0]
    action, _ = action_request(agent=agent, operation_key=f"refund:ORD-{n}:dec-{n}", action_type="refund",
                               target=f"ORD-{n}", customer=customer or f"C-{n}",
                               params={"amount": amount, "currency": "EUR"})
    return ReviewItem.objects.get(action=action, status="open")


def test_a_delegates_next_item_is_never_one_of_an_agent_their_person_owns(people, limit):
    """Decision 50's gap: an item of an agent alice owns waited for olga, who stands in for alice,
    though four eyes refuse her every decision on it ("Next item" sent her to a page that offers
    none). bob may decide it: it waits for him."""
    first, owned, last = asked_of(1), asked_of(2, owner=people["alice"]), asked_of(3)
    away(people["alice"], people["olga"])

    assert signed_in(people["olga"]).get(f"/review/{first.pk}/").context["next_item"] == last
    assert signed_in(people["bob"]).get(f"/review/{first.pk}/").context["next_item"] == owned


def test_what_waits_for_each_person_is_what_their_items_pages_let_them_decide(people, limit):
    """"Waiting for me" and the next item count an open item for a person exactly where its page
    offers them a decision (may_decide) that four eyes do not refuse for an approval given already:
    for olga, alice's delegate with no permission of her own, neither what an agent alice owns
    asked nor what alice approved first; for olga's own agent, nobody's delegate decides for her."""
    first, owned_by_alice, owned_by_olga = asked_of(1), asked_of(2, owner=people["alice"]), asked_of(
        3, owner=people["olga"])
    approved_by_alice, approved_by_bob = asked_of(4, amount="6000.00"), asked_of(5, amount="6000.00")
    review_decide(approved_by_alice, user=people["alice"], decision="approve", reason="one of two")
    review_decide(approved_by_bob, user=people["bob"], decision="approve", reason="one of two")
    held_mine = asked_of(6, owner=people["alice"], customer="C-6").action
    held_other = asked_of(7, customer="C-6")  # holds both
    held_mine = ReviewItem.objects.get(action=held_mine, status="open")
    assert {held_mine.kind, held_other.kind} == {ReviewKind.HELD}
    away(people["alice"], people["olga"])

    def decidable(user):
        return {item.pk for item in ReviewItem.objects.filter(status="open")
                if may_decide(user, item) and not given_by_the_same_eyes(item.approvals.all(), user,
                                                                         acting_for(user, item))}

    for name in ("olga", "alice", "bob"):
        user = people[name]
        waiting = set(ReviewItem.objects.filter(waiting_for(user), status="open").values_list("pk", flat=True))
        assert waiting == decidable(user), name
    assert decidable(people["olga"]) == {first.pk, approved_by_bob.pk, held_other.pk}
