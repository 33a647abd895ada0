"""Which page a person is sent to, with a GET, when what they asked for is not carried on: signing in
again once their session ended (console.dashboard.staff_required), a factor given once the decision
it was asked for is no longer kept (console.stepup). Both follow one rule, `page_to_return_to`: an
address only a POST opens, sent to with a GET, is a 405."""

import inspect
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings
from django.shortcuts import resolve_url
from django.urls import Resolver404, resolve, reverse
from django.utils.functional import lazy
from django.utils.http import url_has_allowed_host_and_scheme

# The pages where a second factor is given: a stashed decision waits through them, and no other
# (console.stepup); a decision replayed there shows its answer at their address.
FACTOR_PAGES = lazy(lambda: {reverse("mfa_reauthenticate"), reverse("mfa_reauthenticate_webauthn")}, set)()


def page_shown(request):
    """The page of this site the person is on, path and query, as the browser names it (htmx in
    HX-Current-URL, a form in the Referer), or None: none named, or one of another site."""
    url = request.htmx.current_url if getattr(request, "htmx", False) else request.headers.get("Referer")
    if not url or not url_has_allowed_host_and_scheme(url, allowed_hosts={request.get_host()},
                                                      require_https=request.is_secure()):
        return None
    url = urlsplit(url)
    return urlunsplit(("", "", url.path, url.query, ""))


def _methods_taken(view):
    """The methods Django's require_http_methods (require_POST's) lets through to `view`, if
    `view` is its gate: it keeps them in its closure, and says them nowhere else."""
    return inspect.getclosurevars(view).nonlocals.get("request_method_list") if inspect.isfunction(view) else None


def opens_for_get(path):
    """Whether a GET of this site's `path` is answered with a page: a view answers it, and its
    gate, if it has one under the decorators around it (`functools.wraps`), lets a GET through."""
    try:
        view = resolve(path).func
    except Resolver404:
        return False
    methods = _methods_taken(inspect.unwrap(view, stop=lambda layer: _methods_taken(layer) is not None))
    return methods is None or "GET" in methods


def page_to_return_to(request):
    """The page the person was on, as the browser named it (`page_shown`), where a GET opens that
    page; else the address asked for, its query too, where a GET opens it; else the nearest page above it that a
    GET opens (the item's, the list's); else the dashboard. The browser names an address only a
    POST opens when its page was a POST's answer (a bulk discard's confirmation, a bulk redrive's
    start refused), and a factor page when a decision replayed there showed its answer: neither is
    a page to come back to."""
    shown = page_shown(request)
    if shown and urlsplit(shown).path not in FACTOR_PAGES and opens_for_get(urlsplit(shown).path):
        return shown
    path = request.path
    while path != "/":
        if opens_for_get(path):
            return request.get_full_path() if path == request.path else path
        path = path.rstrip("/").rsplit("/", 1)[0] + "/"
    return resolve_url(settings.LOGIN_REDIRECT_URL)
