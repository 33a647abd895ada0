"""A provider's failure message reaches the action's error (and its evidence, and a task's last
error) as text of at most 1,000 characters, whatever the provider, or anything answering in its
place, put there: a longer one is cut, saying how long it was, and one that is no string (an object,
a list, `true`) is its JSON text, cut alike. And no answer is read past 10 MiB: one that runs
longer is the provider's fault, an unknown outcome, never a refusal nor a success (docs/connectors.md).
The providers are the stubs of the codes' tests (tests/ledger/test_provider_codes_bounded.py), over
real HTTP."""

import gzip
import json
import re

import pytest

from tests.ledger import test_provider_codes_bounded as codes
from tests.ledger.test_provider_codes_bounded import (  # noqa: F401 (a fixture)
    UNREADABLE,
    provider,
    refused_by_the_sandbox,
    run_once_at_stripe,
    scripted,
    stripe_error,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("jobs_to_test_redis")]

MESSAGE_MAX_CHARS = 1000  # docs/connectors.md
ANSWER_MAX_BYTES = 10 * 1024 * 1024  # docs/connectors.md
NO_STRINGS = {
    "an_object": UNREADABLE["an_object"],
    "a_list": UNREADABLE["a_list"],
    "true": UNREADABLE["true"],
    "a_long_object": {"detail": "x" * 1_000_000},
}


def answering(rewrite, *, gzipped=False):
    """The codes' tests' sandbox stub (its `provider`), each of its answers' bodies rewritten by
    `rewrite`; `gzipped`, sent gzip-encoded (`Content-Encoding: gzip`)."""

    def stub(status, code):
        handler, made = provider(status, code)

        class Rewritten(handler):
            def _send(self, status_line, body):
                if not gzipped:
                    return super()._send(status_line, rewrite(body))
                content = gzip.compress(json.dumps(rewrite(body)).encode())
                self.send_response(status_line)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Encoding", "gzip")
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

        return Rewritten, made

    return stub


def refused_saying(settings, monkeypatch, message, status=422):
    """The sandbox's refusal (its code `declined`), its message `message`."""
    monkeypatch.setattr(codes, "provider", answering(lambda body: {"error": {**body["error"], "message": message}}))
    return refused_by_the_sandbox(settings, status, "declined")


def assert_bounded(message, came):
    """At most MESSAGE_MAX_CHARS; the start of what came (as JSON text if it was no string), and,
    if cut, how long the message was, what came and the connector's words before it."""
    text = came if isinstance(came, str) else json.dumps(came)
    assert len(message) <= MESSAGE_MAX_CHARS
    assert text[:40] in message
    if len(text) > MESSAGE_MAX_CHARS:
        cut = re.search(r" … \[cut: (\d+) characters in all\]$", message)
        assert cut, message[-80:]
        assert len(text) < int(cut[1]) < len(text) + 100


def test_a_refusal_whose_message_is_a_megabyte_keeps_its_start_and_says_how_long_it_was(settings, monkeypatch):
    action = refused_saying(settings, monkeypatch, UNREADABLE["a_megabyte"])

    assert (action.status, action.error["code"]) == ("failed", "declined")
    assert_bounded(action.error["message"], UNREADABLE["a_megabyte"])


@pytest.mark.parametrize("message", NO_STRINGS.values(), ids=NO_STRINGS.keys())
def test_a_refusal_whose_message_is_no_string_keeps_its_json_text(settings, monkeypatch, message):
    action = refused_saying(settings, monkeypatch, message)

    assert (action.status, action.error["code"]) == ("failed", "declined")
    assert_bounded(action.error["message"], message)


def test_a_short_message_is_kept_as_it_came(settings, monkeypatch):
    action = refused_saying(settings, monkeypatch, "y" * 900)

    assert action.error["message"].endswith(": " + "y" * 900)


def test_an_unreadable_code_is_still_shown_after_a_message_that_was_cut(settings, monkeypatch):
    """The code's own part of the message survives the cut: it is what says what the code was."""
    monkeypatch.setattr(codes, "provider", answering(
        lambda body: {"error": {"code": UNREADABLE["an_object"], "message": UNREADABLE["a_megabyte"]}}))
    action = refused_by_the_sandbox(settings, 422, "ignored")

    assert action.error["code"] == "unreadable_code"
    assert len(action.error["message"]) <= MESSAGE_MAX_CHARS
    assert json.dumps(UNREADABLE["an_object"])[:40] in action.error["message"]


def test_an_unknown_outcome_keeps_its_message_bounded_in_the_evidence(settings, monkeypatch):
    """A 409 is an unknown outcome (the key still in use), its message kept in the evidence."""
    settings.CONNECTOR_TIMEOUT = 1
    action = refused_saying(settings, monkeypatch, UNREADABLE["a_megabyte"], status=409)

    assert action.status == "unknown"
    assert_bounded(action.evidence[-1]["message"], UNREADABLE["a_megabyte"])


@pytest.mark.parametrize("message", [UNREADABLE["a_megabyte"], UNREADABLE["an_object"]],
                         ids=["a_megabyte", "an_object"])
def test_a_stripe_refusal_keeps_its_message_bounded(scripted, message):  # noqa: F811
    scripted.script.append(stripe_error(402, "card_error", message, code="card_declined"))

    action = run_once_at_stripe("refund:ch_m:full", "ch_m")

    assert (action.status, action.error["code"]) == ("failed", "card_declined")
    assert_bounded(action.error["message"], message)


# An answer past the bound, to a write: the provider may have acted on the request, so whatever its
# status says, the outcome is unknown and verification looks for the effect.
PADDED = {
    "a_success": (201, lambda body: {"id": "re_big", "operation_key": "refund:ORD-C:full:dec-1",
                                     "pad": "x" * ANSWER_MAX_BYTES}),
    "a_refusal": (422, lambda body: {**body, "pad": "x" * ANSWER_MAX_BYTES}),
    "a_rate_limit": (429, lambda body: {**body, "pad": "x" * ANSWER_MAX_BYTES}),
}


@pytest.mark.parametrize(("status", "rewrite"), PADDED.values(), ids=PADDED.keys())
def test_an_answer_past_the_bound_is_an_unknown_outcome(settings, monkeypatch, status, rewrite):
    settings.CONNECTOR_TIMEOUT = 3
    monkeypatch.setattr(codes, "provider", answering(rewrite))
    action = refused_by_the_sandbox(settings, status, "declined")

    assert action.status == "unknown", action.error
    assert action.evidence[-1]["code"] == "unreadable_answer"
    assert action.external_ref == "" and action.result is None
    assert str(ANSWER_MAX_BYTES) in action.evidence[-1]["message"]


def test_a_gzipped_answer_is_bounded_as_it_decodes(settings, monkeypatch):
    """A few kilobytes on the wire, past the bound once decoded: the bound counts what is read."""
    settings.CONNECTOR_TIMEOUT = 3
    monkeypatch.setattr(codes, "provider", answering(PADDED["a_success"][1], gzipped=True))
    action = refused_by_the_sandbox(settings, 201, "declined")

    assert action.status == "unknown", action.error
    assert action.evidence[-1]["code"] == "unreadable_answer"


def test_an_answer_within_the_bound_is_read_whole(settings, monkeypatch):
    settings.CONNECTOR_TIMEOUT = 3
    monkeypatch.setattr(codes, "provider", answering(
        lambda body: {"id": "re_1", "pad": "x" * (ANSWER_MAX_BYTES - 100)}, gzipped=True))
    action = refused_by_the_sandbox(settings, 201, "declined")

    assert (action.status, action.external_ref, len(action.result["pad"])) == ("succeeded", "re_1",
                                                                              ANSWER_MAX_BYTES - 100)


def test_a_stripe_answer_past_the_bound_is_an_unknown_outcome(settings, scripted):  # noqa: F811
    settings.CONNECTOR_TIMEOUT = 3
    scripted.script.append(("answer", 402, json.dumps({"error": {
        "type": "card_error", "code": "card_declined", "message": "x" * ANSWER_MAX_BYTES}})))

    action = run_once_at_stripe("refund:ch_b:full", "ch_b")

    assert action.status == "unknown", action.error
    assert action.evidence[-1]["code"] == "unreadable_answer"


def answering_bytes(content, headers=()):
    """The codes' tests' sandbox stub, each answer's body `content` as it is, with `headers`."""

    def stub(status, code):
        handler, made = provider(status, code)

        class Raw(handler):
            def _send(self, status_line, body):
                self.send_response(status_line)
                self.send_header("Content-Type", "application/json")
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

        return Raw, made

    return stub


def test_an_answer_its_encoding_does_not_decode_is_an_unknown_outcome(settings, monkeypatch):
    """A success whose gzip stream is broken: the provider answered, so it may have acted."""
    settings.CONNECTOR_TIMEOUT = 3
    monkeypatch.setattr(codes, "provider", answering_bytes(b"this is no gzip stream", [("Content-Encoding", "gzip")]))
    action = refused_by_the_sandbox(settings, 201, "declined")

    assert action.status == "unknown", action.error
    assert action.evidence[-1]["code"] == "unreadable_answer"


def test_a_refusal_nested_deeper_than_the_parser_goes_is_read_as_text(settings, monkeypatch):
    """As any refusal that is not JSON: failed, its status's code, never an unexpected error."""
    settings.CONNECTOR_TIMEOUT = 3
    monkeypatch.setattr(codes, "provider", answering_bytes(b"[" * 100_000 + b"]" * 100_000))
    action = refused_by_the_sandbox(settings, 422, "declined")

    assert (action.status, action.error["code"]) == ("failed", "http_422"), action.error
