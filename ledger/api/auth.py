import time

from django.conf import settings
from django.utils.functional import SimpleLazyObject
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions, permissions
from rest_framework.throttling import BaseThrottle

from ledger.compiled import register_cache
from ledger.models import Agent

from .wire import well_formed_key


class AgentTokenAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer <token>`; request.user is the agent's user, request.auth the agent.

    On a view that says `finds_key = True` (the intake of actions), the statement that finds
    the agent also says whether the request's Idempotency-Key names a recorded action
    (`agent.key_action_id`) and reads the limits' version (`agent.limits_version`): a new
    key, the common case, then costs no statement of its own before its transaction."""

    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if not header:
            return None
        # An authentication scheme's name is case-insensitive (RFC 9110): "bearer" is "Bearer".
        if header[0].decode("latin-1").lower() != self.keyword.lower() or len(header) != 2:
            raise exceptions.AuthenticationFailed("Use 'Authorization: Bearer <token>'.")
        agent = Agent.objects.for_token(header[1].decode("latin-1"), operation_key=self._key(request))
        if agent is None:
            raise exceptions.AuthenticationFailed("Unknown or revoked token.")
        # The user only matters to code that asks for it (the API checks request.auth).
        return SimpleLazyObject(lambda: agent.user), agent

    @staticmethod
    def _key(request):
        if not getattr(request.parser_context.get("view"), "finds_key", False):
            return None
        key = request.headers.get("Idempotency-Key")
        return key if well_formed_key(key) else ""  # matches nothing; the view answers it with a 400

    def authenticate_header(self, request):
        return f'{self.keyword} realm="api"'


class IsAgent(permissions.BasePermission):
    """The request carries an active agent's token (request.auth is that agent)."""

    def has_permission(self, request, view):
        return isinstance(request.auth, Agent)


class AgentRateThrottle(BaseThrottle):
    """A fixed window per agent and process (API_RATE_LIMIT, e.g. "20000/min"): O(1) per
    request, where DRF's sliding window pickles a growing list into the cache each time.
    Per process, so the effective limit is this times the number of web processes."""

    def __init__(self):
        count, _, period = settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]["agent"].partition("/")
        self.limit = int(count)
        self.period = {"s": 1, "m": 60, "h": 3600, "d": 86400}[period[:1]]
        self.retry_after = None

    def allow_request(self, request, view):
        if request.auth is None:
            return True
        now = time.monotonic()
        window = int(now // self.period)
        seen_window, count = _windows.get(request.auth.pk, (window, 0))
        count = count + 1 if seen_window == window else 1
        _windows[request.auth.pk] = (window, count)
        if count <= self.limit:
            return True
        self.retry_after = self.period - now % self.period
        return False

    def wait(self):
        return self.retry_after


_windows = {}
register_cache("ledger.api.auth._windows", holds="each agent's request count in the current minute",
               stale_when="the minute ends (a new window starts at zero)", clear=_windows.clear)


class AgentTokenScheme(OpenApiAuthenticationExtension):
    """Tells drf-spectacular that the API takes a bearer token."""

    target_class = "ledger.api.auth.AgentTokenAuthentication"
    name = "agentToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "An agent's token (create_agent prints it once)."}
