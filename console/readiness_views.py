"""The connectors' readiness page and the grants' live state on the agents page.

Per action type: its connector (name, class, options with secrets masked, its test mode),
the last replay run, the run that opens the gate (ledger.grants.passing_run) if any, and a button that runs the replay set as an RQ job. Promoting a grant (or renewing
it) is here too: ledger.grants decides; these views only ask and say what it answered.
"""

from datetime import UTC, datetime, time

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from ledger.connectors import NoConnector
from ledger.connectors.test_mode import connector_description, connector_version
from ledger.grants import GrantRefused, agents_grants, capability, grant_promote, passing_run
from ledger.jobs import enqueue
from ledger.models import ActionType, Agent, Capability, ReplayRun
from ledger.replay import last_runs, replay_run_job, replay_start

from .dashboard import staff_required
from .stepup import step_up_required


def _may_manage(request):
    if not request.user.has_perm("ledger.change_agent"):
        raise PermissionDenied("running the replay set and promoting grants need the change_agent permission")


@staff_required
def connector_readiness(request):
    rows = []
    for action_type, run in last_runs().items():
        try:
            connector, version, problem = connector_description(action_type), connector_version(action_type), ""
        except (NoConnector, ImportError) as exc:
            connector, version, problem = None, "", str(exc)
        rows.append({"action_type": action_type, "connector": connector, "problem": problem, "run": run,
                     "passing": passing_run(action_type), "stale": bool(run and run.connector_version != version)})
    return render(request, "ledger/connectors.html", {
        "rows": rows, "may_manage": request.user.has_perm("ledger.change_agent")})


@staff_required
@require_POST
def replay_run_start(request, action_type):
    _may_manage(request)
    if action_type not in ActionType.values:
        messages.error(request, f"{action_type!r} is not an action type")
        return redirect("connectors")
    with transaction.atomic():
        run = replay_start(action_type, actor=request.user)
        transaction.on_commit(lambda: enqueue(replay_run_job, run.pk))
    messages.success(request, f"Replay run {run.pk} of {action_type} started: its cases appear as they end.")
    return redirect("replay-run", pk=run.pk)


@staff_required
def replay_run_detail(request, pk):
    return render(request, "ledger/replay_run.html", {"run": get_object_or_404(ReplayRun, pk=pk)})


@staff_required
@step_up_required
@require_POST
def agent_grant_promote(request, pk):
    """Make an agent's grant for an action type live until the review date, or renew it."""
    _may_manage(request)
    agent = get_object_or_404(Agent, pk=pk)
    action_type = request.POST.get("action_type", "")
    review_by = _end_of_day(request.POST.get("review_by", ""))
    if action_type not in ActionType.values or review_by is False:
        messages.error(request, "Choose an action type and a review date (YYYY-MM-DD).")
        return redirect("agent-list")
    try:
        grant = grant_promote(agent, capability(Capability.Kind.ACTION_TYPE, action_type), actor=request.user,
                              reason=request.POST.get("reason", ""), review_by=review_by)
    except GrantRefused as exc:
        messages.error(request, f"Not promoted: {exc}.")
        return redirect("agent-list")
    messages.success(request, f"{agent.name} acts for real on {action_type} until {grant.live_until:%Y-%m-%d}.")
    return redirect("agent-list")


def _end_of_day(text):
    """A review date as the end of that day (UTC); None if empty (the default applies), False if not a date."""
    if not text.strip():
        return None
    try:
        day = datetime.strptime(text.strip(), "%Y-%m-%d").date()
    except ValueError:
        return False
    return datetime.combine(day, time.max, tzinfo=UTC)


def with_grant_states(agents):
    """The agents, each with `grants_shown`: (capability, state, grant) for the agents page."""
    agents = list(agents)
    shown = agents_grants(agents)  # on the database's clock, as the checks read them
    for agent in agents:
        agent.grants_shown = shown[agent.pk]
    return agents
