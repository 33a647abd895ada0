"""The replay set, run against an action type's connector in its test mode, every run kept.

The six cases every connector must survive before an agent's grant for its action type may
be live (ledger.grants):

1. clean_first_call: a new action runs once and succeeds, and the provider has its effect.
2. retry_same_request: the same key and request again returns the stored action; nothing runs.
3. timeout_after_commit: the provider commits and does not answer in time; the executor
   verifies instead of calling again, and finds the one effect.
4. webhook_twice: the same signed event, posted to SITE_URL once a signed probe showed that
   it reaches this deployment (ledger.site_url), is acted on once.
5. same_key_other_params: the same key asking for something else is refused; nothing changes.
6. two_actions_same_object: two actions for one object requested together make at most one
   effect, as the action type means it: two refunds of one order or two messages to one
   recipient are held for a person (no effect); a second booking of a booked slot is refused
   at intake (`SlotTaken`) and the first is made (exactly one).

The faults are staged by the run itself: it starts a fault proxy in front of the test mode's
base URL (ledger.connectors.fault_proxy) and points its connector at it, so the same run
passes against the sandbox, a team's signed-HTTP test URL and Stripe's test mode, none of
which needs a faults endpoint (a test mode that names its own `faults_url` has it used
instead). A test mode that cannot be reached ends the run before any case, with its answer.

The actions are the replay agent's, under keys `replay:<run id>:<tag>:<case>` (`replay_key`), so
runs never collide with real work, and the executor sends them to the test mode whichever worker
runs them (ledger.connectors.test_mode); in this process, where they are run through the
executor's own functions, to the run's connector behind its proxy. The tag is an HMAC of the run
id under SECRET_KEY: run ids are sequential, and an agent that recorded the next run's keys first
would have that run find its actions (and fail, or pass on what it recorded); a case that finds
an action of another agent's under its key fails, saying so.

The run is executed where the RQ worker takes it, with that process's settings: before any case
it computes the connector's version again, and a version other than the one recorded when the
run started (by the console, in the web process) fails the run, with both, since a pass would
open the gate for a connector it never tested.

Each case ends `passed` or `failed` with its evidence, which keeps what the proxy staged and
what the provider holds afterwards; an exception is a failed case, never a crash of the run.
The run passes only when every case did, and is written as passed once, at the end: a run that
stops midway has passed = null, which the gate does not take. Nothing here promotes a grant.
"""

import contextlib
import json
import time
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone
from django.utils.crypto import salted_hmac

from .actions import KeyReused, SlotTaken, action_by_key, action_request
from .agents import agent_create
from .audit import actor_label
from .connectors import NoConnector, http
from .connectors.fault_proxy import FaultProxy
from .connectors.test_mode import (
    REPLAY_AGENT, REPLAY_AGENT_OWNER, REPLAY_KEY_PREFIX, NoTestMode, connector_description, connector_version,
    is_replay_agent, replay_connector, test_connector_for,
)
from .executor import action_claim_next, action_run_claimed
from .jobs import worker_name
from .models import Action, ActionStatus, ActionType, Agent, ReplayRun
from .signing import sign_webhook
from .site_url import site_url_problem

S = ActionStatus
ACTOR = "system:replay"


def _sandbox_event(connector, key):
    body = json.dumps({"id": f"evt_{key}", "type": "refund.succeeded",
                       "data": {"id": f"re_{key}", "metadata": {"operation_key": key}}}).encode()
    return body, {"Sandbox-Signature": sign_webhook(body, settings.SANDBOX_WEBHOOK_SECRET)}


def _stripe_event(connector, key):
    """A Stripe test-mode event as Stripe signs it: the same scheme, with the test endpoint's own
    secret, which the test mode has only where STRIPE_TEST_WEBHOOK_SECRET says it (never the live
    one: the webhook view refuses a test-mode event it cannot verify with the test secret)."""
    secret = connector.options.get("webhook_secret")
    if not secret:
        raise CaseFailed("the Stripe test mode has no webhook secret (STRIPE_TEST_WEBHOOK_SECRET: the signing secret "
                         "of the test-mode endpoint): a test-mode event cannot be signed, and /webhooks/stripe/ "
                         "refuses one that is not")
    refund = {"id": f"re_{key}", "object": "refund", "status": "succeeded", "metadata": {"operation_key": key}}
    body = json.dumps({"id": f"evt_{key}", "object": "event", "type": "refund.updated", "livemode": False,
                       "data": {"object": refund}}).encode()
    return body, {"Stripe-Signature": sign_webhook(body, secret)}


# A connector's test event about an operation key, signed as its webhook view checks it: (body, headers).
_WEBHOOK_EVENTS = {"sandbox": _sandbox_event, "stripe": _stripe_event}
# How a fault is armed where a test mode names its own faults endpoint: the sandbox's key (the
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


def replay_key(run, case):
    """The operation key of `case` in `run` ("" for the run's prefix): a tag no agent can derive
    from the run id, so none can record a run's keys before it does."""
    tag = salted_hmac("ledger.replay.replay_key", str(run.pk), algorithm="sha256").hexdigest()[:20]
    return f"{REPLAY_KEY_PREFIX}{run.pk}:{tag}:{case}"


def replay_agent():
    """The agent every replay action is recorded under (made on first use, owned by an
    inactive placeholder: nobody's requests, nobody's approvals)."""
    agent = Agent.objects.filter(is_replay_agent()).first()
    if agent is not None:
        return agent
    if Agent.objects.filter(name=REPLAY_AGENT).exists():
        # Made by a person before the name was reserved: its token may be in anyone's hands.
        raise ValueError(f"an agent named {REPLAY_AGENT!r} exists that is not the replay set's (a person's): "
                         "rename it (in the database: the console renames no agent) before a replay run")
    owner, _ = get_user_model().objects.get_or_create(username=REPLAY_AGENT_OWNER,
                                                      defaults={"is_active": False, "password": "!"})
    return agent_create(REPLAY_AGENT, actor=ACTOR, owner=owner, replay_set=True)[0]


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
    """Run the six cases of `run` in order, store each outcome as it ends, then the verdict.

    1. Compare the connector's version here with the one recorded when the run started;
       build the test mode's connector. Another version, a problem with the connector, or a
       test mode that cannot be reached, is the run's one failed case, with the answer.
    2. Start the fault proxy in front of its base URL, and have this process's replay
       actions go to the connector pointed at it.
    3. Run the cases; each keeps what the proxy staged while it ran.
    """
    try:
        version = connector_version(run.action_type)
        if version != run.connector_version:
            run.cases = [{"case": "connector_version", "outcome": "failed", "evidence": {
                "error": f"the {run.action_type} connector here is not the one the run was started for: "
                         "the process running it has other settings or code than the one that started it",
                "started_for": run.connector_version, "running": version}}]
            return _finish(run)
        provider, faults_url = test_connector_for(run.action_type)
        problems = provider.check()
        if problems:
            raise NoTestMode("; ".join(problems))
        _reach(provider)
        agent = replay_agent()
    except NoTestMode as exc:
        run.cases = [{"case": "test_mode", "outcome": "failed", "evidence": {"error": str(exc), **exc.evidence}}]
        return _finish(run)
    except (NoConnector, ImportError, TypeError, ValueError) as exc:
        run.cases = [{"case": "test_mode", "outcome": "failed", "evidence": {"error": str(exc)}}]
        return _finish(run)
    with contextlib.ExitStack() as running:
        proxy = running.enter_context(FaultProxy(provider.base_url)) if provider.base_url else None
        connector = provider.through(proxy.url) if proxy else provider
        running.enter_context(replay_connector(run.action_type, replay_key(run, ""), connector))
        case = _Cases(run, agent, connector, provider, proxy, faults_url)
        for name, step in case.steps():
            _run_case(run, case, name, step)
        case.cancel_leftovers()
    return _finish(run)


def _reach(connector):
    """Raise NoTestMode, with the answer, if the test mode's base URL cannot be reached at all.
    Any answer will do: whether it answers as the provider does is for the cases to show."""
    if not connector.base_url:  # not over HTTP
        return
    try:
        http.call("GET", connector.base_url)
    except http.NotSent as exc:
        raise NoTestMode(f"the {connector.name} test mode at {connector.base_url} cannot be reached",
                         answer=exc.evidence()) from exc
    except http.ProviderError:
        pass


def _run_case(run, case, name, step):
    started, staged_before = time.monotonic(), len(case.proxy.staged) if case.proxy else 0
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
    if case.proxy:  # a fault no write took must not hit the next case's
        left = case.proxy.disarm()
        evidence = {**evidence, "staged": case.proxy.staged[staged_before:], **({"not_staged": left} if left else {})}
    run.cases = [*run.cases, {"case": name, "outcome": outcome, "seconds": round(time.monotonic() - started, 2),
                              "evidence": json.loads(json.dumps(evidence, default=str))}]
    ReplayRun.objects.filter(pk=run.pk).update(cases=run.cases)


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
    """The cases of one run. `connector` is what the executor calls (behind `proxy`, where
    there is one); `provider`, the same test mode called directly, is asked what it holds."""

    def __init__(self, run, agent, connector, provider, proxy, faults_url):
        self.run, self.agent, self.connector, self.provider = run, agent, connector, provider
        self.proxy, self.faults_url = proxy, faults_url
        self.owner = f"replay:{worker_name()}"
        self.targets = {}
        # Bookings start from one instant per run: the same request asked again is the same request.
        self.first_start = (timezone.now() + timedelta(days=30)).replace(second=0, microsecond=0)

    def steps(self):
        return [("clean_first_call", self.clean_first_call), ("retry_same_request", self.retry_same_request),
                ("timeout_after_commit", self.timeout_after_commit), ("webhook_twice", self.webhook_twice),
                ("same_key_other_params", self.same_key_other_params),
                ("two_actions_same_object", self.two_actions_same_object)]

    # -- what each case asks for ----------------------------------------------------------------

    def key(self, case):
        return replay_key(self.run, case)

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
            start = self.first_start + timedelta(days=n)
            customer = "replay"
            params = {"service": "other" if other else "replay", "start": start.isoformat(),
                      "end": (start + timedelta(hours=1)).isoformat()}
        return dict(agent=self.agent, operation_key=self.key(case), action_type=action_type, target=target,
                    customer=customer, params=params, decision_id=self.key(case))

    def refund_target(self, n):
        """What the case's refunds are for: an order of its own, or at a provider that refunds
        only what was paid (Stripe), a payment the test mode makes for it (`replay_target`)."""
        if n not in self.targets:
            make = getattr(self.provider, "replay_target", None)
            self.targets[n] = make("10.00", "EUR") if make else f"REPLAY-{self.run.pk}-{n}"
        return self.targets[n]

    # -- running through the executor ------------------------------------------------------------

    def record_and_claim(self, **request):
        """Record and claim in one transaction: no worker sees the action before this process owns it."""
        with transaction.atomic():
            action, created = action_request(**request)
            self.own(action)
            claimed = action_claim_next(self.owner, only=action.pk) if action.status == S.QUEUED else None
        return action, created, claimed

    def own(self, action):
        """`action`, the replay agent's; what another agent recorded under the run's key fails the case."""
        if action.agent_id != self.agent.pk:
            raise CaseFailed(f"the action under {action.operation_key} is not the replay agent's but agent "
                             f"{action.agent_id}'s: another agent recorded this run's key", action=_shown(action))
        return action

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
        lookup = self.provider.find_effect(action)
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

    def stage(self, fault, target):
        """Arm `fault` for the next write: at the test mode's own faults endpoint where it names
        one, else at the run's fault proxy. Returns what was asked of the provider, if anything."""
        if self.faults_url:
            body = json.dumps({"target": target, "fault": fault, "times": 1}).encode()
            headers = _FAULT_HEADERS.get(self.connector.name, _sandbox_fault_headers)(self.connector, body)
            return {"faults_url": self.faults_url, "armed": http.call("POST", self.faults_url, content=body,
                                                                      headers=headers)}
        if self.proxy is None:
            raise CaseFailed(f"the {self.connector.name} connector does not call its provider over HTTP: "
                             f"a {fault} cannot be staged")
        self.proxy.arm(fault)
        return {}

    def timeout_after_commit(self):
        request = self.request("timeout", n=3)
        armed = self.stage("timeout_after_commit", request["target"])
        action, _, claimed = self.record_and_claim(**request)
        if claimed is None:
            raise CaseFailed(f"the action was recorded {action.status}, not queued", action=_shown(action))
        action = self.run_until_settled(action, claimed, self.seconds())
        if not any(e.get("code") == "timeout" for e in action.evidence):
            raise CaseFailed("the provider answered in time: the fault did not take", action=_shown(action))
        return {**armed, **self.expect_succeeded(action)}

    def webhook_twice(self):
        if not hasattr(self.connector, "read_webhook") and self.connector.name not in _WEBHOOK_EVENTS:
            raise NotApplicable(f"the {self.connector.name} connector sends no webhooks")
        event = _WEBHOOK_EVENTS.get(self.connector.name)
        if event is None:
            raise CaseFailed(f"no test event can be signed for the {self.connector.name} connector yet")
        problem = site_url_problem(settings.SITE_URL)  # before any event is sent there
        if problem:
            raise CaseFailed(problem, site_url=settings.SITE_URL)
        body, signature = event(self.connector, self.key("webhook"))
        url = f"{settings.SITE_URL.rstrip('/')}/webhooks/{self.connector.name}/"
        answers = [http.call("POST", url, content=body, headers={"Content-Type": "application/json", **signature})
                   for _ in range(2)]
        if answers[0].get("duplicate") or answers[1] != {"duplicate": True}:
            raise CaseFailed("the second delivery was not recognised as a duplicate", answers=answers)
        return {"site_url": settings.SITE_URL, "answers": answers}

    def same_key_other_params(self):
        before = Action.objects.values().get(operation_key=self.key("clean"))
        try:
            action_request(**self.request("clean", other=True))
        except KeyReused:
            after = Action.objects.values().get(operation_key=self.key("clean"))
            if after != before:
                raise CaseFailed("the refused request changed the action", before=before, after=after) from None
            lookup = self.provider.find_effect(action_by_key(self.key("clean")))
            if lookup.found is not True or lookup.external_ref != after["external_ref"]:
                raise CaseFailed("the provider does not show the first request's one effect", lookup=lookup.evidence)
            return {"refused": "idempotency_key_reused", "unchanged": self.key("clean"), "lookup": lookup.evidence}
        raise CaseFailed("the same key with other params was accepted")

    def two_actions_same_object(self):
        """Two actions for one object, requested together (neither seen, or run, before the other
        is recorded): refunds of one order or messages to one recipient are both held, no effect;
        the second booking of a slot is refused at intake and the first is made, one effect."""
        requests = [self.request(case, n=6) for case in ("same_object_1", "same_object_2")]
        actions, refused = [], []
        with transaction.atomic():
            for request in requests:
                try:
                    actions.append(self.own(action_request(**request)[0]))
                except SlotTaken as exc:
                    refused.append({"operation_key": request["operation_key"], "refused": "booking_conflict",
                                    "reason": str(exc)})
        settled = [self.run_until_settled(a, action_claim_next(self.owner, only=a.pk), self.seconds())
                   for a in actions]
        effects = [self.provider.find_effect(a) for a in settled]
        shown = {"actions": [_shown(a) for a in settled], "refused": refused, "lookups": [e.evidence for e in effects]}
        made = sum(e.found is True for e in effects)
        if any(e.found is None for e in effects):
            raise CaseFailed("the provider cannot say what it holds for these actions", **shown)
        if made > 1:
            raise CaseFailed("both actions reached the provider", **shown)
        if self.run.action_type == ActionType.CREATE_BOOKING and (made, len(refused)) != (1, 1):
            raise CaseFailed(f"{made} bookings made and {len(refused)} refused at intake, not one of each", **shown)
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
