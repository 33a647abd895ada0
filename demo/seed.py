"""Demo data for development: `seed_demo` (a management command).

Everything here goes through the product's own functions (`agent_create`, `action_request`,
`task_request`, `review_decide`, `Limit.limit_set`, the dead-letter queue's redrive and
discard), so each change is audited exactly as in real use, and every state an action or a
task shows was reached the way a worker reaches it: actions by the guarded executor
(`action_claim_next` + `action_run_claimed`, verification included), tasks by the runner
(a claim + `task_run`), lapsed leases by the sweeper's `action_expire_leases`.

The one stand-in is the provider: the seed runs before the web app (and its sandbox
provider) is up, so `demo.connector.demo_provider` serves every action type in this process,
committing into the sandbox's tables with the sandbox's own save, and its script makes calls
fail where the demo shows a failure.
"""

from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from approvals.decisions import review_decide, review_edit
from approvals.models import Limit, ReviewItem, ReviewStatus
from approvals.reviews import approval_expire_due
from dlq.entries import deadletter_discard, deadletter_redrive
from dlq.models import DeadLetter, EntryStatus
from dlq.overdue import review_alert_overdue
from ledger.access import ROLES
from ledger.actions import action_request
from ledger.agents import agent_create
from ledger.connectors import connector_for
from ledger.executor import action_claim_next, action_expire_leases, action_run_claimed
from ledger.grants import REVIEW_DAYS
from ledger.models import Action, ActionStatus, ActionType, Agent, AuditEvent, Grant, GrantState, Task, TaskState
from ledger.roles import roles_setup
from ledger.runner import task_run
from ledger.tasks import task_claim_next, task_request, task_run_now
from sandbox.models import SandboxOrder, SandboxRefund

from .connector import (
    CANNOT_TELL,
    DECLINE,
    NOT_SENT,
    ORDER_UNAVAILABLE,
    ORDER_UNREACHABLE,
    TIMEOUT_AFTER_COMMIT,
    TIMEOUT_BEFORE_COMMIT,
    demo_provider,
)

S = ActionStatus
SEED_ACTOR = "system:seed_demo"
WORKER = "demo-worker-1:4242"


# --- Demo people, agents, limits --------------------------------------------------------------

DEMO_PASSWORD = "demo"
DEMO_USERS = (  # username, group, full name
    ("alice", "approvers", "Alice Approver"),
    ("bob", "approvers", "Bob Approver"),
    ("olga", "operators", "Olga Operator"),
    ("aldo", "auditors", "Aldo Auditor"),
    ("ada", "admins", "Ada Admin"),
)
DEMO_AGENTS = (  # name, owner, grants (an action type and/or workflow of that name)
    ("billing-bot", "olga", ("refund", "send_message", "create_booking")),
    ("support-bot", "bob", ("send_message", "create_booking")),
)


def demo_users_existing():
    names = [u for u, _, _ in DEMO_USERS]
    return list(get_user_model().objects.filter(username__in=names).prefetch_related("groups").order_by("username"))


def _create_user(username, group, full_name):
    first, last = full_name.split(" ", 1)
    user = get_user_model().objects.create_user(
        username=username, password=DEMO_PASSWORD, email=f"{username}@surety.example",
        first_name=first, last_name=last, is_staff=(group == "admins"),
    )
    user.groups.add(Group.objects.get(name=group))
    AuditEvent.objects.record(actor=SEED_ACTOR, verb="user_created", obj=user,
                              after={"username": username, "group": group, "is_staff": user.is_staff})
    return user


# --- A worker's moves, made by the product's own functions ------------------------------------


def execute(action):
    """One pass of the guarded executor over this action, as a worker makes it: an attempt
    if it is queued, a verification at the provider if its outcome is unknown."""
    claimed = action_claim_next(WORKER, only=action.pk)
    if claimed is None:
        raise RuntimeError(f"{action} is not due; the demo expected to run it now")
    action_run_claimed(claimed)
    # A call that timed out after the provider committed: the commit, once the call is over.
    connector_for(action.action_type).script.unanswered_saved()
    return Action.objects.get(pk=action.pk)


def time_passes(action, seconds):
    """Demo only: the seed cannot wait for a verification delay, a backoff or a lease to run
    out, so it moves the action's times back by `seconds`, as if that much time had passed.
    A plain update of those two times (nothing moved, so nothing is audited); the next
    worker's move, made by the product's functions, overwrites them."""
    delta = timedelta(seconds=seconds)
    Action.objects.filter(pk=action.pk).update(next_attempt_at=F("next_attempt_at") - delta,
                                               lease_expires_at=F("lease_expires_at") - delta)


def asked_earlier(items, by):
    """Demo only: as `time_passes` for actions, review items as if opened `by` earlier (a
    timedelta): their opening, deadline and expiry moved back by a plain update (not audited),
    so that the sweeper's steps, run for real, find them overdue or expired. Their actions keep
    the time they were requested."""
    items.update(created_at=F("created_at") - by, deadline=F("deadline") - by, expires_at=F("expires_at") - by)


def task_attempt(task):
    """One run of the runner on this task, claimed as a worker claims it (only this task:
    the database may hold other due work)."""
    task_run(task_claim_next(WORKER, only=task.pk))
    return Task.objects.get(pk=task.pk)


def task_dead_letter(task):
    """Attempt after attempt, each failing as the script says, until the runner sends the
    task to the dead-letter queue (its entry and alert come with it). Backoffs are skipped:
    the task's by an audited `task_run_now`, those of its actions by `time_passes`."""
    task = task_attempt(task)
    while task.state != TaskState.DEAD_LETTERED:
        for action in task.actions.filter(status=S.QUEUED):
            time_passes(action, settings.BACKOFF_MAX_SECONDS)
        task_run_now(task, actor=SEED_ACTOR, reason="demo: the next attempt now rather than after its backoff")
        task = task_attempt(task)
    return DeadLetter.objects.get(task=task, status=EntryStatus.OPEN)


# --- The demo ----------------------------------------------------------------------------------

ORDERS = [  # order id, customer, amount, currency
    ("ORD-10001", "CUST-1001", "49.90", "EUR"), ("ORD-10002", "CUST-1002", "129.00", "EUR"),
    ("ORD-10003", "CUST-1003", "310.50", "EUR"), ("ORD-10004", "CUST-1004", "75.00", "USD"),
    ("ORD-10005", "CUST-1005", "19.99", "EUR"), ("ORD-10006", "CUST-1006", "220.00", "USD"),
    ("ORD-10007", "CUST-1007", "450.00", "EUR"), ("ORD-10008", "CUST-1008", "88.40", "EUR"),
    ("ORD-10009", "CUST-1009", "620.00", "EUR"), ("ORD-10010", "CUST-1010", "750.00", "EUR"),
    ("ORD-10011", "CUST-1011", "7500.00", "EUR"), ("ORD-10012", "CUST-1012", "7200.00", "EUR"),
    ("ORD-10013", "CUST-1013", "1250.00", "EUR"), ("ORD-10014", "CUST-1014", "980.00", "EUR"),
    ("ORD-10015", "CUST-1015", "145.00", "EUR"), ("ORD-10016", "CUST-1016", "64.00", "EUR"),
    ("ORD-10017", "CUST-1017", "399.00", "EUR"), ("ORD-10018", "CUST-1018", "230.00", "EUR"),
    ("ORD-10019", "CUST-1019", "99.00", "EUR"), ("ORD-10020", "CUST-1020", "310.00", "EUR"),
    ("ORD-10021", "CUST-1021", "180.00", "EUR"), ("ORD-10022", "CUST-1022", "260.00", "EUR"),
    ("ORD-10023", "CUST-1023", "35.00", "EUR"), ("ORD-10024", "CUST-1024", "900.00", "EUR"),
    ("ORD-10025", "CUST-1025", "120.00", "USD"), ("ORD-10026", "CUST-1026", "58.00", "EUR"),
    # CUST-2040 asks again and again today: the daily total (2000.00 EUR) catches the last one.
    ("ORD-10030", "CUST-2040", "480.00", "EUR"), ("ORD-10031", "CUST-2040", "495.00", "EUR"),
    ("ORD-10032", "CUST-2040", "470.00", "EUR"), ("ORD-10033", "CUST-2040", "460.00", "EUR"),
    ("ORD-10034", "CUST-2040", "310.00", "EUR"),
    # Tasks.
    ("ORD-10041", "CUST-1041", "42.00", "EUR"), ("ORD-10042", "CUST-1042", "118.00", "EUR"),
    ("ORD-10043", "CUST-1043", "860.00", "EUR"), ("ORD-10044", "CUST-1044", "76.00", "EUR"),
    ("ORD-10045", "CUST-1045", "215.00", "EUR"), ("ORD-10046", "CUST-1046", "33.50", "EUR"),
    ("ORD-10047", "CUST-1047", "140.00", "EUR"), ("ORD-10048", "CUST-1048", "95.00", "EUR"),
    ("ORD-10050", "CUST-1050", "27.00", "EUR"), ("ORD-10051", "CUST-1051", "640.00", "USD"),
    ("ORD-10052", "CUST-1052", "780.00", "EUR"),
]
# A task's order the provider does not know (never created in the sandbox).
UNKNOWN_ORDER = SandboxOrder(order_id="ORD-10049", customer="CUST-1049", amount=Decimal("61.00"), currency="EUR")


@dataclass
class Demo:
    users: dict
    agents: dict
    tokens: dict


def _refund(agent, key, order, amount=None, *, decision, reason="", shadow=False):
    params = {"amount": amount or str(order.amount), "currency": order.currency}
    if reason:
        params["reason"] = reason
    action, _ = action_request(
        agent=agent, operation_key=key, action_type=ActionType.REFUND, target=order.order_id,
        customer=order.customer, params=params, decision_id=decision, shadow=shadow,
    )
    return action


def _message(agent, key, recipient, message_type, body, *, decision, customer=""):
    action, _ = action_request(
        agent=agent, operation_key=key, action_type=ActionType.SEND_MESSAGE, target=recipient, customer=customer,
        params={"channel": "email", "message_type": message_type, "body": body}, decision_id=decision,
    )
    return action


def _booking(agent, key, resource, customer, service, start, hours, *, decision):
    start = start.replace(minute=0, second=0, microsecond=0)
    params = {"service": service, "start": start.isoformat(), "end": (start + timedelta(hours=hours)).isoformat()}
    action, _ = action_request(
        agent=agent, operation_key=key, action_type=ActionType.CREATE_BOOKING, target=resource, customer=customer,
        params=params, decision_id=decision,
    )
    return action


def refund_task(agent, n, order, *, reason=""):
    input_ = {"order_id": order.order_id, "amount": str(order.amount), "currency": order.currency,
              "customer": order.customer}
    if reason:
        input_["reason"] = reason
    task, _ = task_request(agent=agent, task_id=f"refund-{order.order_id.removeprefix('ORD-')}-{n}",
                           workflow="refund", input=input_)
    return task


def _item(action):
    return ReviewItem.objects.get(action=action, status=ReviewStatus.OPEN)


def seed_demo():
    """Build the whole demo in one transaction. Returns a Demo (users, agents, tokens)."""
    with transaction.atomic():
        roles_setup()
        users = {username: _create_user(username, group, name) for username, group, name in DEMO_USERS}
        ada = users["ada"]
        agents, tokens = {}, {}
        for name, owner, grants in DEMO_AGENTS:
            # Made by the seed, whose tokens go to whoever runs it, not to ada: four eyes would keep
            # the person shown a token from deciding its agent's requests.
            agent, token = agent_create(name, actor=SEED_ACTOR, grants=grants, owner=users[owner])
            agents[name], tokens[name] = agent, token

        Limit.limit_set(actor=ada, action_type=ActionType.REFUND, currency="EUR", max_amount=Decimal("500.00"),
                        dual_approval_above=Decimal("5000.00"), daily_customer_total=Decimal("2000.00"),
                        review_deadline_hours=4, reason="demo policy: refunds over 500 EUR need an approver")
        Limit.limit_set(actor=ada, action_type=ActionType.REFUND, currency="USD", max_amount=Decimal("500.00"),
                        review_deadline_hours=4, approval_expires_after_hours=48,
                        reason="demo policy: refunds over 500 USD need an approver within two days")

        orders = {}
        for order_id, customer, amount, currency in ORDERS:
            orders[order_id], _ = SandboxOrder.objects.get_or_create(
                order_id=order_id, defaults={"customer": customer, "amount": Decimal(amount), "currency": currency})
        # shadow: asked under a grant nobody has made live yet (recorded, never executed).
        _refund(agents["billing-bot"], "refund:ORD-10020:full:dec-400", orders["ORD-10020"], decision="dec-400",
                shadow=True)
        for agent in agents.values():
            _grants_live_for_the_demo(agent, by=ada)
        with demo_provider() as script:
            _seed_actions(users, agents, orders, script)
            _seed_tasks(users, agents, orders, script)
        _seed_overdue()
    return Demo(users=users, agents=agents, tokens=tokens)


def _grants_live_for_the_demo(agent, *, by):
    """Demo only: the history below was made under live grants (the executor cancels a queued
    action whose grant is not live), but no replay run can pass before the web app and its
    sandbox are up. So the seed writes the demo agents' grants live, bound to no connector,
    audited as what it is; once the stack is up, `promote_demo_grants` (demo.grants) has a demo
    person promote each of them for real, bound to its connector once that passed the replay set."""
    now = timezone.now()
    for grant in Grant.objects.filter(agent=agent).select_related("capability"):
        grant.live_until, grant.promoted_by, grant.promoted_at = now + timedelta(days=REVIEW_DAYS), by, now
        grant.save(update_fields=["live_until", "promoted_by", "promoted_at"])
        AuditEvent.objects.record(
            actor=SEED_ACTOR, verb="promoted", obj=agent, before={"capability": str(grant.capability),
                                                                 "state": GrantState.SHADOW},
            after={"capability": str(grant.capability), "state": GrantState.LIVE, "live_until": grant.live_until},
            reason="demo data: written live by the seed, before any replay run could pass")
    Agent.objects.filter(pk=agent.pk).update(grants_version=F("grants_version") + 1)
    agent.refresh_from_db(fields=["grants_version"])


def _seed_actions(users, agents, orders, script):
    billing, support = agents["billing-bot"], agents["support-bot"]
    alice, bob = users["alice"], users["bob"]
    o = orders.get

    # succeeded: refunds, messages, bookings that went straight through.
    for n, order_id in enumerate(("ORD-10001", "ORD-10002", "ORD-10003", "ORD-10004", "ORD-10006", "ORD-10008",
                                  "ORD-10015", "ORD-10016"), start=101):
        execute(_refund(billing, f"refund:{order_id}:full:dec-{n}", o(order_id), decision=f"dec-{n}"))
    for n, customer in enumerate(("CUST-1001", "CUST-1002", "CUST-1004", "CUST-1006"), start=201):
        execute(_message(
            support, f"message:{customer}:refund_confirmation:dec-{n}", f"{customer.lower()}@customers.surety.example",
            "refund_confirmation", "Your refund is on its way; it shows on your statement within 5 days.",
            decision=f"dec-{n}", customer=customer))
    tomorrow = timezone.now() + timedelta(days=1)
    for n, (resource, customer, service, hour) in enumerate(
            (("room-3", "CUST-1005", "consultation", 9), ("room-3", "CUST-1008", "consultation", 11),
             ("stylist-2", "CUST-1016", "haircut", 14)), start=301):
        start = tomorrow.replace(hour=hour)
        execute(_booking(support, f"booking:{customer}:{service}:{start:%Y%m%dT%H}", resource, customer,
                         service, start, 1, decision=f"dec-{n}"))

    # queued: one just requested, one waiting out a backoff after the provider was unreachable.
    _refund(billing, "refund:ORD-10005:full:dec-401", o("ORD-10005"), decision="dec-401")
    script.arm("ORD-10019", NOT_SENT)
    execute(_refund(billing, "refund:ORD-10019:full:dec-402", o("ORD-10019"), decision="dec-402"))
    # pending: claimed by a worker, call in flight (the sweeper takes it over if the worker is gone).
    action_claim_next(WORKER, only=_refund(billing, "refund:ORD-10017:full:dec-403", o("ORD-10017"),
                                           decision="dec-403").pk)
    # unknown: the call timed out after the provider committed; verification is due shortly.
    script.arm("ORD-10018", TIMEOUT_AFTER_COMMIT)
    execute(_refund(billing, "refund:ORD-10018:full:dec-404", o("ORD-10018"), decision="dec-404"))
    # needs_review (1): the worker vanished mid-call; the sweeper turned its lapsed lease into an
    # unknown outcome, and the provider could not be asked.
    lost = _refund(billing, "refund:ORD-10020:full:dec-405", o("ORD-10020"), decision="dec-405")
    action_claim_next(WORKER, only=lost.pk)
    time_passes(lost, settings.LEASE_SECONDS + settings.CONNECTOR_TIMEOUT)
    action_expire_leases()  # the sweeper's pass: it takes over every lapsed lease, as at any start
    script.arm("ORD-10020", CANNOT_TELL)
    execute(lost)
    # needs_review (2): approved over the limit, timed out, found at the provider — over the limit,
    # so a person confirms it even though verification was conclusive.
    big = _refund(billing, "refund:ORD-10024:full:dec-406", o("ORD-10024"), decision="dec-406")
    review_decide(_item(big), user=alice, decision="approve", reason="long-standing customer, damaged goods")
    script.arm("ORD-10024", TIMEOUT_AFTER_COMMIT)
    _verified(execute(big))
    # An unknown outcome a person settled as succeeded, and one settled as failed (safe to retry).
    script.arm("ORD-10022", TIMEOUT_AFTER_COMMIT)
    script.arm("ORD-10022", CANNOT_TELL)
    settled = _verified(execute(_refund(billing, "refund:ORD-10022:full:dec-407", o("ORD-10022"),
                                        decision="dec-407")))
    review_decide(_item(settled), user=alice, decision="mark_succeeded", reason="found in the provider's dashboard",
                  external_ref=SandboxRefund.objects.get(operation_key=settled.operation_key).refund_id)
    script.arm("ORD-10023", TIMEOUT_BEFORE_COMMIT)
    script.arm("ORD-10023", CANNOT_TELL)
    absent = _verified(execute(_refund(billing, "refund:ORD-10023:full:dec-408", o("ORD-10023"),
                                       decision="dec-408")))
    review_decide(_item(absent), user=bob, decision="mark_failed",
                  reason="not in the provider's export for today; safe to retry")

    # failed: declined by the provider (not retryable).
    script.arm("ORD-10025", DECLINE)
    execute(_refund(billing, "refund:ORD-10025:full:dec-409", o("ORD-10025"), decision="dec-409"))

    # awaiting_approval: over the limit; two approvers above 5000; the daily customer total.
    _refund(billing, "refund:ORD-10010:full:dec-501", o("ORD-10010"), decision="dec-501",
            reason="item arrived broken")
    _refund(billing, "refund:ORD-10011:full:dec-502", o("ORD-10011"), decision="dec-502",
            reason="event cancelled by the organiser")
    dual = _refund(billing, "refund:ORD-10012:full:dec-503", o("ORD-10012"), decision="dec-503",
                   reason="duplicate charge")
    review_decide(_item(dual), user=alice, decision="approve", reason="duplicate charge confirmed in the PSP export")
    for n, order_id in enumerate(("ORD-10030", "ORD-10031", "ORD-10032", "ORD-10033"), start=504):
        execute(_refund(billing, f"refund:{order_id}:full:dec-{n}", o(order_id), decision=f"dec-{n}"))
    _refund(billing, "refund:ORD-10034:full:dec-508", o("ORD-10034"), decision="dec-508")  # 2215 today > 2000

    # approved, then executed.
    approved = _refund(billing, "refund:ORD-10009:full:dec-509", o("ORD-10009"), decision="dec-509")
    review_decide(_item(approved), user=bob, decision="approve", reason="within goodwill budget")
    execute(approved)
    # rejected by an approver.
    rejected = _refund(billing, "refund:ORD-10013:full:dec-510", o("ORD-10013"), decision="dec-510")
    review_decide(_item(rejected), user=bob, decision="reject", reason="already refunded by bank transfer last week")

    # superseded: an approver lowered an over-limit refund instead of rejecting it; its version ran.
    edited = _refund(billing, "refund:ORD-10052:full:dec-511", o("ORD-10052"), decision="dec-511",
                     reason="two items arrived broken")
    _, version = review_edit(_item(edited), user=bob, changes={"amount": "390.00"},
                             reason="one of the two items was not broken: half the order")
    execute(version)
    # expired: over the USD limit, and nobody decided within its two days (opened that long ago,
    # it is expired by the sweeper's step).
    lapsed = _item(_refund(billing, "refund:ORD-10051:full:dec-512", o("ORD-10051"), decision="dec-512"))
    asked_earlier(ReviewItem.objects.filter(pk=lapsed.pk), lapsed.expires_at - lapsed.created_at + timedelta(minutes=5))
    approval_expire_due()

    # held: two refunds for the same order, both waiting for a person.
    _refund(billing, "refund:ORD-10021:full:dec-601", o("ORD-10021"), decision="dec-601")
    _refund(billing, "refund:ORD-10021:partial:dec-602", o("ORD-10021"), "90.00", decision="dec-602")
    # A held pair a person sorted out: the duplicate rejected, the other released and executed.
    first = _refund(billing, "refund:ORD-10014:full:dec-603", o("ORD-10014"), "480.00", decision="dec-603")
    second = _refund(billing, "refund:ORD-10014:full:dec-604", o("ORD-10014"), "480.00", decision="dec-604")
    review_decide(_item(second), user=alice, decision="reject", reason="the same decision sent twice")
    review_decide(_item(first), user=alice, decision="release", reason="the other request was a duplicate")
    execute(first)

    # cancelled: the agent withdrew a booking before it ran.
    start = (timezone.now() + timedelta(days=2)).replace(hour=10)
    _booking(support, f"booking:CUST-1026:consultation:{start:%Y%m%dT%H}", "room-1", "CUST-1026", "consultation",
             start, 1, decision="dec-701").cancel(actor=support, reason="the customer rescheduled by phone")


def _verified(action):
    """The verification of an action whose call timed out: the executor looks only once the
    provider could have answered (CONNECTOR_TIMEOUT), a wait the demo skips."""
    time_passes(action, settings.CONNECTOR_TIMEOUT)
    return execute(action)


def _seed_tasks(users, agents, orders, script):
    billing = agents["billing-bot"]
    olga = users["olga"]
    o = orders.get

    # succeeded, every step done.
    for order_id in ("ORD-10041", "ORD-10042", "ORD-10044"):
        task_attempt(refund_task(billing, 1, o(order_id), reason="late delivery"))
    # waiting: its refund is over the limit and waits for an approver.
    task_attempt(refund_task(billing, 1, o("ORD-10043"), reason="wrong size, returned"))
    # failed: not retryable (the order is unknown to the provider).
    task_attempt(refund_task(billing, 1, UNKNOWN_ORDER))

    # dead_lettered, each with its entry and alert: the order look-up fails at every attempt;
    # the refund cannot reach the provider; the customer's confirmation cannot (the refund is
    # done: a redrive resumes at notify_customer).
    script.arm("ORD-10045", ORDER_UNAVAILABLE, times=None)
    task_dead_letter(refund_task(billing, 1, o("ORD-10045")))
    script.arm("cust-1046@customers.surety.example", NOT_SENT, times=None)
    task_dead_letter(refund_task(billing, 1, o("ORD-10046")))
    script.arm("ORD-10047", NOT_SENT, times=None)
    task_dead_letter(refund_task(billing, 1, o("ORD-10047")))
    # redriven from the dead-letter queue: queued again, resumes at its checkpoint.
    script.arm("ORD-10048", ORDER_UNREACHABLE, times=None)
    entry = task_dead_letter(refund_task(billing, 1, o("ORD-10048")))
    deadletter_redrive(entry, actor=olga, reason="the sandbox provider is back up")
    # discarded: refunded by hand instead; the task is cancelled.
    script.arm("ORD-10026", ORDER_UNAVAILABLE, times=None)
    entry = task_dead_letter(refund_task(billing, 2, o("ORD-10026")))
    deadletter_discard(entry, actor=olga, reason="refunded by hand in the provider's dashboard (ticket OPS-4411)")
    # queued: the first attempt failed (provider outage), the next one is scheduled.
    script.arm("ORD-10050", ORDER_UNAVAILABLE)
    task_attempt(refund_task(billing, 1, o("ORD-10050")))


def _seed_overdue():
    # Items opened long enough ago to be past their deadlines by `late` (asked_earlier); the
    # sweeper's pass then raises each one's overdue alert through the real machinery.
    now = timezone.now()
    targets = {"ORD-10010": timedelta(hours=2), "ORD-10021": timedelta(minutes=35), "ORD-10020": timedelta(hours=5)}
    for target, late in targets.items():
        for item in ReviewItem.objects.filter(status=ReviewStatus.OPEN, action__target=target):
            asked_earlier(ReviewItem.objects.filter(pk=item.pk), item.deadline - now + late)
    review_alert_overdue()


def demo_summary(users, tokens=None):
    """Lines to print: the demo users per role, and the agents' tokens if just created."""
    lines = ["Demo users (password: demo), by role:"]
    for role in ROLES:
        names = [u.username for u in users if any(g.name == role for g in u.groups.all())]
        lines.append(f"  {role:<10} {', '.join(names) or '-'}")
    if tokens:
        lines.append("Agent tokens (shown only now; rotate on the agents page to get a new one):")
        lines.extend(f"  {name:<12} {token}" for name, token in tokens.items())
    else:
        lines.append("Agent tokens were shown when the demo was first seeded; rotate one on the agents page.")
    return lines
