"""Step-up: a money decision needs a second factor given within the last STEP_UP_SECONDS.

`step_up_required` is the one check, on each view that approves, releases, marks succeeded,
redrives, promotes a grant or changes a limit. Without a fresh factor the request is stashed
(allauth's reauthentication flow keeps its method, path and form) and the person is asked for
their factor on the spot; once given, allauth replays the stashed request, form and all, and the
check finds the factor. The factor (its type and when it was given) goes into every audit event
the decision writes (ledger.middleware.current_step_up). A person with no second factor is sent
to enrol one. STEP_UP_SECONDS = 0 switches the check off.

A stashed decision is the person's only while they are on their way to the factor: it is dropped
once they navigate elsewhere, and once STEP_UP_SECONDS have passed since it was asked
(`StashedDecisionMiddleware`). Kept, a factor given hours later, on a link anyone could have sent
(the factor page with its `next`), took a decision the person had abandoned. A factor given with
no decision kept leads back to the page the decision was asked from (`page_to_return_to`, the
rule signing in again follows too), not on to the factor page's `next`, where allauth sends the
person: the decision's address, which only a POST opens.
"""

import copy
import time
from datetime import UTC, datetime
from functools import wraps
from urllib.parse import urlencode

from allauth.account.adapter import get_adapter
from allauth.account.authentication import get_authentication_records
from allauth.account.internal.flows.reauthentication import STATE_SESSION_KEY, suspend_request
from django.contrib.auth import REDIRECT_FIELD_NAME
from django.conf import settings
from django.contrib import messages
from django.http import HttpResponseRedirect
from django.urls import reverse

from ledger.middleware import current_step_up

from .pages import FACTOR_PAGES, page_to_return_to
from .signin import redirect


def fresh_factor(request):
    """The latest second factor this session gave within STEP_UP_SECONDS, at sign-in or since:
    {"method": "totp" | "webauthn" | "recovery_codes", "at": ISO time}, or None."""
    given = [r for r in get_authentication_records(request, request.user) if r.get("method") == "mfa"]
    if not given or time.time() - given[-1]["at"] >= settings.STEP_UP_SECONDS:
        return None
    return {"method": given[-1]["type"], "at": datetime.fromtimestamp(given[-1]["at"], UTC).isoformat()}


# The page the latest decision stashed for a factor was posted from (`page_to_return_to`), kept
# after the stash is dropped (`StashedDecisionMiddleware`): a factor given then leads there,
# nothing decided.
ASKED_FROM = "step_up_asked_from"


def ask_for_factor(request, *, replay=True):
    """Stash the request and send the person to give their second factor (or to enrol one);
    without `replay`, send them back to the page once it is given, nothing stashed."""
    # A passkey first where the person has one: one touch, and nothing to phish.
    asks = sorted(get_adapter().get_reauthentication_methods(request.user), key=lambda m: not m["id"].endswith("webauthn"))
    if not asks:
        messages.warning(request, "A money decision needs a second factor: add one, then decide again.")
        return redirect(request, reverse("mfa_index"))
    if not replay:
        return redirect(request, f"{asks[0]['url']}?{urlencode({REDIRECT_FIELD_NAME: request.get_full_path()})}")
    # The request replayed after the factor is a whole page's (the page left for the factor's):
    # stashed without htmx's headers, the view answers it with a whole page.
    stashed = copy.copy(request)
    stashed.META = {name: value for name, value in request.META.items() if not name.startswith("HTTP_HX_")}
    asked = suspend_request(stashed, asks[0]["url"])
    request.session[STATE_SESSION_KEY] = {**request.session[STATE_SESSION_KEY], "stashed_at": time.time()}
    request.session[ASKED_FROM] = {"decision": request.get_full_path(), "page": page_to_return_to(request)}
    return redirect(request, asked.url)


class StashedDecisionMiddleware:
    """Drops a request stashed for a factor (`ask_for_factor`'s decision, or allauth's own: a
    factor removed, recovery codes made) that the person abandoned: a page they navigated to other
    than the factor's, or STEP_UP_SECONDS after it was asked. A factor given with no decision kept
    leads to the page the decision was asked from (`page_to_return_to`, one a GET opens), not to
    its address (405 to the GET)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        state = request.session.get(STATE_SESSION_KEY) if settings.STEP_UP_SECONDS else None
        # Read first (a decision replayed there takes its path), and only where a factor is asked
        # for: most requests (the API's, the sandbox's) have neither, nor the factor pages' routes.
        asked_for = state or (request.method == "POST" and ASKED_FROM in request.session)
        on_factor_page = bool(asked_for) and request.path in FACTOR_PAGES
        if state and "request" in state:
            if "stashed_at" not in state:  # allauth's own (a factor removed, codes made): from now on
                request.session[STATE_SESSION_KEY] = state = {**state, "stashed_at": time.time()}
            stale = time.time() - state["stashed_at"] > settings.STEP_UP_SECONDS
            # A navigation (not the page's own fetches, nor a favicon) to any other page.
            elsewhere = request.headers.get("Sec-Fetch-Mode") == "navigate" and not on_factor_page
            if stale or elsewhere:
                del request.session[STATE_SESSION_KEY]
        response = self.get_response(request)
        if on_factor_page and request.method == "POST" and response.status_code == 302:  # a factor given
            asked = request.session.pop(ASKED_FROM, None)
            if asked and response.url == asked["decision"]:  # nothing replayed
                return HttpResponseRedirect(asked["page"])
        return response


def step_up_required(view, *, every_request=False):
    """Checks a view's POSTs (its GETs only show) for a fresh second factor; see the module.
    `every_request`: its GETs too, and a POST without one is not replayed once the factor is given
    but sent back to its page (the admin's: it answers a POST with a page whose form posts to its
    own address, which, replayed from the factor page, would be the factor page's)."""

    @wraps(view)
    def checked(request, *args, **kwargs):
        if not settings.STEP_UP_SECONDS or (request.method != "POST" and not every_request):
            return view(request, *args, **kwargs)
        factor = fresh_factor(request)
        if factor is None:
            return ask_for_factor(request, replay=not every_request)
        token = current_step_up.set(factor)
        try:
            return view(request, *args, **kwargs)
        finally:
            current_step_up.reset(token)

    return checked
