"""A real agent framework's tool loop through Surety's MCP server: pydantic-ai's MCP client
with a scripted model (agent_script.py), its process SIGKILLed mid-call, on the answer and
just after the call, and started again from its first message each time, against the live
stack. The last run completes with one refund at the provider; restarts whose model writes
the amount as "25" or as 24.99 make none. And with nothing listening at SURETY_URL, the agent
calls again as `retry: true` says, without its framework stopping it."""

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from ledger.models import Action
from surety_client import mcp_server
from tests.conftest import PYTHON, free_port, wait_until
from tests.factories import api_client, make_agent, sandbox, sandbox_list

pytestmark = pytest.mark.django_db(transaction=True)

SCRIPT = Path(__file__).with_name("agent_script.py")
ORDER, DECISION = "ORD-A1", "dec-1"
# An agent's start is two Pythons' imports, pydantic-ai's and then its MCP server's: 6 s on a quiet
# 2-core machine, 15 s beside two busy processes, past 30 s at a load of 9. The waits below end as
# soon as the agent gets where they wait for it; this bound only ends a run that never does. What
# the test is about (a refund made again on a restart) is caught by the refunds counted, not by a time.
STARTED_AND_THERE = 90


class AgentProcess:
    """One run of the agent from its first message; its transcript is a file of its own."""

    def __init__(self, url, token, folder, amount, *options):
        self.transcript = folder / f"run-{len(list(folder.glob('run-*.jsonl'))) + 1}.jsonl"
        self.transcript.touch()
        self.stderr = self.transcript.with_suffix(".stderr")
        with open(self.stderr, "w") as stderr:
            self.process = subprocess.Popen(
                [PYTHON, str(SCRIPT), str(self.transcript), "--order", ORDER, "--amount", amount,
                 "--decision", DECISION, *options],
                env={**os.environ, "SURETY_URL": url, "SURETY_TOKEN": token},
                stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True,
            )

    def events(self, kind=None):
        # Only whole lines: the agent may be writing the last one.
        lines = self.transcript.read_text().split("\n")[:-1]
        return [event for event in map(json.loads, lines) if kind in (None, event["event"])]

    def calls(self):
        return [event["tool"] for event in self.events("call")]

    def kill_when(self, reached, what):
        """SIGKILL the agent (and the MCP server it started) once `reached(self)` holds; it must
        still be running then."""
        wait_until(lambda: reached(self) or self.process.poll() is not None, seconds=STARTED_AND_THERE,
                   message=what)
        assert self.process.poll() is None, f"the agent ended before {what}: {self.stderr.read_text()}"
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def complete(self, seconds=STARTED_AND_THERE):
        assert self.process.wait(seconds) == 0, self.stderr.read_text()
        return self.events("reply")[-1]["text"]

    def answers_seen(self):
        """The tool answers in the messages the model was last handed, as pydantic-ai gave them."""
        seen = self.events("turn")[-1]["seen"]
        return [part["content"] for message in seen for part in message["parts"]
                if part["part_kind"] in ("tool-return", "retry-prompt")]


def test_a_pydantic_ai_agent_killed_three_times_and_restarted_makes_one_refund(stack, tmp_path):
    token = make_agent("agent-bot")[1]
    with api_client(stack.url, token) as provider:
        def run(amount="25.00", *options):
            return AgentProcess(stack.url, token, tmp_path, amount, *options)

        def refunds():
            return [refund["amount"] for refund in sandbox_list(provider, "refunds", order_id=ORDER)]

        # No worker yet, so each kill finds the refund still in the works (a slow provider,
        # as far as the agent can tell). Each kill lands while the agent is still where it was seen:
        # here the refund tool waits 30 s for the outcome (2 s by default), and the second run's
        # model thinks 3 s (0.5 s) before it acts on the answer, time enough for a loaded machine's
        # test to see it and kill. A kill that came late would find the second turn, or the call,
        # that the assertion after it refuses.
        first = run("25.00", "--wait", "30")
        first.kill_when(lambda agent: agent.calls() == ["refund"] and Action.objects.filter(target=ORDER).exists(),
                        "the refund call to reach Surety")
        assert first.calls() == ["refund"] and len(first.events("turn")) == 1  # killed mid-call
        second = run("25.00", "--think", "3")
        second.kill_when(lambda agent: len(agent.events("turn")) == 2, "the refund's answer to reach the model")
        assert second.calls() == ["refund"]  # killed on the answer, before the model acted on it
        third = run()
        third.kill_when(lambda agent: agent.calls() == ["refund", "wait_for_action"], "the model to act on the answer")
        assert Action.objects.filter(target=ORDER).count() == 1 and refunds() == []

        # The worker starts while the last run's model waits, as the answer told it to. The
        # provider commits the refund and its answer is lost: the ledger proves it by lookup.
        sandbox(provider, "POST", "faults", json={"target": ORDER, "fault": "timeout_after_commit", "times": 1})
        last = run()
        wait_until(lambda: len(last.events("turn")) == 2, seconds=STARTED_AND_THERE, message="the refund's answer")
        stack.start_worker()
        assert last.complete().startswith("Done: refund succeeded")
        # The server's instructions reach the model, with every turn: how to choose a decision_id, above all.
        assert all(mcp_server.INSTRUCTIONS in (turn["instructions"] or "") for turn in last.events("turn"))
        # A wait is 30 s; a worker starting at a load of 9 may not have settled the refund in the first,
        # and the model then waits again, as the answer tells it to.
        refund_answer, *waits, waited = last.answers_seen()
        assert refund_answer["replayed"] is True and refund_answer["guidance"].startswith(
            "Already recorded for this decision; nothing was done again.")
        assert [answer["next_tool"]["name"] for answer in (refund_answer, *waits)] == ["wait_for_action"] * (
            1 + len(waits))
        assert waited["status"] == "succeeded" and waited["guidance"].startswith("Done: refund succeeded")
        assert refunds() == ["25.00"]

        # Two more restarts at once, whose model writes the amount otherwise.
        respelt, rewritten = run("25"), run("24.99")
        assert respelt.complete().startswith("Already recorded for this decision; nothing was done again. Done")
        assert respelt.calls() == ["refund"]
        refusal = rewritten.complete()
        assert rewritten.calls() == ["refund"]  # the model read that it must not retry
        assert "idempotency_key_reused" in refusal and "Do not retry this decision" in refusal
        (answer,) = rewritten.answers_seen()  # a tool error: pydantic-ai's retry prompt, the structured content
        answer = json.loads(answer)
        assert answer["code"] == "idempotency_key_reused" and answer["retry"] is False
        assert "Do not retry this decision" in answer["guidance"]

        assert refunds() == ["25.00"]
        assert list(Action.objects.filter(target=ORDER).values_list("params__amount", flat=True)) == ["25.00"]


def test_an_agent_that_calls_again_as_retry_true_says_is_not_stopped_by_its_framework(tmp_path):
    """Nothing listens at SURETY_URL (Surety briefly away): each refund call answers `unreachable`,
    `retry: true`, "make the same call again". Answered as a tool error, pydantic-ai counted it against
    the tool's retry budget (1 by default, as here) and ended the run on the second one, with
    UnexpectedModelBehavior. The model calls again, twice, then gives up and tells the user."""
    agent = AgentProcess(f"http://127.0.0.1:{free_port()}", "tok", tmp_path, "25.00", "--tries", "3", "--think", "0")
    reply = agent.complete(seconds=120)  # each call is the client's retries, with their backoff: seconds
    assert agent.calls() == ["refund"] * 3
    assert reply.startswith("Refused (unreachable): ") and "Make the same call again" in reply
    answers = agent.answers_seen()  # results, each handed to the model as its structured content
    assert [(answer["code"], answer["retry"], answer["next_tool"]) for answer in answers] == [
        ("unreachable", True, None)] * 3
