"""A team's own service over signed HTTP: the connector named "http".

Configured per action type with a `url` and a `secret`. It POSTs the action as JSON to the
url with the operation key as `Idempotency-Key` and a `Surety-Signature` header (the scheme
of the outbound alerts: `t=<unix seconds>,v1=<HMAC-SHA256 of "<t>.<raw body>">`), and looks
an effect up with `GET <url>/<percent-encoded operation key>`. What the service must answer
is in docs/connectors.md; `examples/receiver/` is a service that does. The replay set (ledger.replay)
stages its faults in front of the service's test URL; a service that arms faults itself (the
receiver's test mode, at `<url>/faults`, signed the same way) may be named as the test mode's
`faults_url`.
"""

import json
from urllib.parse import urlsplit

from ..key_paths import key_segment
from ..signing import sign_webhook
from . import http
from .base import Connector, Effect, Lookup

# How much of an answer that cannot be read is kept as evidence.
_EVIDENCE_CHARS = 500


class SignedHttpConnector(Connector):
    name = "http"
    base_option = "url"

    def __init__(self, *, url="", secret=""):
        super().__init__(url=url, secret=secret)
        self.url = (url or "").rstrip("/")
        self.secret = secret or ""

    def check(self):
        problems = []
        url = urlsplit(self.url)
        if url.scheme not in ("http", "https") or not url.netloc:
            problems.append(f"url {self.url!r} is not an http(s) address (CONNECTOR_<TYPE>_URL)")
        if not self.secret:
            problems.append("no signing secret (CONNECTOR_<TYPE>_SECRET)")
        return problems

    def signed(self, body):
        """The headers that make `body` this connector's own request."""
        return {"Content-Type": "application/json", "Surety-Signature": sign_webhook(body, self.secret)}

    def _send(self, action):
        body = json.dumps({
            "operation_key": action.operation_key, "action_type": action.action_type, "target": action.target,
            "customer": action.customer, "params": action.params, "decision_id": action.decision_id,
        }).encode()
        try:
            answer = http.call("POST", self.url, content=body,
                               headers={**self.signed(body), "Idempotency-Key": action.operation_key})
        except http.Rejected as exc:
            http.raise_if_no_refusal(exc)
            raise
        reference = _reference(answer)
        if reference is None:
            # A 2xx we cannot read (a proxy's HTML page, JSON cut short) may still mean the
            # service acted: only a look-up by key can tell.
            raise http.OutcomeUnknown(f"POST {self.url}: an answer without an id: {_excerpt(answer)}",
                                      code="unreadable_answer")
        return Effect(external_ref=reference, result=answer)

    def find_effect(self, action):
        url = f"{self.url}/{key_segment(action.operation_key)}"
        try:
            answer = http.call("GET", url, headers={"Accept": "application/json"})
        except http.Rejected as exc:
            # Only the service's own "not found" proves absence: a 404 page from a proxy or a
            # route the service lacks would otherwise send the effect a second time.
            if exc.status == 404 and exc.code == "not_found":
                return Lookup(found=False, evidence={"lookup": f"GET {url}", "answer": exc.evidence()})
            return Lookup(found=None, evidence={"lookup": f"GET {url}", "answer": exc.evidence()})
        except http.ProviderError as exc:
            return Lookup(found=None, evidence={"lookup": f"GET {url}", "answer": exc.evidence()})
        reference = _reference(answer)
        if reference is None:
            return Lookup(found=None, evidence={"lookup": f"GET {url}", "unreadable_answer": _excerpt(answer)})
        return Lookup(found=True, external_ref=reference, result=answer, evidence={"lookup": f"GET {url}", "id": reference})


def _reference(answer):
    reference = answer.get("id") if isinstance(answer, dict) else None
    return str(reference)[:255] if isinstance(reference, (str, int)) and str(reference) else None


def _excerpt(answer):
    return json.dumps(answer)[:_EVIDENCE_CHARS]
