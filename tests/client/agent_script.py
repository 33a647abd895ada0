"""A pydantic-ai agent whose tool loop goes through Surety's MCP server (`surety-mcp` over
stdio), run as a process of its own by test_agent_framework.py, which SIGKILLs it and starts
it again from its first message.

    SURETY_URL=... SURETY_TOKEN=... python tests/client/agent_script.py TRANSCRIPT --order ORD-1 \
        --amount 25.00 --decision dec-1

The model is scripted (pydantic-ai's FunctionModel: no network, no LLM) as a model that
follows its tools' answers would act. From the customer's message it decides one refund and
calls the refund tool; then it reads the answer pydantic-ai hands it (the structured content
of the tool's result, or for a tool error the retry prompt made of it) and does what it says:
the `next_tool` while the refund is in the works, the same call again only where `retry` says
so (until it has made `--tries` calls: then it gives up, as a model told to call again "in a
little while" does), and otherwise it replies with the `guidance`. `--amount` is how this run's
model writes the amount: a model rewriting the conversation's summary may write "25" or "24.99".

Each model turn takes `--think` seconds, as a real model's does, and the transcript gets a
JSON line per event: `turn` (the messages the model was handed, as pydantic-ai serializes
them, and its instructions), `call` (a tool call the model makes), `reply` (its last word) and `done`.
"""

import argparse
import json
import os
import sys
from pathlib import Path

import anyio
from fastmcp.client.transports import StdioTransport
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.messages import ModelMessagesTypeAdapter, ModelRequest, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

# The MCP server as a host would start it: the console script installed beside this Python.
SURETY_MCP = str(Path(sys.executable).with_name("surety-mcp"))


def record(transcript, event, **fields):
    with open(transcript, "a") as out:
        out.write(json.dumps({"event": event, **fields}) + "\n")


def last_answer(messages):
    """The tool answer in the newest request, as the model reads it: a dict (the structured
    content) for a result, the parsed JSON of the retry prompt for a tool error; None before
    any tool was called."""
    request = messages[-1]
    for part in request.parts if isinstance(request, ModelRequest) else ():
        if getattr(part, "tool_name", None) and hasattr(part, "content"):
            content = part.content
            return content if isinstance(content, dict) else json.loads(content)
    return None


def scripted_model(args):
    async def model(messages: list, info: AgentInfo) -> ModelResponse:
        record(args.transcript, "turn", seen=ModelMessagesTypeAdapter.dump_python(messages, mode="json"),
               instructions=info.instructions)
        await anyio.sleep(args.think)
        answer = last_answer(messages)
        if answer is None:  # the customer's message: the model's decision
            call = ("refund", {"order": args.order, "amount": args.amount, "currency": "EUR",
                               "decision_id": args.decision, "customer": args.customer, "wait": args.wait})
        elif answer.get("next_tool"):
            call = (answer["next_tool"]["name"], answer["next_tool"]["arguments"])
        elif answer.get("retry") and len(calls_made(messages)) < args.tries:
            call = calls_made(messages)[-1]
        else:
            record(args.transcript, "reply", text=answer["guidance"])
            return ModelResponse(parts=[TextPart(answer["guidance"])])
        record(args.transcript, "call", tool=call[0], arguments=call[1])
        return ModelResponse(parts=[ToolCallPart(*call)])
    return model


def calls_made(messages):
    return [(part.tool_name, part.args) for message in messages if isinstance(message, ModelResponse)
            for part in message.parts if isinstance(part, ToolCallPart)]


async def main(args):
    env = {name: os.environ[name] for name in ("SURETY_URL", "SURETY_TOKEN")}
    # The server's start is its Python's imports: seconds on a loaded machine, past pydantic-ai's 5 s default.
    # Its instructions (how to choose a decision_id, what each outcome means) reach the model only when
    # asked for: pydantic-ai leaves a server's instructions out by default.
    surety = MCPToolset(StdioTransport(SURETY_MCP, [], env=env), init_timeout=60, include_instructions=True)
    agent = Agent(FunctionModel(scripted_model(args)), toolsets=[surety])
    async with agent:
        result = await agent.run(f"Hi, order {args.order} was charged twice: please refund {args.amount} EUR. "
                                 f"(Your decision: {args.decision}.)")
    record(args.transcript, "done", output=result.output)


def arguments():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("transcript")
    parser.add_argument("--order", required=True)
    parser.add_argument("--customer", default="CUST-1")
    parser.add_argument("--amount", required=True)
    parser.add_argument("--decision", required=True)
    parser.add_argument("--wait", type=float, default=2, help="seconds the refund tool waits for the outcome")
    parser.add_argument("--think", type=float, default=0.5, help="seconds each model turn takes")
    parser.add_argument("--tries", type=int, default=sys.maxsize,
                        help="tool calls the model makes at most before it stops calling again where retry says so")
    return parser.parse_args()


if __name__ == "__main__":
    anyio.run(main, arguments())
