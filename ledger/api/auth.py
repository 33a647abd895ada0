from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions
from rest_framework.throttling import SimpleRateThrottle

from ledger.models import Agent


class AgentTokenAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer <token>`; request.user is the agent's user, request.auth the agent."""

    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if not header:
            return None
        if header[0].decode("latin-1") != self.keyword or len(header) != 2:
            raise exceptions.AuthenticationFailed("Use 'Authorization: Bearer <token>'.")
        agent = Agent.objects.for_token(header[1].decode("latin-1"))
        if agent is None:
            raise exceptions.AuthenticationFailed("Unknown or revoked token.")
        return agent.user, agent

    def authenticate_header(self, request):
        return f'{self.keyword} realm="api"'


class AgentRateThrottle(SimpleRateThrottle):
    scope = "agent"

    def get_cache_key(self, request, view):
        if request.auth is None:
            return None
        return self.cache_format % {"scope": self.scope, "ident": request.auth.pk}


class AgentTokenScheme(OpenApiAuthenticationExtension):
    """Tells drf-spectacular that the API takes a bearer token."""

    target_class = "ledger.api.auth.AgentTokenAuthentication"
    name = "agentToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "An agent's token (create_agent prints it once)."}
