"""The replay set, run against an action type's connector in its test mode, every run kept.

The six cases every connector must survive before an agent's grant for its action type may
be live (ledger.grants):

1. clean_first_call: a new action runs once and succeeds, and the provider has its effect.
2. retry_same_request: the same key and request again returns the stored action; nothing runs.
3. timeout_after_commit: the provider commits and does not answer in time; the executor
   verifies instead of calling again, and finds the one effect.
4. webhook_twice: the same signed event delivered twice is acted on once.
5. same_key_other_params: the same key asking for something else is refused; nothing changes.
6. two_actions_same_object: two actions for one object requested together make at most one
   effect (the ledger holds them for a person).

The actions are the replay agent's, under keys `replay:<run id>:<case>`, so runs never collide
with real work, and the executor sends them to the test mode whichever worker runs them
(ledger.connectors.test_mode). They are run here, in this process, through the executor's own
functions. Each case ends `passed` or `failed` with its evidence; an exception is a failed
case, never a crash of the run. The run passes only when every case did, and is written as
passed once, at the end: a run that stops midway has passed = null, which the gate does
not take. Nothing here promotes a grant.
"""

import json
import time
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from .actions import KeyReused, action_by_key, action_request
from .agents import agent_create
from .audit import actor_label
from .connectors import NoConnector, http
from .connectors.test_mode import (
    REPLAY_AGENT, REPLAY_KEY_PREFIX, NoTestMode, connector_description, connector_version, test_connector_for,
)
from .executor import action_claim_next, action_run_claimed
from .jobs import worker_name
from .models import Action, ActionStatus, ActionType, Agent, ReplayRun
from .signing import sign_webhook

S = ActionStatus
REPLAY_AGENT_OWNER = "replay-set-owner"
ACTOR = "system:replay"


def _sandbox_event(connector, key):
    body = json.dumps({"id": f"evt_{key}", "type": "refund.succeeded",
                       "data": {"id": f"re_{key}", "metadata": {"operation_key": key}}}).encode()
    return body, {"Sandbox-Signature": sign_webhook(body, settings.SANDBOX_WEBHOOK_SECRET)}


def _stripe_event(connector, key):
    """A Stripe event as Stripe signs it (the same scheme, with the connector's webhook secret)."""
    refund = {"id": f"re_{key}", "object": "refund", "status": "succeeded", "metadata": {"operation_key": key}}
    body = json.dumps({"id": f"evt_{key}", "object": "event", "type": "refund.updated",
                       "data": {"object": refund}}).encode()
    return body, {"Stripe-Signature": sign_webhook(body, connector.options.get("webhook_secret") or "")}


# A connector's test event about an operation key, signed as its webhook view checks it: (body, headers).
_WEBHOOK_EVENTS = {"sandbox": _sandbox_event, "stripe": _stripe_event}
# How a fault is armed where a connector's test mode takes them: the sandbox's own key (the
# sandbox, and Stripe's wire format, which shares its faults), or a team's test service's signature.
_FAULT_HEADERS = {"http": lambda connector, body: connector.signed(body)}


def _sandbox_fault_headers(connector, body):
    return {"Content-Type": "application/json", "Authorization": f"Bearer {settings.SANDBOX_API_KEY}"}


class NotApplicable(Exception):
    """The case does not apply to this connector (it sends no webhooks): it neither passes nor fails the run."""


class CaseFailed(Exception):
    def __init__(self, message, **evidence):
        super().__init__(message)
        self.evidence = evidence


def replay_agent():
    """The agent every replay action is recorded under (made on first use, owned by an
    inactive placeholder: nobody's requests, nobody's approvals)."""
    agent = Agent.objects.filter(name=REPLAY_AGENT).first()
    if agent is not None:
        return agent
    owner, _ = get_user_model().objects.get_or_create(username=REPLAY_AGENT_OWNER,
                                                      defaults={"is_active": False, "password": "!"})
    return agent_create(REPLAY_AGENT, actor=ACTOR, owner=owner)[0]


def replay_start(action_type, *, actor):
    """A new run of `action_type`'s replay set, recorded before any case runs."""
    try:
        description, version = connector_description(action_type), connector_version(action_type)
    except (NoConnector, ImportError) as exc:
        description, version = {"name": "", "class": "", "options": {}, "error": str(exc)}, ""
    return ReplayRun.objects.create(
        action_type=action_type, connector=description["name"], connector_class=description["class"],
        connector_options=description, connector_version=version, ran_by=actor_label(actor),
    )


def replay_run(run):
    """Run the six cases of `run` in order, store each outcome as it ends, then the verdict."""
    try:
        connector, faults_url = test_connector_for(run.action_type)
        problems = connector.check()
        if problems:
            raise NoTestMode("; ".join(problems))
    except (NoConnector, NoTestMode, ImportError, TypeError, ValueError) as exc:
        run.cases = [{"case": "test_mode", "outcome": "failed", "evidence": {"error": str(exc)}}]
        return _finish(run)
    case = _Cases(run, replay_agent(), connector, faults_url)
    for name, step in case.steps():
        started = time.monotonic()
        try:
            outcome, evidence = "passed", step()
        except NotApplicable as exc:
            outcome, evidence = "not_applicable", {"reason": str(exc)}
        except CaseFailed as exc:
            outcome, evidence = "failed", {"error": str(exc), **exc.evidence}
        except http.ProviderError as exc:  # what the provider answered (its status, its code) is the evidence
            outcome, evidence = "failed", {"error": f"{type(exc).__name__}: {exc}", "answer": exc.evidence()}
        except Exception as exc:  # noqa: BLE001 (any failure of a case is its evidence, the run goes on)
            outcome, evidence = "failed", {"error": f"{type(exc).__name__}: {exc}"}
        run.cases = [*run.cases, {"case": name, "outcome": outcome, "seconds": round(time.monotonic() - started, 2),
                                  "evidence": json.loads(json.dumps(evidence, default=str))}]
        ReplayRun.objects.filter(pk=run.pk).update(cases=run.cases)
    case.cancel_leftovers()
    return _finish(run)


def replay_check(action_type, *, actor):
    return replay_run(replay_start(action_type, actor=actor))


def replay_run_job(run_id):
    """The RQ job of the connectors page's button: load by id, run."""
    replay_run(ReplayRun.objects.get(pk=run_id))


def _finish(run):
    run.passed = bool(run.cases) and all(c["outcome"] in ("passed", "not_applicable") for c in run.cases)
    run.finished_at = timezone.now()
    run.save(update_fields=["cases", "passed", "finished_at"])
    return run


def last_runs():
    """Per action type, its newest replay run (or None)."""
    return {t: ReplayRun.objects.filter(action_type=t).first() for t in ActionType.values}


class _Cases:
    def __init__(self, run, agent, connector, faults_url):
        self.run, self.agent, self.connector, self.faults_url = run, agent, connector, faults_url
        self.owner = f"replay:{worker_name()}"
        self.targets = {}

    def steps(self):
        return [("clean_first_call", self.clean_first_call), ("retry_same_request", self.retry_same_request),
                ("timeout_after_commit", self.timeout_after_commit), ("webhook_twice", self.webhook_twice),
                ("same_key_other_params", self.same_key_other_params),
                ("two_actions_same_object", self.two_actions_same_object)]

    # -- what each case asks for ----------------------------------------------------------------

    def key(self, case):
        return f"{REPLAY_KEY_PREFIX}{self.run.pk}:{case}"

    def request(self, case, *, n=0, other=False):
        """The request of a case for this action type: a target of its own (n), or changed params."""
        target = f"replay-{self.run.pk}-{n}"
        action_type = self.run.action_type
        customer = ""
        if action_type == ActionType.REFUND:
            target, params = self.refund_target(n), {"amount": "2.00" if other else "1.00", "currency": "EUR"}
        elif action_type == ActionType.SEND_MESSAGE:
            target, params = f"{target}@example.test", {"channel": "email", "message_type": "replay",
                                                        "body": "replay set (again)" if other else "replay set"}
        else:
            start = (timezone.now() + timedelta(days=30 + n)).replace(microsecond=0)
            customer = "replay"
            params = {"service": "other" if other else "replay", "start": start.isoformat(),
                      "end": (start + timedelta(hours=1)).isoformat()}
        return dict(agent=self.agent, operation_key=self.key(case), action_type=action_type, target=target,
                    customer=customer, params=params, decision_id=self.key(case))

    def refund_target(self, n):
        """What the case's refunds are for: an order of its own, or at a provider that refunds
        only what was paid (Stripe), a payment the test mode makes for it (`replay_target`)."""
        if n not in self.targets:
            make = getattr(self.connector, "replay_target", None)
            self.targets[n] = make("10.00", "EUR") if make else f"REPLAY-{self.run.pk}-{n}"
        return self.targets[n]

    # -- running through the executor ------------------------------------------------------------

    def record_and_claim(self, **request):
        """Record and claim in one transaction: no worker sees the action before this process owns it."""
        with transaction.atomic():
            action, created = action_request(**request)
            claimed = action_claim_next(self.owner, only=action.pk) if action.status == S.QUEUED else None
        return action, created, claimed

    def run_until_settled(self, action, claimed, seconds):
        """Run the claimed attempt, then every verification that falls due, until the outcome
        is known or `seconds` pass. A request that never reached the provider is requeued for
        later: that is this case's outcome, not something to wait for. A worker may take a
        verification over: its connector is this test mode too."""
        deadline = time.monotonic() + seconds
        if claimed is not None:
            action_run_claimed(claimed)
        while True:
            action.refresh_from_db()
            if action.status not in (S.PENDING, S.UNKNOWN) or time.monotonic() > deadline:
                return action
            if action.status == S.UNKNOWN:
                verifying = action_claim_next(self.owner, only=action.pk)
                if verifying is not None:
                    action_run_claimed(verifying)
                    continue
            time.sleep(0.2)

    def seconds(self):
        return settings.CONNECTOR_TIMEOUT * 3 + settings.SANDBOX_TIMEOUT_SLEEP + 5

    def expect_succeeded(self, action, attempts=1):
        shown = _shown(action)
        if action.status != S.SUCCEEDED:
            raise CaseFailed(f"the action is {action.status}, not succeeded", action=shown)
        if action.attempts != attempts:
            raise CaseFailed(f"{action.attempts} attempts, not {attempts}", action=shown)
        lookup = self.connector.find_effect(action)
        if lookup.found is not True or lookup.external_ref != action.external_ref:
            raise CaseFailed("the provider does not show the action's effect", action=shown, lookup=lookup.evidence)
        return {"action": shown, "lookup": lookup.evidence}

    # -- the six cases ---------------------------------------------------------------------------

    def clean_first_call(self):
        action, _, claimed = self.record_and_claim(**self.request("clean"))
        if claimed is None:
            raise CaseFailed(f"the action was recorded {action.status}, not queued", action=_shown(action))
        return self.expect_succeeded(self.run_until_settled(action, claimed, self.seconds()))

    def retry_same_request(self):
        first = action_by_key(self.key("clean"))
        if first is None or first.status != S.SUCCEEDED:
            raise CaseFailed("needs the clean first call to have succeeded")
        again, created, claimed = self.record_and_claim(**self.request("clean"))
        if created or claimed is not None or again.pk != first.pk:
            raise CaseFailed("the same request made or ran a new action", action=_shown(again))
        return {"replayed": _shown(again), **self.expect_succeeded(again)}

    def timeout_after_commit(self):
        request = self.request("timeout", n=3)
        if not self.faults_url:
            raise CaseFailed("this test mode names no faults URL: a timeout after commit cannot be staged")
        body = json.dumps({"target": request["target"], "fault": "timeout_after_commit", "times": 1}).encode()
        headers = _FAULT_HEADERS.get(self.connector.name, _sandbox_fault_headers)(self.connector, body)
        http.call("POST", self.faults_url, content=body, headers=headers)
        action, _, claimed = self.record_and_claim(**request)
        if claimed is None:
            raise CaseFailed(f"the action was recorded {action.status}, not queued", action=_shown(action))
        action = self.run_until_settled(action, claimed, self.seconds())
        if not any(e.get("code") == "timeout" for e in action.evidence):
            raise CaseFailed("the provider answered in time: the fault did not take", action=_shown(action))
        return self.expect_succeeded(action)

    def webhook_twice(self):
        if not hasattr(self.connector, "read_webhook") and self.connector.name not in _WEBHOOK_EVENTS:
            raise NotApplicable(f"the {self.connector.name} connector sends no webhooks")
        event = _WEBHOOK_EVENTS.get(self.connector.name)
        if event is None:
            raise CaseFailed(f"no test event can be signed for the {self.connector.name} connector yet")
        body, signature = event(self.connector, self.key("webhook"))
        url = f"{settings.SITE_URL.rstrip('/')}/webhooks/{self.connector.name}/"
        answers = [http.call("POST", url, content=body, headers={"Content-Type": "application/json", **signature})
                   for _ in range(2)]
        if answers[0].get("duplicate") or answers[1] != {"duplicate": True}:
            raise CaseFailed("the second delivery was not recognised as a duplicate", answers=answers)
        return {"answers": answers}

    def same_key_other_params(self):
        before = Action.objects.values().get(operation_key=self.key("clean"))
        try:
            action_request(**self.request("clean", other=True))
        except KeyReused:
            after = Action.objects.values().get(operation_key=self.key("clean"))
            if after != before:
                raise CaseFailed("the refused request changed the action", before=before, after=after) from None
            return {"refused": "idempotency_key_reused", "unchanged": self.key("clean")}
        raise CaseFailed("the same key with other params was accepted")

    def two_actions_same_object(self):
        requests = [self.request(case, n=6) for case in ("same_object_1", "same_object_2")]
        with transaction.atomic():  # together: neither is seen (or run) before the other is recorded
            actions = [action_request(**r)[0] for r in requests]
        settled = [self.run_until_settled(a, action_claim_next(self.owner, only=a.pk), self.seconds())
                   for a in actions]
        effects = [self.connector.find_effect(a) for a in settled]
        shown = {"actions": [_shown(a) for a in settled], "lookups": [e.evidence for e in effects]}
        if sum(bool(e.found) for e in effects) > 1:
            raise CaseFailed("both actions reached the provider", **shown)
        return shown

    def cancel_leftovers(self):
        """Not-started actions of this run (held ones, one never sent) are cancelled, so that
        nothing of a replay run waits for a person or runs later."""
        for action in Action.objects.filter(agent=self.agent, operation_key__startswith=self.key(""),
                                            status__in=[S.QUEUED, S.HELD, S.AWAITING_APPROVAL]):
            action.cancel(actor=ACTOR, reason=f"replay run {self.run.pk} is over")


def _shown(action):
    return {"operation_key": action.operation_key, "status": action.status, "attempts": action.attempts,
            "external_ref": action.external_ref, "error": action.error, "evidence": action.evidence}
