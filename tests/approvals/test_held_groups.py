"""Held groups: when the action that held others settles, they are looked at again in the same
transaction (released, or kept held with the new reason); a person decides a whole group in
one interaction; two requests for one order close together end with exactly one effect."""

import contextlib
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, transaction

from approvals import decisions
from ledger import actions
from approvals.decisions import (GROUP_CHANGED, IN_FLIGHT_CHANGED, DecisionRefused, held_group, held_group_decide,
                                 in_flight_print, review_decide)
from approvals.models import Limit, ReviewItem, ReviewKind, ReviewStatus
from ledger.actions import action_request, action_retry, in_flight_near
from ledger.models import Action, ActionStatus
from tests.conftest import wait_until
from tests.factories import agent_api, audit_events, make_agent, refund_body, sandbox_list, sessions_waiting_for_a_lock

S = ActionStatus


def refund(agent, key, order="ORD-1", customer=""):
    return action_request(agent=agent, operation_key=key, action_type="refund", target=order, customer=customer,
                          params={"amount": "25.00", "currency": "EUR"})[0]


def status(action):
    return Action.objects.get(pk=action.pk).status


def print_near(action):
    """The print of what is in flight near `action` now, as its page carries it."""
    return in_flight_print(in_flight_near(action))


@pytest.fixture
def agent(db, jobs_to_test_redis):
    return make_agent("billing")[0]


@pytest.fixture
def approver(db):
    return get_user_model().objects.create_superuser("alice", password=None)


def running(action):
    return Action.objects.get(pk=action.pk).claim(owner="host:tests")


def seen_on(page, name):
    """The value of the page's hidden field `name` (what the page carries back with its form)."""
    return re.search(rf'name="{name}" value="([^"]*)"', page).group(1)


def opened(client, item):
    """The held item's page as it was when opened: its form's fields, as they will be posted."""
    page = client.get(f"/review/{item.pk}/").content.decode()
    return {"fingerprint": seen_on(page, "fingerprint"), "in_flight": seen_on(page, "in_flight"), "page": page}


def release_from(client, item, form, reason="released"):
    return client.post(f"/review/{item.pk}/decide", {"decision": "release", "reason": reason,
                                                     "fingerprint": form["fingerprint"],
                                                     "in_flight": form["in_flight"]}, follow=True)




@pytest.mark.django_db
def test_when_the_holder_succeeds_the_held_one_is_released_at_once(agent):
    first = running(refund(agent, "r1"))
    second = refund(agent, "r2")
    assert status(second) == S.HELD

    first.mark_succeeded(actor="system:executor", external_ref="re_1", claim=first.fence)

    assert status(second) == S.QUEUED
    [released] = audit_events(second, "released")
    assert released.reason == "r1 is succeeded: nothing else holds it"
    assert not ReviewItem.objects.filter(action=second, status=ReviewStatus.OPEN).exists()


@pytest.mark.django_db
def test_the_next_one_stays_held_with_the_new_reason(agent):
    first = running(refund(agent, "r1"))
    second, third = refund(agent, "r2"), refund(agent, "r3")

    first.mark_failed(actor="system:executor", code="declined", message="no", retryable=False, claim=first.fence)

    assert (status(second), status(third)) == (S.QUEUED, S.HELD)
    [still] = audit_events(third, "still_held")
    assert still.reason == "r2 is in flight for the same target or customer"
    assert ReviewItem.objects.get(action=third, status=ReviewStatus.OPEN).why == still.reason


@pytest.mark.django_db
def test_a_held_one_on_the_same_customer_is_released_when_the_holder_settles(agent):
    first = running(refund(agent, "r1", order="ORD-1", customer="CUST-1"))
    second = refund(agent, "r2", order="ORD-2", customer="CUST-1")
    assert status(second) == S.HELD

    first.mark_succeeded(actor="system:executor", external_ref="re_1", claim=first.fence)

    assert status(second) == S.QUEUED


@pytest.mark.django_db(transaction=True)
def test_two_settles_at_once_release_one_action_of_a_customer_not_two(agent):
    """H2 waits for A (its order), H4 for B (its order); both are for customer D. A and B settle
    at the same moment: each settle, on its own, would see the other's held action still held
    (which holds nothing) and release its own, and two actions for D would run at once. The
    release is decided under the held action's subjects' locks: one goes, the other stays held
    behind it."""
    a, b = running(refund(agent, "a", "ORD-T", "CUST-X")), running(refund(agent, "b", "ORD-F", "CUST-Y"))
    h2, h4 = refund(agent, "h2", "ORD-T", "CUST-D"), refund(agent, "h4", "ORD-F", "CUST-D")
    assert (status(h2), status(h4)) == (S.HELD, S.HELD)
    both_settled = threading.Barrier(2, timeout=20)

    def settle(action):
        try:
            with transaction.atomic():  # both hold what they did until both have done it
                action.mark_succeeded(actor="system:executor", external_ref=f"re_{action.pk}", claim=action.fence)
                both_settled.wait()
        finally:
            connection.close()

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(settle, (a, b)))
    assert {status(h2), status(h4)} == {S.QUEUED, S.HELD}
    released, left = (h2, h4) if status(h2) == S.QUEUED else (h4, h2)
    [still] = audit_events(left, "still_held")  # looked at again once both had committed
    assert still.reason == f"{released.operation_key} is in flight for the same target or customer"
    released = running(released)
    released.mark_succeeded(actor="system:executor", external_ref="re_released", claim=released.fence)
    assert (status(released), status(left)) == (S.SUCCEEDED, S.QUEUED)  # then the one left goes


@pytest.mark.django_db(transaction=True)
def test_a_held_action_whose_customer_was_busy_at_the_settle_is_looked_at_again_after_it(agent):
    """r1 settles while an intake for the same customer (under a shadow grant: it holds nothing)
    has its lock: the settle may not wait for it, and r2 was left held with nothing in flight.
    It is looked at again once the settle has committed, waiting for the lock as an intake does."""
    first = running(refund(agent, "r1", order="ORD-1", customer="CUST-1"))
    second = refund(agent, "r2", order="ORD-2", customer="CUST-1")
    assert status(second) == S.HELD
    settled_while_its_customer_is_busy(agent, first)
    assert (status(second), Action.objects.get(operation_key="r3").status) == (S.QUEUED, S.SHADOW)


def settled_while_its_customer_is_busy(agent, first):
    """`first` (claimed) succeeds while an intake for the same customer, r3 (under a shadow grant: it
    holds nothing), has the customer's lock: the settle may not wait for it, and leaves what it
    held for a look after its commit."""
    locked, settled = threading.Event(), threading.Event()

    def intake():
        try:
            with transaction.atomic():
                action_request(agent=agent, operation_key="r3", action_type="refund", target="ORD-3",
                               customer="CUST-1", params={"amount": "25.00", "currency": "EUR"}, shadow=True)
                locked.set()
                # The customer's lock is held until the settle, having met it, waits for it after its
                # commit, or has returned: one that looks no more at r2 returns and leaves it held.
                # (The bound is only a safety net: either comes as soon as the settle is done.)
                wait_until(lambda: sessions_waiting_for_a_lock("ledger_lock_subjects") or settled.is_set(),
                           seconds=60, interval=0.02, message="the settle to wait for the customer's lock")
        finally:
            connection.close()

    with ThreadPoolExecutor(1) as other:
        shadow = other.submit(intake)
        assert locked.wait(20)
        try:
            first.mark_succeeded(actor="system:executor", external_ref="re_1", claim=first.fence)
        finally:
            settled.set()
        shadow.result()


@pytest.mark.django_db(transaction=True)
def test_a_look_again_that_fails_fails_neither_the_settle_nor_what_follows_its_commit(agent, monkeypatch, caplog):
    """It runs after the settle committed: a failure there (the database gone meanwhile) is
    logged, the held one waits for a person, and the settle's caller (a worker's lane, a
    person's decision) is not failed by it."""
    first = running(refund(agent, "r1", order="ORD-1", customer="CUST-1"))
    second = refund(agent, "r2", order="ORD-2", customer="CUST-1")

    def gone(held_pk, settled_pk):
        raise RuntimeError("the database went away")

    monkeypatch.setattr(actions, "_try_lock_subjects", lambda target, customer: False)  # as if busy
    monkeypatch.setattr(actions, "_look_again", gone)
    rang = []
    with transaction.atomic():
        first.mark_succeeded(actor="system:executor", external_ref="re_1", claim=first.fence)
        transaction.on_commit(lambda: rang.append(True))  # what else waits for this commit
    assert (status(first), status(second), rang) == (S.SUCCEEDED, S.HELD, [True])
    assert "the database went away" in caplog.text


@pytest.mark.django_db
def test_actions_without_a_customer_do_not_hold_each_other_by_it(agent):
    holder = running(refund(agent, "r1", order="ORD-1"))
    held = refund(agent, "r2", order="ORD-1")
    other = running(refund(agent, "r3", order="ORD-2"))
    assert (status(held), status(other)) == (S.HELD, S.PENDING)

    other.mark_succeeded(actor="system:executor", external_ref="re_3", claim=other.fence)

    # Settling an action on another order and no customer does not even look at it again.
    assert status(held) == S.HELD and not audit_events(held, "still_held")
    holder.mark_succeeded(actor="system:executor", external_ref="re_1", claim=holder.fence)
    assert status(held) == S.QUEUED


@pytest.mark.django_db
def test_a_failure_that_may_be_retried_keeps_what_it_held(agent):
    first = running(refund(agent, "r1"))
    second = refund(agent, "r2")
    first.mark_failed(actor="system:executor", code="x", message="x", retryable=True, claim=first.fence)
    assert status(second) == S.HELD


@pytest.mark.django_db(transaction=True)
def test_an_action_held_at_its_insert_whose_holder_settles_before_the_intake_looks_is_released(agent, monkeypatch):
    """The intake's insert holds r2 (r1 is in flight), and r1 settles before the intake looks for
    what holds it: the settle could not see r2 yet, so it released nothing. The intake, finding
    nothing in flight, releases r2 itself."""
    first = running(refund(agent, "r1"))
    inserted, settled = threading.Event(), threading.Event()
    look = actions.in_flight_near

    def after_the_settle(action, **kwargs):
        inserted.set()  # r2's row is inserted, held by the rule, not yet committed
        assert settled.wait(20)
        return look(action, **kwargs)

    monkeypatch.setattr(actions, "in_flight_near", after_the_settle)

    def intake():
        try:
            return refund(agent, "r2")
        finally:
            connection.close()

    with ThreadPoolExecutor(1) as other:
        second = other.submit(intake)
        assert inserted.wait(20)
        first.mark_succeeded(actor="system:executor", external_ref="re_1", claim=first.fence)
        settled.set()
        second = second.result()
    assert status(second) == S.QUEUED
    assert [verb for verb, in audit_events(second).values_list("verb")] == ["requested", "released"]


@pytest.mark.django_db
def test_one_decision_releases_one_and_rejects_the_rest(agent, approver):
    first = refund(agent, "r1")
    second, third = refund(agent, "r2"), refund(agent, "r3")
    assert {status(a) for a in (first, second, third)} == {S.HELD}  # the first had not started: held with them
    item = ReviewItem.objects.get(action=second, status=ReviewStatus.OPEN)
    assert [m.action_id for m in held_group(item)] == [first.pk, second.pk, third.pk]

    held_group_decide(item, user=approver, release=third.pk, reason="the newest one has the right amount")

    assert (status(first), status(second), status(third)) == (S.REJECTED, S.REJECTED, S.QUEUED)
    assert not ReviewItem.objects.filter(kind=ReviewKind.HELD, status=ReviewStatus.OPEN).exists()


@pytest.mark.django_db(transaction=True)
def test_two_people_deciding_one_group_at_once_make_one_decision_without_a_deadlock(agent, monkeypatch):
    """Alice releases r2 (decided first), Bob rejects them all (r1 first). Each took its first
    member's locks before the other's: a deadlock, which the loser's page called a database
    outage. The group's rows are now locked in one order before anything is decided."""
    first, second = refund(agent, "r1"), refund(agent, "r2")
    item = ReviewItem.objects.get(action=first, status=ReviewStatus.OPEN)
    alice, bob = (get_user_model().objects.create_superuser(name, password=None) for name in ("alice", "bob"))
    both_decided_one = threading.Barrier(2, timeout=3)  # reached by both only while they can deadlock
    decide, paced = decisions.review_decide, threading.local()

    def decide_then_wait(*args, **kwargs):
        decided = decide(*args, **kwargs)
        if not getattr(paced, "waited", False):
            paced.waited = True
            with contextlib.suppress(threading.BrokenBarrierError):
                both_decided_one.wait()
        return decided

    monkeypatch.setattr(decisions, "review_decide", decide_then_wait)

    def group_decide(user, release):
        try:
            return held_group_decide(item, user=user, release=release, reason="duplicates")
        except DecisionRefused as refused:
            return refused
        finally:
            connection.close()

    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(group_decide, (alice, bob), (second.pk, None)))
    assert sorted(type(a).__name__ for a in answers) == ["AlreadyDecided", "list"]
    assert not ReviewItem.objects.filter(kind=ReviewKind.HELD, status=ReviewStatus.OPEN).exists()
    assert {status(first), status(second)} in ({S.REJECTED}, {S.REJECTED, S.QUEUED})


@pytest.mark.django_db
def test_reject_all_rejects_all_and_a_reason_is_required(agent, approver):
    first, second = refund(agent, "r1"), refund(agent, "r2")
    item = ReviewItem.objects.get(action=first, status=ReviewStatus.OPEN)
    with pytest.raises(DecisionRefused):
        held_group_decide(item, user=approver, release=None, reason="  ")
    held_group_decide(item, user=approver, release=None, reason="duplicates of one refund")
    assert (status(first), status(second)) == (S.REJECTED, S.REJECTED)


def test_two_requests_for_one_order_close_together_end_with_exactly_one_effect(stack, client):
    """The replay case: both held, one decision on the page, exactly one refund at the provider."""
    api = agent_api(stack.url, "billing")
    for key, decision in (("refund:ORD-77:a", "dec-a"), ("refund:ORD-77:b", "dec-b")):
        assert api.post("/api/v1/actions", headers={"Idempotency-Key": key},
                        json=refund_body("ORD-77", customer="", decision=decision)).status_code == 201
    first, second = Action.objects.order_by("id")
    assert {status(first), status(second)} == {S.HELD}
    approver = get_user_model().objects.create_superuser("alice", password=None)
    client.force_login(approver)
    item = ReviewItem.objects.get(action=first, status=ReviewStatus.OPEN)
    page = client.get(f"/review/{item.pk}/").content.decode()
    assert 'id="group-form"' in page

    client.post(f"/review/{item.pk}/group", {"release": first.pk, "reason": "one refund for this order",
                                             "members": seen_on(page, "members"),
                                             f"fingerprint_{first.pk}": seen_on(page, f"fingerprint_{first.pk}"),
                                             f"in_flight_{first.pk}": seen_on(page, f"in_flight_{first.pk}")})
    stack.start_worker()

    wait_until(lambda: status(first) == S.SUCCEEDED, message="the released refund to succeed")
    assert status(second) == S.REJECTED
    assert len(sandbox_list(api, "refunds", order_id="ORD-77")) == 1


@pytest.mark.django_db
@pytest.mark.parametrize("release", ["abc", "²", "-1", "1.0", "1" * 5000, str(2**63)])
def test_a_malformed_release_decides_nothing(agent, approver, client, release):
    first, second = refund(agent, "r1"), refund(agent, "r2")
    item = ReviewItem.objects.get(action=first, status=ReviewStatus.OPEN)
    client.force_login(approver)
    answer = client.post(f"/review/{item.pk}/group", {"release": release, "reason": "a typo"})
    assert answer.status_code == 303  # back to the item, with the refusal said there
    assert (status(first), status(second)) == (S.HELD, S.HELD)
    assert ReviewItem.objects.filter(kind=ReviewKind.HELD, status=ReviewStatus.OPEN).count() == 2


@pytest.mark.django_db
@pytest.mark.parametrize("posted, said", [
    ({}, "the page did not say which parameters you saw"),
    ({"fingerprint": "abc"}, "print of the parameters you saw is not one: reload it"),
])
def test_a_release_without_the_print_of_the_params_seen_decides_nothing(agent, approver, client, posted, said):
    first, second = refund(agent, "r1"), refund(agent, "r2")
    item = ReviewItem.objects.get(action=first, status=ReviewStatus.OPEN)
    client.force_login(approver)
    form = {"release": first.pk, "reason": "go", "members": f"{first.pk},{second.pk}"}
    if posted:
        form[f"fingerprint_{first.pk}"] = posted["fingerprint"]
    answer = client.post(f"/review/{item.pk}/group", form, follow=True)
    assert "Not done: " in answer.content.decode() and said in answer.content.decode()
    assert (status(first), status(second)) == (S.HELD, S.HELD)
    assert ReviewItem.objects.filter(kind=ReviewKind.HELD, status=ReviewStatus.OPEN).count() == 2


@pytest.mark.django_db
def test_the_group_form_chooses_nothing_for_the_person_and_a_post_without_a_choice_decides_nothing(
        agent, approver, client):
    first, second = refund(agent, "r1"), refund(agent, "r2")
    item = ReviewItem.objects.get(action=first, status=ReviewStatus.OPEN)
    client.force_login(approver)
    page = client.get(f"/review/{item.pk}/").content.decode()
    form = page[page.index('id="group-form"'):page.index("</form>", page.index('id="group-form"'))]
    assert form.count('name="release"') == 3 and " checked" not in form and "required" in form

    answer = client.post(f"/review/{item.pk}/group", {"reason": "no choice made"}, follow=True)
    assert "Not done: choose the one to release, or reject them all" in answer.content.decode()
    assert (status(first), status(second)) == (S.HELD, S.HELD)
    client.post(f"/review/{item.pk}/group", {"release": "none", "reason": "duplicates",
                                             "members": seen_on(page, "members")})
    assert (status(first), status(second)) == (S.REJECTED, S.REJECTED)


@pytest.mark.django_db
def test_two_single_releases_of_one_group_from_two_pages_let_one_go(agent, approver, client):
    """Bob opens r2's page while r1 is held with it; Alice then releases r1 from its own page.
    Bob's release of r2, from the page that showed r1 held, would put two refunds for one order
    in flight, each let go by a person who did not see the other in flight: refused."""
    first, second = refund(agent, "r1"), refund(agent, "r2")
    one, two = (ReviewItem.objects.get(action=a, status=ReviewStatus.OPEN) for a in (first, second))
    bob = get_user_model().objects.create_superuser("bob", password=None)
    client.force_login(bob)
    bobs = opened(client, two)
    assert first.operation_key in bobs["page"]  # shown held with it

    client.force_login(approver)
    assert "released" in release_from(client, one, opened(client, one)).content.decode()
    assert (status(first), status(second)) == (S.QUEUED, S.HELD)

    client.force_login(bob)
    answer = release_from(client, two, bobs)
    assert f"Not done: {IN_FLIGHT_CHANGED}" in answer.content.decode()
    assert (status(first), status(second)) == (S.QUEUED, S.HELD)
    assert ReviewItem.objects.get(pk=two.pk).status == ReviewStatus.OPEN and not audit_events(second, "released")


@pytest.mark.django_db
def test_a_release_is_bound_to_what_was_in_flight_near_it_and_taken_on_the_print_now(agent, approver):
    first, second = refund(agent, "r1"), refund(agent, "r2")
    one, two = (ReviewItem.objects.get(action=a, status=ReviewStatus.OPEN) for a in (first, second))
    seen = print_near(second)
    review_decide(one, user=approver, decision="release", reason="the first one", in_flight=print_near(first))

    with pytest.raises(DecisionRefused, match=IN_FLIGHT_CHANGED):
        review_decide(two, user=approver, decision="release", reason="the second one", in_flight=seen)
    assert status(second) == S.HELD
    # Looked at again (r1 queued now, shown), it is the person's to let go.
    review_decide(two, user=approver, decision="release", reason="both, knowingly", in_flight=print_near(second))
    assert (status(first), status(second)) == (S.QUEUED, S.QUEUED)


@pytest.mark.django_db
def test_a_release_from_a_page_that_still_shows_what_is_in_flight_goes(agent, approver, client):
    holder = running(refund(agent, "r1"))
    held = refund(agent, "r2")
    item = ReviewItem.objects.get(action=held, status=ReviewStatus.OPEN)
    client.force_login(approver)
    form = opened(client, item)
    assert form["in_flight"] == print_near(held)

    assert "released" in release_from(client, item, form).content.decode()
    assert (status(holder), status(held)) == (S.PENDING, S.QUEUED)


@pytest.mark.django_db
def test_a_release_from_a_page_opened_before_what_held_it_was_retried_is_refused(agent, approver, client):
    """A failure that may be retried keeps what it held. Its retry, after the page was opened,
    is in flight again (it goes before what it held): the page's release would let them both go."""
    failed = running(refund(agent, "r1"))
    held = refund(agent, "r2")
    failed.mark_failed(actor="system:executor", code="timeout", message="x", retryable=True, claim=failed.fence)
    item = ReviewItem.objects.get(action=held, status=ReviewStatus.OPEN)
    client.force_login(approver)
    form = opened(client, item)  # nothing in flight on the order: r1 has failed

    action_retry(Action.objects.get(pk=failed.pk), actor="system:runner", reason="the next attempt")
    assert status(failed) == S.QUEUED
    assert f"Not done: {IN_FLIGHT_CHANGED}" in release_from(client, item, form).content.decode()
    assert status(held) == S.HELD


@pytest.mark.django_db
def test_the_group_form_with_a_stale_print_of_what_is_in_flight_decides_nothing(agent, approver, client):
    """Alice opens r1's page (its group form); Bob releases r3 from r3's own page meanwhile.
    The group form, releasing r2 and rejecting the rest on what it showed, decides nothing: the
    group it showed is not the group now (r3 left it), and what is in flight near r2 changed."""
    first, second, third = refund(agent, "r1"), refund(agent, "r2"), refund(agent, "r3")
    item, last = (ReviewItem.objects.get(action=a, status=ReviewStatus.OPEN) for a in (first, third))
    client.force_login(approver)
    page = client.get(f"/review/{item.pk}/").content.decode()
    bob = get_user_model().objects.create_superuser("bob", password=None)
    review_decide(last, user=bob, decision="release", reason="the newest", in_flight=print_near(third))

    answer = client.post(f"/review/{item.pk}/group", {
        "release": second.pk, "reason": "the middle one", f"fingerprint_{second.pk}": second.params_fingerprint(),
        "members": seen_on(page, "members"),
        f"in_flight_{second.pk}": seen_on(page, f"in_flight_{second.pk}")}, follow=True)
    assert f"Not done: {GROUP_CHANGED}" in answer.content.decode()
    # Posted with the group as it is now, the print still refuses it.
    answer = client.post(f"/review/{item.pk}/group", {
        "release": second.pk, "reason": "the middle one", f"fingerprint_{second.pk}": second.params_fingerprint(),
        "members": f"{first.pk},{second.pk}",
        f"in_flight_{second.pk}": seen_on(page, f"in_flight_{second.pk}")}, follow=True)
    assert f"Not done: {IN_FLIGHT_CHANGED}" in answer.content.decode()
    assert (status(first), status(second), status(third)) == (S.HELD, S.HELD, S.QUEUED)
    assert ReviewItem.objects.filter(kind=ReviewKind.HELD, status=ReviewStatus.OPEN).count() == 2


@pytest.mark.django_db
@pytest.mark.parametrize("posted, said", [
    (None, "the page did not say what you saw in flight on its order or customer"),
    ("abc", "print of what is in flight on its order or customer is not one: reload it"),
    ("G" * 64, "print of what is in flight on its order or customer is not one: reload it"),
    ("a" * 5000, "print of what is in flight on its order or customer is not one: reload it"),
])
@pytest.mark.parametrize("form", ["item", "group"])
def test_a_release_without_a_print_of_what_was_in_flight_decides_nothing(agent, approver, client, form, posted,
                                                                         said):
    first, second = refund(agent, "r1"), refund(agent, "r2")
    item = ReviewItem.objects.get(action=first, status=ReviewStatus.OPEN)
    client.force_login(approver)
    if form == "item":
        url, data, field = f"/review/{item.pk}/decide", {"decision": "release"}, "in_flight"
    else:
        url, data, field = f"/review/{item.pk}/group", {"release": first.pk}, f"in_flight_{first.pk}"
    data.update({"reason": "go", "fingerprint": first.params_fingerprint(), "members": f"{first.pk},{second.pk}",
                 f"fingerprint_{first.pk}": first.params_fingerprint()})
    if posted is not None:
        data[field] = posted
    answer = client.post(url, data)
    assert answer.status_code == 303  # back to the item, with the refusal said there
    said_there = client.get(answer["Location"]).content.decode()
    assert "Not done: " in said_there and said in said_there
    assert (status(first), status(second)) == (S.HELD, S.HELD)
    assert ReviewItem.objects.filter(kind=ReviewKind.HELD, status=ReviewStatus.OPEN).count() == 2


@pytest.mark.django_db(transaction=True)
def test_two_releases_of_one_group_at_once_take_turns_and_let_one_go(agent, monkeypatch):
    """Alice releases r1 and Bob r2 at the same moment, each from a page that showed the other
    held. Under their own rows' locks alone each would read the other still held and both would
    go; under the order's locks, taken first, the second reads the first released and is refused.
    (Two agents': a decision's lock of its action's row takes its agent's row too.)"""
    first, second = refund(agent, "r1"), refund(make_agent("support")[0], "r2")
    items = [ReviewItem.objects.get(action=a, status=ReviewStatus.OPEN) for a in (first, second)]
    seen = [print_near(first), print_near(second)]
    alice, bob = (get_user_model().objects.create_superuser(name, password=None) for name in ("alice", "bob"))
    both_looked = threading.Barrier(2, timeout=3)  # reached by both only if neither waits for the other
    look = decisions.in_flight_print

    def look_then_wait(near):
        print_ = look(near)
        with contextlib.suppress(threading.BrokenBarrierError):
            both_looked.wait()
        return print_

    monkeypatch.setattr(decisions, "in_flight_print", look_then_wait)

    def release(user, item, print_):
        try:
            return review_decide(item, user=user, decision="release", reason="the one", in_flight=print_)
        except DecisionRefused as refused:
            return refused
        finally:
            connection.close()

    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(release, (alice, bob), items, seen))
    assert sorted(type(a).__name__ for a in answers) == ["DecisionRefused", "ReviewItem"]
    assert IN_FLIGHT_CHANGED in str(next(a for a in answers if isinstance(a, DecisionRefused)))
    assert sorted([status(first), status(second)]) == sorted([S.QUEUED, S.HELD])


@pytest.mark.django_db
def test_a_release_stands_when_what_the_page_showed_in_flight_only_moved_on(agent, approver):
    """The page showed r1 in flight (its call under way) when r2's was opened; the call timed out
    since (r1 unknown, verified later): still in flight, as the person saw it, so their release of
    r2 is taken. Only what is held, or in flight at all, binds the release; a status that moves on
    by itself would send every person on a busy order back to the page."""
    first = running(refund(agent, "r1"))
    second = refund(agent, "r2")
    item = ReviewItem.objects.get(action=second, status=ReviewStatus.OPEN)
    on_the_page = print_near(second)
    first.mark_unknown(actor="system:executor", claim=first.fence, evidence={"timeout": True},
                       verify_at=first.lease_expires_at)
    assert status(first) == S.UNKNOWN
    review_decide(item, user=approver, decision="release", reason="knowingly", in_flight=on_the_page)
    assert status(second) == S.QUEUED


@pytest.mark.django_db(transaction=True)
def test_a_group_decision_and_a_request_on_its_order_at_once_take_turns_without_a_deadlock(agent, approver,
                                                                                            monkeypatch):
    """A group's decision and a request for the same order at the same moment. The decision takes
    the order's locks before its members' rows, as the intake does: the request, in between, goes
    first, and the decision after it finds it. (Taken after the rows, the decision held a member's row and
    waited for the order's locks, while the request held those and waited for the row: a deadlock.)"""
    first, second = refund(agent, "r1"), refund(agent, "r2")
    item = ReviewItem.objects.get(action=second, status=ReviewStatus.OPEN)
    on_the_page = print_near(second)
    about_to_lock, requested = threading.Event(), threading.Event()
    lock = decisions.action_lock_subjects

    def the_request_comes_now(member):
        if not about_to_lock.is_set():
            about_to_lock.set()
            requested.wait(3)  # the request runs whole, unless it waits for this decision's locks
        return lock(member)

    monkeypatch.setattr(decisions, "action_lock_subjects", the_request_comes_now)

    def group_decision():
        try:
            return held_group_decide(item, user=approver, release=second.pk, reason="the second",
                                     in_flight=on_the_page)
        finally:
            connection.close()

    def request():
        try:
            assert about_to_lock.wait(20)
            return refund(agent, "r3")
        finally:
            requested.set()
            connection.close()

    with ThreadPoolExecutor(2) as pool:
        decided, third = pool.submit(group_decision), pool.submit(request)
        third = third.result()
        # r3 came first, held with the group: what is in flight near r2 is not what the page
        # showed, and the decision, after the request, is refused; nothing is decided unseen.
        with pytest.raises(DecisionRefused, match=IN_FLIGHT_CHANGED):
            decided.result()
    assert (status(first), status(second), status(third)) == (S.HELD, S.HELD, S.HELD)


@pytest.mark.django_db
@pytest.mark.parametrize("release", ["r1", "none"])
def test_a_group_grown_since_its_page_was_opened_is_not_decided(agent, approver, client, release):
    """The page showed r1 and r2; r3 arrived for the order since. "Release r1, reject the rest" (or
    "reject all") would reject r3, which nobody saw: refused, and nothing is decided."""
    first, second = refund(agent, "r1"), refund(agent, "r2")
    item = ReviewItem.objects.get(action=first, status=ReviewStatus.OPEN)
    client.force_login(approver)
    page = client.get(f"/review/{item.pk}/").content.decode()
    assert seen_on(page, "members") == f"{first.pk},{second.pk}"
    third = refund(agent, "r3")
    form = {"release": first.pk if release == "r1" else "none", "reason": "one of them",
            "members": seen_on(page, "members"), f"fingerprint_{first.pk}": seen_on(page, f"fingerprint_{first.pk}"),
            f"in_flight_{first.pk}": seen_on(page, f"in_flight_{first.pk}")}
    answer = client.post(f"/review/{item.pk}/group", form, follow=True)
    assert f"Not done: {GROUP_CHANGED}" in answer.content.decode()
    assert {status(first), status(second), status(third)} == {S.HELD}


@pytest.mark.django_db
@pytest.mark.parametrize("members", [None, "", "1,x", "1" * 5000, ","])
def test_a_group_decision_without_the_members_the_page_showed_decides_nothing(agent, approver, client, members):
    first, second = refund(agent, "r1"), refund(agent, "r2")
    item = ReviewItem.objects.get(action=first, status=ReviewStatus.OPEN)
    client.force_login(approver)
    form = {"release": "none", "reason": "duplicates", **({"members": members} if members is not None else {})}
    answer = client.post(f"/review/{item.pk}/group", form, follow=True)
    assert "Not done: the page did not say which actions the group held" in answer.content.decode()
    assert (status(first), status(second)) == (S.HELD, S.HELD)


@pytest.mark.django_db
def test_the_retry_of_a_failure_goes_before_what_it_held_which_runs_once_it_succeeds(agent):
    """r2 waits behind r1; r1 fails, may be retried, and keeps r2 held. Its retry goes on (it
    used to be held behind r2, and both waited for a person), r2 still waiting behind it; once
    the retry succeeds, r2 is released as it would have been after a first attempt that did."""
    first = running(refund(agent, "r1"))
    second = refund(agent, "r2")
    first.mark_failed(actor="system:executor", code="timeout", message="x", retryable=True, claim=first.fence)
    assert status(second) == S.HELD
    retried = action_retry(Action.objects.get(pk=first.pk), actor="system:runner", reason="the next attempt")
    assert (retried.status, status(second)) == (S.QUEUED, S.HELD)
    again = running(first)
    again.mark_succeeded(actor="system:executor", external_ref="re_1", claim=again.fence)
    assert status(second) == S.QUEUED


def test_a_held_action_released_by_the_system_is_judged_on_the_params_it_would_send(agent):
    """Its params changed behind the ledger's back while it was held (a raw UPDATE, a bug): the
    release after the action that held it settled asked the limits of the amount column, and sent
    7,500 EUR that nobody approved. It is judged on its params now, as a person's release is."""
    Limit.limit_set(actor="system:tests", reason="the tests' policy", action_type="refund", currency="EUR",
                    max_amount=Decimal("500.00"), dual_approval_above=Decimal("5000.00"))
    first = running(refund(agent, "r1"))
    held = refund(agent, "r2")
    assert status(held) == S.HELD
    Action.objects.filter(pk=held.pk).update(params={"amount": "7500.00", "currency": "EUR"})
    first.mark_succeeded(actor="system:executor", claim=first.fence, external_ref="re_1")

    assert status(held) == S.AWAITING_APPROVAL
    assert ReviewItem.objects.get(action=held, status="open").approvals_needed == 2
