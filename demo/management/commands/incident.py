from datetime import UTC, datetime

import httpx
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from demo.incident import (RUNS, IncidentRefused, Ticket, incident_agent, incident_replay, ledger_record, refunded,
                           stack_answers)

COLUMN = 44


class Command(BaseCommand):
    help = (
        "Replay the incident Surety exists for on a running stack (`make run`): an agent decides one refund, "
        f"its process is SIGKILLed right after the refund call and restarted from its first message, {RUNS} "
        "runs; once with a tool calling the sandbox provider directly, once through Surety. Prints the refunds "
        "at the sandbox side by side, the ledger's action and its audit trail. Exits 1 unless the Surety runs "
        "made exactly one refund."
    )

    def add_arguments(self, parser):
        parser.add_argument("--url", default=settings.SITE_URL,
                            help="the running stack: web app and its sandbox (default SITE_URL, %(default)s)")
        parser.add_argument("--agent", default="incident-bot",
                            help="the agent to act as: created on first use, its token rotated after")
        parser.add_argument("--owner", default="olga", help="the person who owns the agent, if it is created")
        parser.add_argument("--by", default="ada",
                            help="the person who makes its refund grant live, if it is not (not the owner)")

    def handle(self, url, agent, owner, by, **options):
        if settings.PRODUCTION:
            raise CommandError("the incident replay refunds at the sandbox provider, which production turns off")
        url = url.rstrip("/")
        ticket = Ticket.new()
        try:
            stack_answers(url)
            _, token = incident_agent(agent, owner=owner, by=by)
            naive, surety = incident_replay(url, token, ticket)
            action, events, page = ledger_record(url, token, surety.answers[0]["operation_key"])
        except IncidentRefused as exc:
            raise CommandError(str(exc)) from None
        except httpx.HTTPError as exc:
            raise CommandError(f"the stack at {url} did not answer as expected: {exc} (is `make run` running? "
                               "--url names the stack)") from None
        for line in report(url, ticket, naive, surety, action, events, page):
            self.stdout.write(line)
        if len(surety.refunds) != 1:
            raise CommandError(f"through Surety the sandbox holds {len(surety.refunds)} refunds for the decision, "
                               "not one")


def report(url, ticket, naive, surety, action, events, page):
    money = f"{ticket.amount} {ticket.currency}"
    yield f"The incident, replayed live on {url}"
    yield (f"{ticket.customer} asks for a refund of {money} on {ticket.order}; the agent decides it once "
           f"({ticket.decision_id}).")
    yield (f"Its process is SIGKILLed right after the refund call and restarted from its first message: {RUNS} "
           "runs per tool.")
    yield ""
    yield row("refunds at the sandbox", "without a ledger (provider directly)", "through Surety")
    for n, (plain, guarded) in enumerate(zip(naive.answers, surety.answers, strict=True)):
        yield row(f"  after run {n + 1}", f"{naive.refunds_after[n]}  {plain['refund']}",
                  f"{surety.refunds_after[n]}  {guarded['refund'] or guarded['status']} "
                  + ("(already recorded)" if guarded["replayed"] else "(recorded now)"))
    yield row("  in all", f"{plural(len(naive.refunds))}, {refunded(naive.refunds)} {ticket.currency}",
              f"{plural(len(surety.refunds))}, {refunded(surety.refunds)} {ticket.currency}")
    yield ""
    yield f"The ledger's action, the checkpoint each restart found: {action['operation_key']}"
    yield f"  status {action['status']}, attempts {action['attempts']}, external_ref {action['external_ref']}"
    yield "  audit trail:"
    for event in events:
        at = datetime.fromisoformat(event["occurred_at"]).astimezone(UTC)
        yield f"    {at:%Y-%m-%d %H:%M:%S}.{at.microsecond // 1000:03d} UTC  {event['verb']:<12} {event['actor']}"
    yield f"  dashboard: {page}"
    yield ""
    yield (f"One decision: {plural(len(naive.refunds))} without a ledger, {plural(len(surety.refunds))} "
           "through Surety.")


def row(label, left, right):
    return f"{label:<24}{left:<{COLUMN}}{right}"


def plural(count):
    return f"{count} refund" + ("" if count == 1 else "s")
