"""An action with a long history, made through the product's own code paths, for the evidence
record's benchmark (bench/evidence.py) and its tests (tests/ledger/test_evidence*.py).

Needs Django set up and the sandbox provider served at `settings.SANDBOX_BASE_URL` (a live
server: the executor calls it over HTTP). `rich_action(site_url, n)`:

 1. a limit: refunds over 500.00 EUR need an approver, over 1000.00 two;
 2. an agent (its owner decides nothing), granted refunds in shadow, then promoted live by
    another person after a passing replay run;
 3. a refund of 1200.00 EUR: awaiting approval; two approvers approve it;
 4. the provider declines it: failed for good, a dead-letter entry and its alert; a person
    redrives the entry (the refusal was fixed);
 5. the provider answers 500: unknown; it cannot be asked either, so verification leaves it to
    a person, who asks for verification again; the provider now says there is no effect: a
    new attempt, which succeeds;
 6. the provider's webhook for it arrives, twice; the sweeper seals the audit events.

That is over 20 audit events on the action, its review items, its dead-letter entry, the
limit and the agent's grant.
"""

from datetime import timedelta
from decimal import Decimal

import httpx
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.utils import timezone

from approvals.decisions import review_decide
from approvals.models import Limit, ReviewItem, ReviewStatus
from dlq.entries import deadletter_redrive
from dlq.models import DeadLetter
from ledger.actions import action_request
from ledger.agents import agent_create
from ledger.audit import AuditEvent
from ledger.connectors.test_mode import connector_version
from ledger.executor import action_claim_next, action_run_claimed
from ledger.grants import capability, grant_promote
from ledger.models import Action, Capability, ReplayRun
from ledger.roles import roles_setup
from ledger.signing import sign_webhook

PEOPLE = ("evidence-owner", "evidence-alice", "evidence-bob", "evidence-admin")
APPROVERS = {"evidence-alice", "evidence-bob"}


def _person(username):
    user = get_user_model().objects.get_or_create(username=username)[0]
    if username in APPROVERS:  # a decision needs the authority to decide, as on the pages
        roles_setup()
        user.groups.add(Group.objects.get(name="approvers"))
    return user


def _sandbox(method, path, **kwargs):
    response = httpx.request(method, f"{settings.SANDBOX_BASE_URL.rstrip('/')}/{path}", timeout=30,
                             headers={"Authorization": f"Bearer {settings.SANDBOX_API_KEY}"}, **kwargs)
    assert response.status_code < 300, response.text
    return response


def _arm(target, fault):
    _sandbox("POST", "faults", json={"target": target, "fault": fault, "times": 1})


def _run_when_due(action, seconds=30):
    """Claim this action as soon as it is due (a verification waits CONNECTOR_TIMEOUT, a retry
    its backoff) and run it, as a worker's drain would."""
    deadline = timezone.now() + timedelta(seconds=seconds)
    while timezone.now() < deadline:
        claimed = action_claim_next("bench:evidence", only=action.pk)
        if claimed is not None:
            action_run_claimed(claimed)
            return Action.objects.get(pk=action.pk)
    raise AssertionError(f"{action} never came due")


def _open_item(action):
    return ReviewItem.objects.get(action=action, status=ReviewStatus.OPEN)


def rich_agent(name="evidence-bot"):
    """The agent, made by its owner (who holds its token), granted refunds (shadow) and promoted
    live by another person after a replay run (four eyes: not the owner, nor who holds the token)."""
    owner, _, _, admin = (_person(username) for username in PEOPLE)
    agent, token = agent_create(name, actor=owner, grants=["refund"], owner=owner)
    ReplayRun.objects.get_or_create(action_type="refund", connector_version=connector_version("refund"),
                                    defaults={"passed": True, "ran_by": "bench:evidence", "finished_at": timezone.now()})
    grant_promote(agent, capability(Capability.Kind.ACTION_TYPE, "refund"), actor=admin,
                  reason="the replay set passed against the sandbox")
    return agent, token


def rich_action(site_url, n=1, agent=None):
    """The `n`-th such refund (its own order) by `agent` (made with `rich_agent` if None)."""
    _, alice, bob, admin = (_person(username) for username in PEOPLE)
    if not Limit.objects.filter(action_type="refund", currency="EUR").exists():
        Limit.limit_set(actor=admin, reason="refunds above 500 EUR need a person, above 1000 two",
                        action_type="refund", currency="EUR", max_amount=Decimal("500.00"),
                        dual_approval_above=Decimal("1000.00"))
    agent = agent or rich_agent()[0]
    order, key = f"ORD-EV{n}", f"refund:ORD-EV{n}:full:dec-ev{n}"
    action, _ = action_request(agent=agent, operation_key=key, action_type="refund", target=order,
                               customer=f"CUST-EV{n}", decision_id=f"dec-ev{n}",
                               params={"amount": "1200.00", "currency": "EUR", "reason": "damaged on arrival"})
    review_decide(_open_item(action), user=alice, decision="approve", reason="photos of the damage attached")
    review_decide(_open_item(action), user=bob, decision="approve", reason="second look: the order is damaged")

    _arm(order, "decline")
    action = _run_when_due(action)
    deadletter_redrive(DeadLetter.objects.get(action=action, status="open"), actor=admin,
                       reason="the card issuer lifted its block")
    # Failed for good, retried on a person's word: over its limit, approved again first.
    review_decide(_open_item(action), user=alice, decision="approve", reason="the block is lifted")
    review_decide(_open_item(action), user=bob, decision="approve", reason="second look: lifted")

    _arm(order, "error_500")
    action = _run_when_due(action)  # a failure tried again: looked for first (absent), then the call: unknown
    _arm(key, "lookup_error")
    action = _run_when_due(action)  # its verification: the provider cannot be asked
    review_decide(_open_item(action), user=alice, decision="verify", reason="the provider is answering again")
    action = _run_when_due(action)  # verified absent: a new attempt
    action = _run_when_due(action)  # which succeeds

    webhook = {"id": f"evt_ev{n}", "type": "refund.succeeded",
               "data": {"id": action.external_ref, "object": "refund", "order_id": order,
                        "metadata": {"operation_key": key}}}
    body = httpx.Request("POST", "/", json=webhook).content
    for _ in range(2):  # delivered twice, stored once
        httpx.post(f"{site_url}/webhooks/sandbox/", content=body, timeout=30, headers={
            "Content-Type": "application/json",
            "Sandbox-Signature": sign_webhook(body, settings.SANDBOX_WEBHOOK_SECRET)})
    AuditEvent.objects.seal()
    return Action.objects.get(pk=action.pk)
