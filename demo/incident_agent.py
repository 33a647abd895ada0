"""The agent of the incident replay (`manage.py incident`), run as a process of its own.

A support agent in its simplest form: it reads its conversation from the first message, the
(scripted) model decides one refund, and the agent calls its refund tool. It is given one of
two tools, as a team would write one or the other:

- `naive`: the provider's refund endpoint called straight away (`POST /sandbox/v1/refunds`
  with the provider key and no Idempotency-Key), as a tool wrapping a payments SDK does;
- `surety`: the refund recorded through Surety (`SuretyClient.refund`), keyed by the decision,
  then its outcome read back.

It reads the stack's URL and its token from `SURETY_URL` and `SURETY_TOKEN`, as the MCP server
does (the sandbox takes an agent's token as a provider key), and prints one JSON line per step.
Once the tool has answered it prints the answer and waits for its next turn on stdin: that is
where the replay SIGKILLs it, at the same point every run, as an agent whose process dies before
it could record that the refund was made. Restarted with the same arguments, it starts again
from its first message.

Only the standard library, httpx and the agents' client: an agent process knows nothing of
Django or the ledger's code.
"""

import argparse
import json
import os
import sys

import httpx
from surety_client import SuretyClient

OUTCOME_WAIT = 30  # seconds the Surety tool waits for the ledger to settle the refund


def say(step, **fields):
    print(json.dumps({"step": step, **fields}), flush=True)


def first_message(ticket):
    return (f"Hi, this is {ticket['customer']}. Order {ticket['order']} was charged twice: "
            f"please refund {ticket['amount']} {ticket['currency']}.")


def model_decides(ticket):
    """The model's turn on the first message, scripted: the same case leads to the same decision
    (its amount and decision id), which is what makes a restart from the first message repeat
    the tool call."""
    return {"tool": "refund", "order": ticket["order"], "customer": ticket["customer"], "amount": ticket["amount"],
            "currency": ticket["currency"], "decision_id": ticket["decision_id"]}


def refund_naive(url, token, call):
    response = httpx.post(f"{url}/sandbox/v1/refunds", headers={"Authorization": f"Bearer {token}"}, timeout=10,
                          json={"order_id": call["order"], "amount": call["amount"], "currency": call["currency"]})
    response.raise_for_status()
    return {"refund": response.json()["id"]}


def refund_through_surety(url, token, call):
    with SuretyClient(url, token) as surety:
        action = surety.refund(order=call["order"], amount=call["amount"], currency=call["currency"],
                               customer=call["customer"], decision_id=call["decision_id"])
        settled = surety.wait_for(action.operation_key, timeout=OUTCOME_WAIT)
    return {"operation_key": action.operation_key, "replayed": action.replayed, "status": settled.status,
            "refund": settled.external_ref}


TOOLS = {"naive": refund_naive, "surety": refund_through_surety}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tool", choices=TOOLS, required=True)
    parser.add_argument("--ticket", required=True, type=json.loads,
                        help="JSON: order, customer, amount, currency, decision_id")
    args = parser.parse_args(argv)
    say("message", text=first_message(args.ticket))
    call = model_decides(args.ticket)
    say("tool_call", **call)
    answer = TOOLS[args.tool](os.environ["SURETY_URL"].rstrip("/"), os.environ["SURETY_TOKEN"], call)
    say("tool_answered", **answer)
    sys.stdin.readline()  # the next turn: the replay kills the process here
    say("replied", text="Your refund is on its way.")


if __name__ == "__main__":
    main()
