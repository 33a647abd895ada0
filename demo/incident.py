"""The seed's incident, replayed live on a running stack (`manage.py incident`, `make incident`).

An agent decides one refund for one customer; its process is SIGKILLed right after the refund
call and restarted from its first message, run after run. The same agent (demo/incident_agent.py,
a process of its own) is replayed twice on one order at the stack's sandbox provider:

1. with a naive tool that calls the provider directly: every run refunds again;
2. with the refund through Surety, keyed by the decision: the first run records the action and
   a worker makes the refund, every restart finds the action recorded (the checkpoint).

What each run saw and what the sandbox holds after it are read back over HTTP, as anyone could
check them: the sandbox's own listing of the order's refunds (the naive tool's carry no
operation key, Surety's carry the action's), the action from the agents' API and its audit
trail from the action's evidence record.
"""

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from pathlib import Path
from urllib.parse import quote

import django_rq
import httpx
import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.urls import reverse
from rq import Worker

from ledger.agents import agent_create, agent_rotate_token
from ledger.grants import (GrantRefused, agent_grant, agent_may, capability, grant_promote, grant_state,
                           workers_version)
from ledger.jobs import redis_connection
from ledger.models import Action, Agent, Capability, GrantState
from ledger.site_url import site_url_problem

RUNS = 3
ACTOR = "system:incident"
REFUND = Capability.Kind.ACTION_TYPE, "refund"
ROOT = Path(__file__).resolve().parent.parent
AGENT_SECONDS = 60  # at most, for one run of the agent to answer its tool call
WORKER_START_SECONDS = 10  # at most, for a worker started with the stack to register


class IncidentRefused(Exception):
    """The replay cannot run as asked (no such person, a grant that cannot go live, a stack
    that does not answer): the message says what to do."""


@dataclass(frozen=True)
class Ticket:
    """The customer's case and the one refund decision taken on it."""

    order: str
    customer: str
    amount: str
    currency: str
    decision_id: str

    @classmethod
    def new(cls, amount="25.00", currency="EUR"):
        """A case of its own for every replay, so replays never meet at the sandbox or in the ledger."""
        tag = uuid.uuid4().hex[:8].upper()
        return cls(order=f"ORD-INC-{tag}", customer=f"CUST-INC-{tag}", amount=amount, currency=currency,
                   decision_id=f"dec-inc-{tag.lower()}")


@dataclass
class Replay:
    """One tool's replay: what each run's tool call answered, and how many refunds of the order
    the sandbox holds after each run."""

    answers: list = field(default_factory=list)
    refunds_after: list = field(default_factory=list)
    refunds: list = field(default_factory=list)  # the sandbox's listing once the runs are over


# --- the stack --------------------------------------------------------------------------------


def stack_answers(url):
    """Refuse, saying so, unless the web app at `url` is this deployment's: looked at before anything
    else, as the grant's promotion compares the replay run with the sandbox at `url`, and a stack
    on another port (`make run PORT=8001`, then `make incident`) was refused as a grant with no
    replay run."""
    problem = site_url_problem(url)
    if problem:
        raise IncidentRefused(f"this deployment's web app does not answer at {url}: is `make run` running? Give "
                              f"`make incident` the PORT it was given, and its DATABASE_URL if one was. ({problem})")


def workers_running(seconds=WORKER_START_SECONDS):
    """Refuse, saying so, unless RQ's registry holds a worker of the queue a worker is asked on
    which connector it runs, or does within `seconds` (one started with the stack registers once
    it has loaded the app): with none, the asking waited out its whole wait
    (ledger.grants.WAIT_SECONDS, two and a half minutes) for an answer nobody could give. RQ
    forgets a worker that stopped at once, and one that was killed once its key expires (its
    `--worker-ttl`)."""
    if not settings.RQ_ASYNC:  # jobs run in this process, which answers itself
        return
    deadline = time.monotonic() + seconds
    try:
        queue = django_rq.get_queue("default", connection=redis_connection())
        while not Worker.all(queue=queue):
            if time.monotonic() >= deadline:
                raise IncidentRefused("no RQ worker is running on this Redis, and the refunds through Surety are "
                                      "made by one: is `make run` running (it starts two)? Give `make incident` "
                                      "its REDIS_URL if it had one.")
            time.sleep(0.2)
    except redis.RedisError as exc:
        raise IncidentRefused(f"Redis does not answer ({exc}): is `make run` running? Give `make incident` its "
                              "REDIS_URL if it had one.") from None


# --- the agent and its token --------------------------------------------------------------------


def incident_agent(name, *, owner, by):
    """(agent, token) of the agent the replay acts as: created on first use, reused after with a
    new token (tokens are never stored, so none can be read back), its refund grant live.

    1. Create the agent (owned by `owner`), or rotate the token of the one of that name.
    2. Grant it refunds if it holds no such grant.
    3. Unless the grant is live, have `by` promote it: the product's rules hold (four eyes, a
       passing replay run of the refund connector as it is now), so a stack whose replay set
       never passed refuses here rather than recording refunds that never run.

    "As it is now" is the connector the stack's workers run, asked of one first (not under the
    agent's lock): they check the grant against it at every claim, and this process's settings
    may differ from `make run`'s. Without a worker running, that is said within seconds (`workers_running`).
    """
    workers_running()
    try:
        version = workers_version(REFUND[1])
    except GrantRefused as exc:
        raise IncidentRefused(f"{exc} (`make run` starts the workers)") from None
    with transaction.atomic():
        agent = Agent.objects.filter(name=name).first()
        if agent is None:
            agent, token = agent_create(name, actor=ACTOR, owner=_person(owner), grants=())
        else:
            token = agent_rotate_token(agent, actor=ACTOR, reason="a token for a replay of the incident")
        if not agent_may(agent, *REFUND):
            agent_grant(agent, capability(*REFUND), actor=ACTOR, reason="the agent of the incident replay refunds")
        agent = Agent.objects.get(pk=agent.pk)  # its grants_version, bumped by the grant
        if grant_state(agent, *REFUND, version=version) != GrantState.LIVE:
            try:
                grant_promote(agent, capability(*REFUND), actor=_person(by),
                              reason="make incident: the replay's refunds run for real at the sandbox",
                              version=version)
            except GrantRefused as exc:
                raise IncidentRefused(
                    f"{name}'s refund grant is shadow and cannot go live: {exc} (`make run` runs the replay set "
                    "at start; or `manage.py replay_check refund`)") from None
    return agent, token


def _person(username):
    user = get_user_model().objects.filter(username=username, is_active=True).first()
    if user is None:
        raise IncidentRefused(f"no active user named {username!r} (`make run` seeds the demo people)")
    return user


# --- the replay ---------------------------------------------------------------------------------


def incident_replay(url, token, ticket, runs=RUNS):
    """Both replays of `ticket` on the stack at `url`: (naive, surety), each a Replay."""
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=10) as http:
        order = http.post("/sandbox/v1/orders", json={"order_id": ticket.order, "customer": ticket.customer,
                                                       "amount": ticket.amount, "currency": ticket.currency})
        if order.status_code != 201:
            raise IncidentRefused(f"the sandbox at {url} did not create the order: {order.status_code} {order.text}")
        naive = _replay(http, url, token, ticket, "naive", runs)
        surety = _replay(http, url, token, ticket, "surety", runs)
    return naive, surety


def _replay(http, url, token, ticket, tool, runs):
    """`runs` runs of the agent with `tool`, each killed once its tool answered, and after each
    the order's refunds at the sandbox made by that tool: the naive tool sends no operation key,
    Surety's connector sends the action's (any key at all counts, a second one included)."""
    replay = Replay()
    for _ in range(runs):
        replay.answers.append(agent_run(url, token, tool, ticket))
        keyed = tool == "surety"
        replay.refunds = [r for r in sandbox_refunds(http, ticket.order) if bool(r["operation_key"]) == keyed]
        replay.refunds_after.append(len(replay.refunds))
    return replay


def agent_run(url, token, tool, ticket):
    """One run of the agent process from its first message, SIGKILLed as soon as its tool call
    has answered (it waits for its next turn there). Returns the tool's answer."""
    process = subprocess.Popen(
        [sys.executable, "-m", "demo.incident_agent", "--tool", tool, "--ticket", json.dumps(asdict(ticket))],
        cwd=ROOT, env={**os.environ, "SURETY_URL": url, "SURETY_TOKEN": token},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    watchdog = threading.Timer(AGENT_SECONDS, process.kill)  # an agent that hangs is ended too
    watchdog.start()
    answer = None
    with process:  # closes its pipes and waits for it
        try:
            for line in process.stdout:
                step = json.loads(line)
                if step["step"] == "tool_answered":
                    answer = step
                    break
        finally:
            process.kill()
            watchdog.cancel()
        errors = process.stderr.read()
    if answer is None:
        raise IncidentRefused(f"the {tool} agent ended before its tool answered: "
                              f"{errors.strip()[-2000:] or 'no output'}")
    return answer


def sandbox_refunds(http, order):
    """The sandbox's own listing of the order's refunds."""
    response = http.get("/sandbox/v1/refunds", params={"order_id": order})
    response.raise_for_status()
    return response.json()["data"]


def ledger_record(url, token, operation_key):
    """(the action as the agents' API shows it, its own audit events oldest first, its page on
    the dashboard)."""
    with httpx.Client(base_url=f"{url}/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=10) as api:
        path = f"/actions/{quote(operation_key, safe='')}"
        action = api.get(path)
        action.raise_for_status()
        evidence = api.get(f"{path}/evidence")
        evidence.raise_for_status()
    label = Action._meta.label_lower
    events = [e for e in evidence.json()["audit"]["events"] if e["object_type"] == label]
    pk = Action.objects.filter(operation_key=operation_key).values_list("pk", flat=True).get()
    return action.json(), events, url + reverse("action-detail", args=[pk])


def refunded(refunds):
    return sum((Decimal(r["amount"]) for r in refunds), Decimal(0))
