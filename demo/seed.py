"""Demo data for development: `seed_demo` (a management command).

Everything here goes through the product's own functions — `agent_create`, `action_request`,
`task_request`, the state-machine methods of actions, tasks and dead-letter entries,
`review_decide`, `Limit.limit_set` — so each change is audited exactly as in real use. The
one stand-in is the provider: the seed runs before the web app (and its sandbox provider)
is up, so where a real run would call the sandbox over HTTP, the seed writes what the
sandbox would have committed straight into the sandbox's tables (`effect_save`, the
sandbox's own save) and records the outcome on the action under the claim, as the
executor does.
"""

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction
from django.utils import timezone

from approvals.decisions import review_decide
from approvals.intake import needs_person_after_verification
from approvals.models import Limit, ReviewItem, ReviewStatus
from approvals.reviews import review_alert_overdue
from dlq.entries import deadletter_discard, deadletter_redrive
from dlq.models import DeadLetter
from ledger.access import ROLES
from ledger.actions import action_request
from ledger.agents import agent_create
from ledger.connectors.base import Effect
from ledger.models import Action, ActionStatus, ActionType, AuditEvent, StepStatus
from ledger.runner import StepContext, _checkpoint, _fail
from ledger.roles import roles_setup
from ledger.tasks import task_request
from ledger.workflows import WORKFLOWS, ActionSpec, StepFailed
from sandbox.models import SandboxBooking, SandboxMessage, SandboxOrder, SandboxRefund, effect_save

S = ActionStatus
SEED_ACTOR = "system:seed_demo"
EXECUTOR = "system:executor"
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


# --- The provider stand-in and the executor's moves ------------------------------------------


def _ref(prefix):
    return f"{prefix}_demo_{secrets.token_hex(8)}"


def provider_commit(action):
    """What the sandbox provider commits for `action`: its own rows, saved by its own
    `effect_save` under the operation key as Idempotency-Key. Returns the Effect the
    connector would have returned (the sandbox's JSON body of the effect)."""
    from sandbox.views import _booking_body, _message_body, _refund_body

    p = action.params
    common = {"operation_key": action.operation_key, "idempotency_key": action.operation_key,
              "metadata": {"operation_key": action.operation_key}}
    check = None
    if action.action_type == ActionType.REFUND:
        effect, body = SandboxRefund(refund_id=_ref("re"), order_id=action.target, amount=Decimal(p["amount"]),
                                     currency=p["currency"], **common), _refund_body
    elif action.action_type == ActionType.SEND_MESSAGE:
        effect, body = SandboxMessage(message_id=_ref("msg"), recipient=action.target, channel=p["channel"],
                                      message_type=p["message_type"], body=p["body"], **common), _message_body
    else:
        effect, body = SandboxBooking(booking_id=_ref("bk"), resource=action.target, customer=action.customer,
                                      service=p["service"], start=datetime.fromisoformat(p["start"]),
                                      end=datetime.fromisoformat(p["end"]), **common), _booking_body
        check = effect.ensure_slot_free
    effect, _ = effect_save(effect, check=check)
    answer = body(effect)
    return Effect(external_ref=answer["id"], result=answer)


def _evidence(action, details):
    """The shape the executor records (`ledger.executor._evidence`)."""
    return {"at": timezone.now().isoformat(), "attempt": action.attempts, **details}


def _provider_error(error, code, message, status=None):
    return {"error": error, "code": code, "status": status, "message": message}


def _url(path):
    return f"{settings.SANDBOX_BASE_URL.rstrip('/')}/{path}"


def execute_succeeds(action):
    """Branch 1, the provider answers: claim -> pending, commit, `succeeded` under the claim."""
    action.claim(owner=WORKER)
    effect = provider_commit(action)
    return action.mark_succeeded(actor=EXECUTOR, claim=action.fence, external_ref=effect.external_ref,
                                 result=effect.result)


def execute_declined(action, message):
    action.claim(owner=WORKER)
    return action.mark_failed(actor=EXECUTOR, claim=action.fence, code="declined",
                              message=f"POST {_url('refunds')}: {message}", retryable=False)


def execute_times_out(action, *, committed, verify_in):
    """The call timed out: the outcome is unknown (the provider may have committed it)."""
    action.claim(owner=WORKER)
    if committed:
        provider_commit(action)
    evidence = _evidence(action, _provider_error(
        "OutcomeUnknown", "timeout", f"POST {_url('refunds')}: no answer within {settings.CONNECTOR_TIMEOUT}s"))
    return action.mark_unknown(actor=EXECUTOR, claim=action.fence, evidence=evidence,
                               verify_at=timezone.now() + verify_in)


def verify_inconclusive(action):
    """Branch 3: the look-up itself failed -> a person decides (`needs_review`)."""
    action.claim_for_verification(owner=WORKER)
    lookup = {"lookup": _provider_error("OutcomeUnknown", "http_503", f"GET {_url('refunds')}: HTTP 503", 503)}
    return action.mark_needs_review(actor=EXECUTOR, claim=action.fence,
                                    evidence=_evidence(action, {"verification": lookup, "found": None}),
                                    reason="the provider cannot say whether the effect happened")


def verify_found_over_limit(action, external_ref):
    """Branch 3: found at the provider, but over the limit -> a person reviews anyway."""
    action.claim_for_verification(owner=WORKER)
    evidence = _evidence(action, {"verification": {"lookup": "by operation key", "matches": [external_ref]},
                                  "found": True})
    return action.mark_needs_review(actor=EXECUTOR, claim=action.fence, evidence=evidence,
                                    reason=needs_person_after_verification(action))


def execute_not_sent(action, *, retry_in):
    """The request never reached the provider: back to `queued` after a backoff."""
    action.claim(owner=WORKER)
    evidence = _evidence(action, _provider_error(
        "NotSent", "connect_failed", f"POST {_url('refunds')}: ConnectError('[Errno 111] Connection refused')"))
    return action.requeue(actor=EXECUTOR, claim=action.fence, reason="the request never reached the provider",
                          not_before=timezone.now() + retry_in, evidence=evidence)


# --- Tasks: the runner's loop, with the provider stand-in ----------------------------------------


def _lookup_order(order_id):
    """`lookup_order`'s result, read from the sandbox's table instead of over HTTP."""
    order = SandboxOrder.objects.get(order_id=order_id)
    return {"order_id": order.order_id, "customer": order.customer, "amount": str(order.amount)}


def _step_action(task, row, spec: ActionSpec):
    action, _ = action_request(
        agent=task.agent, operation_key=row.idempotency_key, action_type=spec.action_type, target=spec.target,
        customer=spec.customer, params=spec.params, task=task, decision_id=task.task_id,
    )
    return action


def task_run_demo(task, *, fail_at=None):
    """One attempt of a claimed task, as `ledger.runner.task_run` does it: resume at the first
    step not done, checkpoint each. `fail_at=(step, StepFailed)` makes that step fail (the
    runner's `_fail`: retry later, dead-letter or fail). An effect step whose action is not
    settled makes the task wait for a person, as the runner does."""
    claim = task.fence
    workflow = WORKFLOWS[task.workflow]
    ctx = StepContext(task=task, input=task.input)
    for row in task.steps.order_by("position"):
        if row.status == StepStatus.DONE:
            ctx.results[row.name] = row.result
            continue
        step = workflow.step(row.name)
        if fail_at and fail_at[0] == row.name:
            return _fail(task, claim, row, fail_at[1])
        if step.kind == "read":
            result = _lookup_order(task.input["order_id"])
            _checkpoint(task, claim, row, lambda: result)
        elif step.kind == "local":
            _checkpoint(task, claim, row, lambda: step.run(ctx, row.idempotency_key))
        else:
            action = _step_action(task, row, step.run(ctx))
            if action.status == S.QUEUED:
                action = execute_succeeds(action)
            if action.status != S.SUCCEEDED:
                task.wait_for_person(claim=claim, reason=f"{action.operation_key} is {action.status}")
                return task
            _checkpoint(task, claim, row, lambda: {"external_ref": action.external_ref, "action_status": action.status})
        ctx.results[row.name] = row.result
    return task.mark_succeeded(claim=claim)


def refund_task(agent, n, order, *, notify=None, reason=""):
    input_ = {"order_id": order.order_id, "amount": str(order.amount), "currency": order.currency,
              "customer": order.customer}
    if reason:
        input_["reason"] = reason
    if notify:
        input_["notify"] = notify
    task, _ = task_request(agent=agent, task_id=f"refund-{order.order_id.removeprefix('ORD-')}-{n}",
                           workflow="refund", input=input_)
    return task


def task_attempt(task, **kwargs):
    task.claim(owner=WORKER)
    return task_run_demo(task, **kwargs)


def task_dead_letter(task, failure):
    """Run out of attempts: each attempt fails at `failure`'s step, then the dead-letter queue."""
    while True:
        outcome = task_attempt(task, fail_at=failure)
        if isinstance(outcome, DeadLetter):
            return outcome
        task = outcome


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
    ("ORD-10049", "CUST-1049", "61.00", "EUR"), ("ORD-10050", "CUST-1050", "27.00", "EUR"),
]


@dataclass
class Demo:
    users: dict
    agents: dict
    tokens: dict


def _refund(agent, key, order, amount=None, *, decision, customer=None, reason=""):
    params = {"amount": amount or str(order.amount), "currency": order.currency}
    if reason:
        params["reason"] = reason
    action, _ = action_request(
        agent=agent, operation_key=key, action_type=ActionType.REFUND, target=order.order_id,
        customer=customer if customer is not None else order.customer, params=params, decision_id=decision,
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
            agent, token = agent_create(name, actor=ada, grants=grants, owner=users[owner])
            agents[name], tokens[name] = agent, token

        Limit.limit_set(actor=ada, action_type=ActionType.REFUND, currency="EUR", max_amount=Decimal("500.00"),
                        dual_approval_above=Decimal("5000.00"), daily_customer_total=Decimal("2000.00"),
                        review_deadline_hours=4, reason="demo policy: refunds over 500 EUR need an approver")
        Limit.limit_set(actor=ada, action_type=ActionType.REFUND, currency="USD", max_amount=Decimal("500.00"),
                        review_deadline_hours=4, reason="demo policy: refunds over 500 USD need an approver")

        orders = {}
        for order_id, customer, amount, currency in ORDERS:
            orders[order_id], _ = SandboxOrder.objects.get_or_create(
                order_id=order_id, defaults={"customer": customer, "amount": Decimal(amount), "currency": currency})
        _seed_actions(users, agents, orders)
        _seed_tasks(users, agents, orders)
        _seed_overdue()
    return Demo(users=users, agents=agents, tokens=tokens)


def _seed_actions(users, agents, orders):
    billing, support = agents["billing-bot"], agents["support-bot"]
    alice, bob = users["alice"], users["bob"]
    o = orders.get

    # succeeded: refunds, messages, bookings that went straight through.
    for n, order_id in enumerate(("ORD-10001", "ORD-10002", "ORD-10003", "ORD-10004", "ORD-10006", "ORD-10008",
                                  "ORD-10015", "ORD-10016"), start=101):
        execute_succeeds(_refund(billing, f"refund:{order_id}:full:dec-{n}", o(order_id), decision=f"dec-{n}"))
    for n, customer in enumerate(("CUST-1001", "CUST-1002", "CUST-1004", "CUST-1006"), start=201):
        execute_succeeds(_message(
            support, f"message:{customer}:refund_confirmation:dec-{n}", f"{customer.lower()}@customers.surety.example",
            "refund_confirmation", "Your refund is on its way; it shows on your statement within 5 days.",
            decision=f"dec-{n}", customer=customer))
    tomorrow = timezone.now() + timedelta(days=1)
    for n, (resource, customer, service, hour) in enumerate(
            (("room-3", "CUST-1005", "consultation", 9), ("room-3", "CUST-1008", "consultation", 11),
             ("stylist-2", "CUST-1016", "haircut", 14)), start=301):
        start = tomorrow.replace(hour=hour)
        execute_succeeds(_booking(support, f"booking:{customer}:{service}:{start:%Y%m%dT%H}", resource, customer,
                                  service, start, 1, decision=f"dec-{n}"))

    # queued: one just requested, one waiting out a backoff after the provider was unreachable.
    _refund(billing, "refund:ORD-10005:full:dec-401", o("ORD-10005"), decision="dec-401")
    execute_not_sent(_refund(billing, "refund:ORD-10019:full:dec-402", o("ORD-10019"), decision="dec-402"),
                     retry_in=timedelta(minutes=20))
    # pending: claimed by a worker, call in flight (the sweeper takes it over if the worker is gone).
    _refund(billing, "refund:ORD-10017:full:dec-403", o("ORD-10017"), decision="dec-403").claim(owner=WORKER)
    # unknown: the call timed out after the provider committed; verification is due shortly.
    execute_times_out(_refund(billing, "refund:ORD-10018:full:dec-404", o("ORD-10018"), decision="dec-404"),
                      committed=True, verify_in=timedelta(minutes=10))
    # needs_review (1): the provider could not be asked.
    verify_inconclusive(execute_times_out(
        _refund(billing, "refund:ORD-10020:full:dec-405", o("ORD-10020"), decision="dec-405"),
        committed=False, verify_in=timedelta(0)))
    # needs_review (2): approved over the limit, timed out, found at the provider — over the limit,
    # so a person confirms it even though verification was conclusive.
    big = _refund(billing, "refund:ORD-10024:full:dec-406", o("ORD-10024"), decision="dec-406")
    review_decide(_item(big), user=alice, decision="approve", reason="long-standing customer, damaged goods")
    big = execute_times_out(big, committed=True, verify_in=timedelta(0))
    verify_found_over_limit(big, SandboxRefund.objects.get(operation_key=big.operation_key).refund_id)
    # An unknown outcome a person settled as succeeded, and one settled as failed (safe to retry).
    settled = verify_inconclusive(execute_times_out(
        _refund(billing, "refund:ORD-10022:full:dec-407", o("ORD-10022"), decision="dec-407"),
        committed=True, verify_in=timedelta(0)))
    review_decide(_item(settled), user=alice, decision="mark_succeeded", reason="found in the provider's dashboard",
                  external_ref=SandboxRefund.objects.get(operation_key=settled.operation_key).refund_id)
    absent = verify_inconclusive(execute_times_out(
        _refund(billing, "refund:ORD-10023:full:dec-408", o("ORD-10023"), decision="dec-408"),
        committed=False, verify_in=timedelta(0)))
    review_decide(_item(absent), user=bob, decision="mark_failed",
                  reason="not in the provider's export for today; safe to retry")

    # failed: declined by the provider (not retryable).
    execute_declined(_refund(billing, "refund:ORD-10025:full:dec-409", o("ORD-10025"), decision="dec-409"),
                     "the card account is closed; the provider declined the refund")

    # awaiting_approval: over the limit; two approvers above 5000; the daily customer total.
    _refund(billing, "refund:ORD-10010:full:dec-501", o("ORD-10010"), decision="dec-501",
            reason="item arrived broken")
    _refund(billing, "refund:ORD-10011:full:dec-502", o("ORD-10011"), decision="dec-502",
            reason="event cancelled by the organiser")
    dual = _refund(billing, "refund:ORD-10012:full:dec-503", o("ORD-10012"), decision="dec-503",
                   reason="duplicate charge")
    review_decide(_item(dual), user=alice, decision="approve", reason="duplicate charge confirmed in the PSP export")
    for n, order_id in enumerate(("ORD-10030", "ORD-10031", "ORD-10032", "ORD-10033"), start=504):
        execute_succeeds(_refund(billing, f"refund:{order_id}:full:dec-{n}", o(order_id), decision=f"dec-{n}"))
    _refund(billing, "refund:ORD-10034:full:dec-508", o("ORD-10034"), decision="dec-508")  # 2215 today > 2000

    # approved, then executed.
    approved = _refund(billing, "refund:ORD-10009:full:dec-509", o("ORD-10009"), decision="dec-509")
    review_decide(_item(approved), user=bob, decision="approve", reason="within goodwill budget")
    execute_succeeds(approved)
    # rejected by an approver.
    rejected = _refund(billing, "refund:ORD-10013:full:dec-510", o("ORD-10013"), decision="dec-510")
    review_decide(_item(rejected), user=bob, decision="reject", reason="already refunded by bank transfer last week")

    # held: two refunds for the same order, both waiting for a person.
    _refund(billing, "refund:ORD-10021:full:dec-601", o("ORD-10021"), decision="dec-601")
    _refund(billing, "refund:ORD-10021:partial:dec-602", o("ORD-10021"), "90.00", decision="dec-602")
    # A held pair a person sorted out: the duplicate rejected, the other released and executed.
    first = _refund(billing, "refund:ORD-10014:full:dec-603", o("ORD-10014"), "480.00", decision="dec-603")
    second = _refund(billing, "refund:ORD-10014:full:dec-604", o("ORD-10014"), "480.00", decision="dec-604")
    review_decide(_item(second), user=alice, decision="reject", reason="the same decision sent twice")
    review_decide(_item(first), user=alice, decision="release", reason="the other request was a duplicate")
    execute_succeeds(Action.objects.get(pk=first.pk))

    # cancelled: the agent withdrew a booking before it ran.
    start = (timezone.now() + timedelta(days=2)).replace(hour=10)
    _booking(support, f"booking:CUST-1026:consultation:{start:%Y%m%dT%H}", "room-1", "CUST-1026", "consultation",
             start, 1, decision="dec-701").cancel(actor=support, reason="the customer rescheduled by phone")


def _seed_tasks(users, agents, orders):
    billing = agents["billing-bot"]
    olga = users["olga"]
    o = orders.get

    # succeeded, every step done.
    for order_id in ("ORD-10041", "ORD-10042", "ORD-10044"):
        task_attempt(refund_task(billing, 1, o(order_id), reason="late delivery"))
    # waiting: its refund is over the limit and waits for an approver.
    task_attempt(refund_task(billing, 1, o("ORD-10043"), reason="wrong size, returned"))
    # queued: the first attempt failed (provider outage), the next one is scheduled.
    task_attempt(refund_task(billing, 1, o("ORD-10050")), fail_at=(
        "lookup_order", StepFailed(f"GET {_url('orders/ORD-10050')}: HTTP 502", retryable=True, code="http_502")))
    # failed: not retryable (the order is unknown to the provider).
    task_attempt(refund_task(billing, 1, o("ORD-10049")), fail_at=(
        "lookup_order", StepFailed("order ORD-10049 is unknown", retryable=False, code="unknown_order")))

    # dead_lettered, each with its entry and alert.
    task_dead_letter(refund_task(billing, 1, o("ORD-10045")), (
        "lookup_order", StepFailed(f"GET {_url('orders/ORD-10045')}: HTTP 503", retryable=True, code="http_503")))
    task_dead_letter(refund_task(billing, 1, o("ORD-10046")), (
        "notify_customer", StepFailed("TemplateDoesNotExist: emails/refund_confirmation.de.txt", retryable=True,
                                      code="crash")))
    task_dead_letter(refund_task(billing, 1, o("ORD-10047")), (
        "write_confirmation", StepFailed("OperationalError: could not obtain lock on row in relation "
                                         "\"ledger_confirmation\"", retryable=True, code="crash")))
    # redriven from the dead-letter queue: queued again, resumes at its checkpoint.
    entry = task_dead_letter(refund_task(billing, 1, o("ORD-10048")), (
        "lookup_order", StepFailed(f"GET {_url('orders/ORD-10048')}: ConnectError('[Errno 111] Connection refused')",
                                   retryable=True, code="connect_failed")))
    deadletter_redrive(entry, actor=olga, reason="the sandbox provider is back up")
    # discarded: refunded by hand instead; the task is cancelled.
    entry = task_dead_letter(refund_task(billing, 2, o("ORD-10026")), (
        "lookup_order", StepFailed(f"GET {_url('orders/ORD-10026')}: HTTP 503", retryable=True, code="http_503")))
    deadletter_discard(entry, actor=olga, reason="refunded by hand in the provider's dashboard (ticket OPS-4411)")


def _seed_overdue():
    # Demo data only: no real code path moves a deadline, so overdue items are made by a plain
    # queryset update of their deadlines into the past (not audited). The sweeper's pass then
    # raises each one's overdue alert through the real machinery.
    now = timezone.now()
    open_items = ReviewItem.objects.filter(status=ReviewStatus.OPEN)
    targets = {"ORD-10010": timedelta(hours=2), "ORD-10021": timedelta(minutes=35), "ORD-10020": timedelta(hours=5)}
    for target, late in targets.items():
        open_items.filter(action__target=target).update(deadline=now - late, created_at=now - late - timedelta(hours=4))
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
