"""Whether SITE_URL reaches this deployment, checked, never assumed.

The replay set's webhook case posts signed events to SITE_URL, and `make run` announces it:
left at its default, or pointing at another app, that would be another server's answer. So
the caller sends a random nonce to `<SITE_URL>/site-probe` and compares the answer with an
HMAC of it under this deployment's SECRET_KEY (with a salt of its own, so the answer is of no
use for anything else Django signs): only a server holding the same key can answer it.
"""

import secrets
from urllib.parse import quote

from django.http import JsonResponse
from django.views.decorators.cache import never_cache
from django.utils.crypto import constant_time_compare, salted_hmac
from django.views.decorators.http import require_GET

from .api.problems import problem_response
from .connectors import http

_SALT = "surety.site_url.probe"
_NONCE_CHARS = 64


def probe_answer(nonce):
    return salted_hmac(_SALT, nonce, algorithm="sha256").hexdigest()


@never_cache
@require_GET
def site_probe(request):
    nonce = request.GET.get("nonce", "")
    if not (0 < len(nonce) <= _NONCE_CHARS and nonce.isascii() and nonce.isalnum()):
        return problem_response(400, "invalid", "Invalid request", f"nonce must be 1 to {_NONCE_CHARS} letters or digits")
    return JsonResponse({"answer": probe_answer(nonce)})


def site_url_problem(site_url):
    """"" if `site_url` reaches this deployment, else what is wrong, naming it.

    1. Send a fresh nonce to `<site_url>/site-probe`.
    2. Compare the answer with this deployment's own HMAC of it.
    """
    nonce = secrets.token_hex(16)
    url = f"{site_url.rstrip('/')}/site-probe?nonce={quote(nonce)}"
    try:
        answer = http.call("GET", url, headers={"Accept": "application/json"})
    except http.ProviderError as exc:
        return f"SITE_URL {site_url} does not reach this deployment: {url} answered {exc}"
    given = answer.get("answer") if isinstance(answer, dict) else None
    if not isinstance(given, str) or not constant_time_compare(given, probe_answer(nonce)):
        return (f"SITE_URL {site_url} does not reach this deployment: another server answered its signed probe "
                f"({str(answer)[:200]}); set SITE_URL to this deployment's own address")
    return ""
